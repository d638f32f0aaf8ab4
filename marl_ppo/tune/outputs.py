"""What a finished study leaves in its tuning directory.

- `best.yaml`: the experiment file with the best trial's values (and the study's fixed overrides)
  written in, an experiment `marl-ppo train` accepts as it is;
- `trials.csv`: one row per trial: state, score with its 95% interval, evaluations reported, why it
  failed, values;
- `importances.json`: Optuna's importance of each tuned key (PED-ANOVA, which needs no extra library);
- `tune.md`: the above as a summary to read;
- with fresh seeds, `fresh/start` and `fresh/trial<number>`: the starting file and the best trial
  trained on seeds the search never saw, and `compare/`: `marl-ppo compare` of the two (IQM,
  probability of improvement).
"""

from __future__ import annotations

import csv
import json
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from marl_ppo.analysis.sweep import SweepRun, run_sweep, summary_line
from marl_ppo.config import ConfigError, load_config
from marl_ppo.config.loading import load_yaml, merge, parse_overrides
from marl_ppo.tune.space import TuneError
from marl_ppo.tune.study import TuneSetup, import_optuna

FRESH_SEED_BASE = 10_000
"""The first seed of the fresh runs; a search's trials train seeds 0..K-1."""
BEST_FILE = "best.yaml"


def best_trial(study: Any) -> Any:
    """The complete trial with the highest score, or a TuneError when no trial completed."""
    states = import_optuna().trial.TrialState
    if not study.get_trials(deepcopy=False, states=(states.COMPLETE,)):
        raise TuneError("no trial of the study completed, so there is no best config; see trials.csv for why")
    return study.best_trial


