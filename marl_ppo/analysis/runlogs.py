"""Finished runs read back from disk: resolved config and TensorBoard return series, grouped by configuration.

A configuration is a run's resolved config without the keys that say how it was executed, not
what it trained (`EXECUTION_KEYS`), or what it should reach (`CHECK_KEYS`), and with the code that
trained it (the run's `code.json`: runs of another package version or commit are another
configuration, unless the caller merges them); its runs are the seeds. An experiment is the env id
the configurations were trained on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from marl_ppo.faults import UserError

EXECUTION_KEYS = ("seed", "log", "host", "rollout.num_workers", "rollout.vector", "ray")
"""Config keys and sections that do not define a configuration (seeds are its runs; the rest is how it ran)."""

CHECK_KEYS = ("expected",)
"""Top-level config keys that say what a run should reach (the band `reproduce` checks), not what it
trained: runs that differ only there are one configuration, and `sweep` reuses them."""

RETURN_TAGS = ("rollout/team_return", "eval/team_return", "rollout/episodes")
"""The tags a run is read for; `rollout/episodes` is the count behind each update's mean under
`log.episodes: update`."""


class ReportError(UserError, ValueError):
    """A user-facing report problem; its message is one line naming the value and the fix."""


@dataclass(frozen=True)
class RunLog:
    """One run: its directory, resolved config and `(steps, values)` of each return tag it logged."""

    run_dir: Path
    config: dict[str, Any]
    series: dict[str, tuple[np.ndarray, np.ndarray]]
    code: str = "unknown"
    """The code that trained it (`marl_ppo.run.code_record.code_label`)."""
    summary: dict[str, Any] | None = None
    """Its `summary.json` (`marl_ppo.run.rundir.read_summary`); None while it runs or after it was killed."""

    @property
    def env_steps(self) -> int | None:
        """The env steps it trained, from its summary; None without one."""
        return None if self.summary is None else self.summary.get("env_steps")

    def has(self, tag: str) -> bool:
        """True when the run logged at least one point of `tag`."""
        return tag in self.series and len(self.series[tag][0]) > 0

    def episode_counts(self, tag: str) -> np.ndarray | None:
        """For a `rollout/` tag the run logged as each update's mean (`log.episodes: update`), the
        episodes behind each point; None when each point is one episode (or an evaluation's mean)."""
        if not tag.startswith("rollout/") or not self.has("rollout/episodes"):
            return None
        counts = self.series["rollout/episodes"][1]
        if len(counts) != len(self.series[tag][1]):
            raise ReportError(
                f"{self.run_dir}: {len(self.series[tag][1])} points of {tag} against {len(counts)} of "
                "rollout/episodes, so its update means cannot be weighted; report on runs that kept one "
                "log.episodes setting from start to end"
            )
        return counts

    def last_episodes_mean(self, tag: str, episodes: int) -> float:
        """The mean of `tag` over the run's last `episodes` training episodes: the last points, or
        under `log.episodes: update` the last updates' means weighted by their episodes (the oldest
        update counted for the episodes the window still needs)."""
        values = self.series[tag][1]
        counts = self.episode_counts(tag)
        if counts is None:
            return float(values[-episodes:].mean())
        newest_first = counts[::-1]
        later = np.cumsum(newest_first) - newest_first  # the episodes of the updates after each one
        taken = np.clip(episodes - later, 0, newest_first)
        return float((values[::-1] * taken).sum() / taken.sum())


@dataclass(frozen=True)
class Configuration:
    """The runs (seeds) of one configuration of one experiment."""

    experiment: str
    label: str
    """The config keys that set it apart from the experiment's other configurations (`key=value, ...`)."""
    runs: tuple[RunLog, ...]
    """One run per seed."""
    duplicates: tuple[RunLog, ...] = ()
    """Runs of the same configuration and seed as one of `runs` (a sweep repeated into another
    directory): not counted, so that each seed is counted once."""


def _is_run_dir(path: Path) -> bool:
    logged = (path / "tensorboard").is_dir() or (path / "csv" / "scalars.csv").is_file()
    return (path / "config.yaml").is_file() and logged


def scalar_series(run_dir: Path, tags: Iterable[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`(steps, values)` of each of `tags` the run logged, in the order written: from its TensorBoard
    event files, or from `csv/scalars.csv` when it logged no TensorBoard (`log.backends`)."""
    wanted = set(tags)
    points: dict[str, list[tuple[int, float]]] = {}
    if (run_dir / "tensorboard").is_dir():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})  # 0 keeps all
        events.Reload()
        for tag in wanted & set(events.Tags()["scalars"]):
            points[tag] = [(p.step, p.value) for p in events.Scalars(tag)]
    else:
        from marl_ppo.logs.backends import read_scalars_csv

        for step, tag, value in read_scalars_csv(run_dir / "csv" / "scalars.csv"):
            if tag in wanted:
                points.setdefault(tag, []).append((step, value))
    return {
        tag: (
            np.array([s for s, _ in pairs], dtype=np.int64),
            np.array([v for _, v in pairs], dtype=np.float64),
        )
        for tag, pairs in points.items()
    }


def find_run_dirs(paths: Iterable[Path | str]) -> list[Path]:
    """Run directories among `paths` and below them (a sweep directory holds many), in sorted order."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise ReportError(f"'{path}' does not exist; pass run directories or a directory that holds them")
        below = [path] if _is_run_dir(path) else sorted(p.parent for p in path.rglob("config.yaml"))
        runs = [p for p in below if _is_run_dir(p)]
        if not runs:
            raise ReportError(
                f"no run directory (config.yaml with tensorboard/ or csv/) in or under '{path}'"
            )
        found.extend(run for run in runs if run not in found)
    return found


def read_run(run_dir: Path) -> RunLog:
    """Read a run's config.yaml and every point of its return tags (TensorBoard or CSV)."""
    from marl_ppo.run.code_record import code_label
    from marl_ppo.run.rundir import read_summary

    config = with_defaults(yaml.safe_load((run_dir / "config.yaml").read_text()) or {})
    series = scalar_series(run_dir, RETURN_TAGS)
    return RunLog(run_dir, config, series, code_label(run_dir), read_summary(run_dir))


def last_values(run_dir: Path, tags: Iterable[str]) -> dict[str, float | None]:
    """The last logged value of each of `tags` (None where never logged); of equal steps, the latest written."""
    series = scalar_series(run_dir, tags)

    def last(steps: np.ndarray, values: np.ndarray) -> float:
        return float(values[max(range(len(steps)), key=lambda i: (steps[i], i))])

    return {tag: last(*series[tag]) if tag in series else None for tag in tags}


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """The config with its moved keys at their new place and today's defaults for keys an older
    marl_ppo did not write (only moved when invalid)."""
    from marl_ppo.config import ConfigError, build_config, config_to_dict, migrate_stored

    migrated = migrate_stored(config)
    try:
        return config_to_dict(build_config(migrated))
    except ConfigError:
        return migrated


def flatten_config(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted key -> the value as JSON (`{"ppo.pi_lr": "0.001", ...}`), for comparing configs key by key."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = json.dumps(value, sort_keys=True)
    return flat


def experiment_name(config: dict[str, Any]) -> str:
    """The env id a run trained on (different `env.kwargs` are different configurations of it)."""
    return str((config.get("env") or {}).get("id", "unknown env"))


def _trained(run: RunLog, by_code: bool) -> dict[str, Any]:
    """What defines the run's configuration: its config without the execution and check keys, and its code."""
    trained = without_keys(run.config, (*EXECUTION_KEYS, *CHECK_KEYS))
    return {**trained, "code": run.code} if by_code else trained


def without_keys(config: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """`config` without the dotted `keys` (a section's name drops the whole section)."""
    kept = {}
    for name, value in config.items():
        if name in keys:
            continue
        inner = [key.removeprefix(name + ".") for key in keys if key.startswith(name + ".")]
        kept[name] = without_keys(value, inner) if inner and isinstance(value, dict) else value
    return kept


def display_names(pairs: Sequence[str] | None) -> dict[str, str]:
    """`--name NAME=CONFIGURATION` options as {configuration label: name} (`MAPPO=ppo.critic=state`)."""
    names = {}
    for pair in pairs or ():
        name, equals, label = pair.partition("=")
        if not equals or not name.strip() or not label.strip():
            raise ReportError(
                f"--name '{pair}' must be NAME=CONFIGURATION, the configuration as its label reads, "
                "e.g. --name 'MAPPO=ppo.critic=state'"
            )
        names[label.strip()] = name.strip()
    return names


def renamed(label: str, names: dict[str, str], labels: Sequence[str]) -> str:
    """`label`'s display name from `names` (itself when not named); a name for no label is refused."""
    unknown = [known for known in names if known not in labels]
    if unknown:
        listed = "; ".join(f"'{known}'" for known in dict.fromkeys(labels))
        raise ReportError(
            f"--name {names[unknown[0]]}={unknown[0]}: no configuration reads '{unknown[0]}'; they read {listed}"
        )
    return names.get(label, label)


def group_configurations(runs: Sequence[RunLog], *, by_code: bool = True) -> list[Configuration]:
    """Runs grouped into configurations (same config but seed; same code unless `by_code=False`), per
    experiment, in first-seen order."""
    groups: dict[tuple[str, str], list[RunLog]] = {}
    for run in runs:
        key = json.dumps(_trained(run, by_code), sort_keys=True)
        groups.setdefault((experiment_name(run.config), key), []).append(run)
    configurations = []
    for experiment in dict.fromkeys(name for name, _ in groups):
        members = [group for (name, _), group in groups.items() if name == experiment]
        flats = [flatten_config(_trained(g[0], by_code)) for g in members]
        keys = sorted({key for flat in flats for key in flat})
        varying = [key for key in keys if len({flat.get(key) for flat in flats}) > 1]
        for group, flat in zip(members, flats, strict=True):
            label = ", ".join(f"{key}={_shown(flat.get(key))}" for key in varying)
            kept, duplicates = _one_run_per_seed(group)
            configurations.append(Configuration(experiment, label or _common_name(kept), kept, duplicates))
    return configurations


def _one_run_per_seed(runs: Sequence[RunLog]) -> tuple[tuple[RunLog, ...], tuple[RunLog, ...]]:
    """Per seed, the run that logged the most env steps (the first found among equals), and the others."""
    by_seed: dict[Any, list[RunLog]] = {}
    for run in runs:
        by_seed.setdefault(run.config.get("seed"), []).append(run)
    kept: list[RunLog] = []
    duplicates: list[RunLog] = []
    for same_seed in by_seed.values():
        best = max(same_seed, key=last_step)  # max keeps the first of equals
        kept.append(best)
        duplicates.extend(run for run in same_seed if run is not best)
    return tuple(kept), tuple(duplicates)


def last_step(run: RunLog) -> int:
    """The env steps the run trained: `summary.json`'s count once it finished, else the last env step at
    which it logged a return (episodes end before the last steps of a run, so the two can differ)."""
    if run.env_steps is not None:
        return run.env_steps
    return max((int(steps[-1]) for steps, _ in run.series.values() if len(steps)), default=0)


def _shown(value: str | None) -> str:
    if value is None:
        return "unset"
    loaded = json.loads(value)
    return loaded if isinstance(loaded, str) else value


def _common_name(runs: Sequence[RunLog]) -> str:
    parents = {run.run_dir.resolve().parent for run in runs}
    return parents.pop().name if len(parents) == 1 else runs[0].run_dir.name


def file_stem(text: str) -> str:
    """A file-name-safe version of an experiment name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")
