"""Experiment trackers beside the run directory's files: Weights & Biases and MLflow.

Each keeps its run's id in `<run_dir>/trackers.json`, so `--resume` continues the same W&B run and
the same MLflow run. Points a stopped process logged after its checkpoint stay in them (TensorBoard's
reader and the CSV drop those); a resumed run logs those steps again.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse

from marl_ppo.config import ConfigError, ExperimentConfig, WandbConfig
from marl_ppo.logs.backends import (
    CsvBackend,
    Guarded,
    LogBackend,
    Pairs,
    TensorBoardBackend,
    flat_config,
    rows_of,
    warn_tracker,
)

TRACKERS_FILE = "trackers.json"
"""The trackers' run ids, in the run directory."""

STEP_KEY = "env_step"
"""The W&B metric every scalar is plotted against (W&B's own `_step` counts log calls)."""


def read_tracker_ids(run_dir: Path) -> dict[str, Any]:
    """`trackers.json` of a run (empty when it has none)."""
    path = run_dir / TRACKERS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _remember(run_dir: Path, name: str, record: dict[str, Any]) -> None:
    ids = {**read_tracker_ids(run_dir), name: record}
    temporary = run_dir / (TRACKERS_FILE + ".tmp")
    temporary.write_text(json.dumps(ids, indent=2) + "\n")
    temporary.replace(run_dir / TRACKERS_FILE)


def run_name(run_dir: Path) -> str:
    """The name a tracker shows for the run: its directory's name."""
    return run_dir.resolve().name


def wandb_logged_in(environ: Mapping[str, str] = os.environ) -> bool:
    """True when W&B can authenticate: `WANDB_API_KEY`, or a netrc entry (`wandb login`) for its host."""
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(settings: WandbConfig, environ: Mapping[str, str] = os.environ) -> str:
    """The W&B mode a run uses: `mode`, or for `auto` `WANDB_MODE`, else online with a login, else offline."""
    if settings.mode != "auto":
        return settings.mode
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if wandb_logged_in(environ) else "offline"


class WandbBackend:
    """A W&B run (files under `<run_dir>/wandb`); scalars against `env_step`, config, summary."""

    name = "wandb"

    def __init__(self, config: ExperimentConfig, run_dir: Path, *, resumed: bool) -> None:
        import wandb

        settings = config.log.wandb
        known = read_tracker_ids(run_dir).get("wandb", {})
        run_id = known.get("id") if resumed else None
        run_id = run_id or uuid.uuid4().hex[:8]
        tags = [t for t in os.environ.get("WANDB_TAGS", "").split(",") if t] + list(settings.tags)
        self.run = wandb.init(
            project=settings.project or os.environ.get("WANDB_PROJECT") or "marl-ppo",
            entity=settings.entity,
            group=settings.group,
            tags=tags or None,
            name=run_name(run_dir),
            mode=cast(Any, wandb_mode(settings)),  # WANDB_MODE may hold any mode W&B knows
            dir=str(run_dir),
            id=run_id,
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(init_timeout=settings.init_timeout_s, silent=True),
        )
        _remember(run_dir, "wandb", {"id": run_id, "project": self.run.project})
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)

    def scalars(self, step: int, pairs: Pairs) -> None:
        """One W&B row per value of a repeated tag, each with the env step."""
        for row in rows_of(pairs):
            self.run.log({**row, STEP_KEY: step})

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """W&B's Config panel (a resumed run's changed keys, e.g. total_steps, take the new value)."""
        self.run.config.update(dict(config), allow_val_change=True)

    def summary(self, values: Mapping[str, Any]) -> None:
        """W&B's run summary, under `summary/` (the run table's columns)."""
        self.run.summary.update({f"summary/{key}": value for key, value in values.items()})

    def video(self, step: int, path: Path) -> None:
        """The episode as a W&B video under `eval/video`."""
        import wandb

        self.run.log({"eval/video": wandb.Video(str(path)), STEP_KEY: step})

    def flush(self) -> None:
        """W&B writes in the background."""

    def close(self) -> None:
        """Finish the W&B run (an offline run is then ready for `wandb sync`)."""
        self.run.finish()


MLFLOW_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
"""Defaults for MLflow's HTTP retries (its own defaults retry a server that is down for minutes)."""