def write_best(study: Any, setup: TuneSetup) -> Path:
    """best.yaml: the experiment with the best trial's values and the fixed overrides, checked to load."""
    best = best_trial(study)
    data = merge(load_yaml(setup.experiment), parse_overrides([*setup.fixed, *best.user_attrs["overrides"]]))
    data.pop("expected", None)  # the band of `reproduce` was measured on the untuned config
    low, high = best.user_attrs.get("ci95", [best.value, best.value])
    header = [
        f"# {setup.experiment.name} tuned by `marl-ppo tune`: trial {best.number} of {len(study.trials)},",
        f"# score {best.value:.4g} [{low:.4g}, {high:.4g}] (IQM over seeds 0-{setup.seeds - 1}, {setup.score} rule);",
        f"# tuned: {' '.join(best.user_attrs['overrides'])}",
    ]
    if setup.fixed:
        header.append(f"# fixed for the search: {' '.join(setup.fixed)}")
    path = setup.directory / BEST_FILE
    path.write_text("\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False))
    try:
        load_config(path)
    except ConfigError as err:  # the config's cross-key rules refuse this combination
        raise TuneError(f"the best trial's config does not load: {err}") from None
    return path


def importances(study: Any) -> dict[str, float]:
    """Each tuned key's importance to the score over the complete trials (empty with fewer than two)."""
    optuna = import_optuna()
    states = optuna.trial.TrialState
    complete = study.get_trials(deepcopy=False, states=(states.COMPLETE,))
    if len(complete) < 2 or not complete[0].params:
        return {}
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    with warnings.catch_warnings():  # PED-ANOVA warns when few trials make its top quantile
        warnings.simplefilter("ignore")
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    return {key: float(value) for key, value in found.items()}


def trial_rows(study: Any, keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per trial: number, state, score and interval, evaluations reported, seconds, why it
    failed (if it did), values."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        low, high = trial.user_attrs.get("ci95", [None, None])
        seconds = (
            (trial.datetime_complete - trial.datetime_start).total_seconds()
            if trial.datetime_complete and trial.datetime_start
            else None
        )
        row = {
            "number": trial.number,
            "state": trial.state.name.lower(),
            "score": trial.value,
            "ci95_low": low,
            "ci95_high": high,
            "evaluations": len(trial.intermediate_values),
            "seconds": seconds,
            "error": trial.user_attrs.get("error", ""),
        }
        row.update({key: trial.params.get(key) for key in keys})
        rows.append(row)
    return rows


def write_tables(study: Any, setup: TuneSetup) -> list[Path]:
    """trials.csv, importances.json and tune.md in the tuning directory."""
    keys = list(setup.space.dimensions)
    rows = trial_rows(study, keys)
    table = setup.directory / "trials.csv"
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["number"])
        writer.writeheader()
        writer.writerows(rows)
    found = importances(study)
    weights = setup.directory / "importances.json"
    weights.write_text(json.dumps(found, indent=1) + "\n")
    summary = setup.directory / "tune.md"
    summary.write_text(_markdown(study, setup, rows, found))
    return [table, weights, summary]


def _markdown(study: Any, setup: TuneSetup, rows: list[dict[str, Any]], found: dict[str, float]) -> str:
    counts = {
        state: sum(1 for row in rows if row["state"] == state) for state in ("complete", "pruned", "fail")
    }
    lines = [
        f"# Tuning {setup.experiment.name}",
        "",
        f"{len(rows)} trial(s): {counts['complete']} complete, {counts['pruned']} pruned "
        f"({setup.pruner} rule), {counts['fail']} failed. Each trial trained seeds 0-{setup.seeds - 1}; its "
        f"score is the IQM over seeds of each seed's {_rule_words(setup.score)}, with a 95% "
        "stratified-bootstrap interval over seeds.",
        "",
        "| trial | state | score | 95% CI | evaluations | " + " | ".join(setup.space.dimensions) + " |",
        "|---|---|---|---|---|" + "---|" * len(setup.space.dimensions),
    ]
    for row in sorted(rows, key=lambda r: -(r["score"] if r["score"] is not None else float("-inf"))):
        score = "" if row["score"] is None else f"{row['score']:.4g}"
        ci = "" if row["ci95_low"] is None else f"[{row['ci95_low']:.4g}, {row['ci95_high']:.4g}]"
        values = " | ".join(str(row[key]) for key in setup.space.dimensions)
        lines.append(
            f"| {row['number']} | {row['state']} | {score} | {ci} | {row['evaluations']} | {values} |"
        )
    if found:
        lines += ["", "Importance of each key (Optuna's PED-ANOVA over the complete trials):", ""]
        lines += [f"- {key}: {value:.3f}" for key, value in found.items()]
    return "\n".join(lines) + "\n"


def _rule_words(rule: str) -> str:
    return "mean of its periodic evaluations" if rule == "curve" else "last periodic evaluation"


def fresh_runs(study: Any, setup: TuneSetup, seeds: int) -> list[SweepRun]:
    """The starting config and the best trial's on `seeds` seeds from FRESH_SEED_BASE, under `fresh/start`
    and `fresh/trial<number>` (a study extended later may find another best)."""
    best = best_trial(study)
    fresh = setup.directory / "fresh"
    runs = []
    for name, overrides in (
        ("start", list(setup.fixed)),
        (f"trial{best.number:04d}", [*setup.fixed, *best.user_attrs["overrides"]]),
    ):
        for seed in range(FRESH_SEED_BASE, FRESH_SEED_BASE + seeds):
            run_dir = fresh / name / f"seed{seed}"
            runs.append(SweepRun(f"{name}/seed{seed}", (*overrides, f"seed={seed}"), run_dir))
    return runs


def compare_fresh(
    study: Any,
    setup: TuneSetup,
    seeds: int,
    *,
    ray_address: str | None = None,
    echo: Callable[[str], None] = print,
) -> Path:
    """Train the start and the best config on fresh seeds and write `marl-ppo compare` of the two."""
    from marl_ppo.analysis.compare import write_comparison

    runs = fresh_runs(study, setup, seeds)
    if ray_address is not None:
        from marl_ppo.analysis.ray_sweep import run_sweep_on_ray

        config = load_config(setup.experiment, setup.fixed)
        outcome = run_sweep_on_ray(setup.experiment, runs, config, ray_address, setup.jobs, echo)
    else:
        outcome = run_sweep(setup.experiment, runs, setup.jobs, echo)
    echo(summary_line("fresh seeds", outcome))
    if outcome.failed:
        raise TuneError(
            f"{len(outcome.failed)} fresh run(s) failed; see their logs under {setup.directory / 'fresh'}"
        )
    out = setup.directory / "compare"
    comparison = write_comparison(sorted({run.run_dir.parent for run in runs}), out)
    for (x, y), p in comparison.improvement.items():
        echo(f"P({x} > {y}) = {p}")
    return out