class MlflowBackend:
    """An MLflow run: scalars as metrics at their env step, the config as params, the summary as an artifact."""

    name = "mlflow"

    def __init__(self, config: ExperimentConfig, run_dir: Path, *, resumed: bool) -> None:
        from mlflow.tracking import MlflowClient

        for key, value in MLFLOW_RETRIES.items():
            os.environ.setdefault(key, value)
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no INFO lines about creating tables
        settings = config.log.mlflow
        uri = (
            settings.tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        )
        self.client = MlflowClient(tracking_uri=uri)
        known = read_tracker_ids(run_dir).get("mlflow", {})
        if resumed and known.get("run_id") and known.get("tracking_uri") == uri:
            self.run_id = known["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = self._experiment(
                settings.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "marl-ppo", run_dir
            )
            self.run_id = self.client.create_run(experiment, run_name=run_name(run_dir)).info.run_id
        _remember(run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": uri})

    def _experiment(self, name: str, run_dir: Path) -> str:
        """The experiment's id, created where missing (artifacts of a local store beside its database)."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        local = self.client.tracking_uri.startswith("sqlite:")
        location = (run_dir / "mlflow-artifacts").resolve().as_uri() if local else None
        return str(self.client.create_experiment(name, artifact_location=location))

    def scalars(self, step: int, pairs: Pairs) -> None:
        """One batch of metrics at `step`; a repeated tag's values get distinct timestamps, so each is kept."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(tag, value, now + k, step)
            for k, row in enumerate(rows_of(pairs))
            for tag, value in row.items()
        ]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """Dotted config keys as params; a resumed run adds only keys it has not logged (MLflow keeps
        a param's first value)."""
        from mlflow.entities import Param

        logged = self.client.get_run(self.run_id).data.params
        params = [
            Param(key, json.dumps(value)[:6000])
            for key, value in flat_config(config).items()
            if key not in logged
        ]
        for start in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def summary(self, values: Mapping[str, Any]) -> None:
        """`summary.json` as an artifact, and its numbers as `summary/<key>` metrics."""
        self.client.log_dict(self.run_id, dict(values), "summary.json")
        numbers = {
            k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(values.get("env_steps", 0))
        metrics = [Metric(f"summary/{key}", value, now, step) for key, value in numbers.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def video(self, step: int, path: Path) -> None:
        """The episode as an artifact under `videos/`."""
        self.client.log_artifact(self.run_id, str(path), "videos")

    def flush(self) -> None:
        """MLflow writes at each call."""

    def close(self) -> None:
        """Mark the MLflow run finished."""
        self.client.set_terminated(self.run_id, "FINISHED")


def open_wandb(config: ExperimentConfig, run_dir: Path, *, resumed: bool) -> WandbBackend:
    """The run's W&B backend (a resumed run continues its W&B run)."""
    return WandbBackend(config, run_dir, resumed=resumed)


def open_mlflow(config: ExperimentConfig, run_dir: Path, *, resumed: bool) -> MlflowBackend:
    """The run's MLflow backend (a resumed run continues its MLflow run)."""
    return MlflowBackend(config, run_dir, resumed=resumed)


TRACKER_PACKAGES = {"wandb": ("wandb",), "mlflow": ("mlflow", "sqlalchemy", "alembic")}
"""The packages each optional tracker imports, by backend name (its `pip install 'marl-ppo[NAME]'` extra)."""


def check_backends_installed(config: ExperimentConfig) -> None:
    """Refuse (ConfigError) a `log.backends` entry whose extra is not installed, before the run starts."""
    import importlib.util

    for name in config.log.backends:
        missing = [p for p in TRACKER_PACKAGES.get(name, ()) if importlib.util.find_spec(p) is None]
        if missing:
            raise ConfigError(
                f"log.backends names {name}, which needs {', '.join(missing)}; "
                f"install it with pip install 'marl-ppo[{name}]', or drop {name} from log.backends"
            )


def open_backends(config: ExperimentConfig, run_dir: Path, *, resume_step: int | None) -> list[LogBackend]:
    """The backends `log.backends` names, opened in the run directory; a tracker that cannot start is
    left out with a one-line warning."""
    openers: dict[str, Callable[[], LogBackend]] = {
        "tensorboard": lambda: TensorBoardBackend(run_dir, resume_step=resume_step),
        "csv": lambda: CsvBackend(run_dir, resume_step=resume_step),
        "wandb": lambda: open_wandb(config, run_dir, resumed=resume_step is not None),
        "mlflow": lambda: open_mlflow(config, run_dir, resumed=resume_step is not None),
    }
    backends: list[LogBackend] = []
    for name in config.log.backends:
        if name in ("tensorboard", "csv"):  # files in the run directory: their errors are the run's
            backends.append(openers[name]())
            continue
        try:
            backends.append(Guarded(openers[name]()))
        except Exception as err:  # an unreachable server or a bad login: the run goes on
            warn_tracker(name, err)
    return backends
