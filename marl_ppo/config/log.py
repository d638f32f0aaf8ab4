"""The `log` section: where scalars go (and the trackers' own settings), videos and checkpoints."""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic.dataclasses import dataclass

from marl_ppo.config.base import STRICT, PositiveFloat, PositiveInt

LOG_BACKENDS = ("tensorboard", "csv", "wandb", "mlflow")
"""Where a run's scalars go (`log.backends`); docs/tracking.md shows how to view each."""


@dataclass(frozen=True, config=STRICT)
class WandbConfig:
    """Weights & Biases (`log.backends: [..., wandb]`, needs `pip install 'marl-ppo[wandb]'`)."""

    project: str | None = None
    """W&B project; null: `WANDB_PROJECT`, else `marl-ppo`."""
    entity: str | None = None
    """W&B team or user; null: `WANDB_ENTITY`, else the account's default."""
    group: str | None = None
    """Group of runs (e.g. the seeds of one configuration); null: `WANDB_RUN_GROUP`, else none."""
    tags: tuple[str, ...] = ()
    """Tags of the run (added to those in `WANDB_TAGS`)."""
    mode: Literal["auto", "online", "offline"] = "auto"
    """`online` streams to the W&B server; `offline` writes the run under `<run_dir>/wandb` for a later
    `wandb sync`; `auto`: `WANDB_MODE` when set, else online when a W&B login exists (`wandb login` or
    `WANDB_API_KEY`), else offline."""
    init_timeout_s: PositiveFloat = 60.0
    """Seconds `wandb.init` may take to reach the server; past that the run goes on without W&B."""


@dataclass(frozen=True, config=STRICT)
class MlflowConfig:
    """MLflow (`log.backends: [..., mlflow]`, needs `pip install 'marl-ppo[mlflow]'`)."""

    tracking_uri: str | None = None
    """MLflow tracking URI (`http://host:5000`, `sqlite:///path.db`, ...); null: `MLFLOW_TRACKING_URI`,
    else a sqlite store in the run directory, `sqlite:///<run_dir>/mlflow.db`."""
    experiment: str | None = None
    """MLflow experiment name; null: `MLFLOW_EXPERIMENT_NAME`, else `marl-ppo`."""


@dataclass(frozen=True, config=STRICT)
class LogConfig:
    backends: tuple[Literal["tensorboard", "csv", "wandb", "mlflow"], ...] = ("tensorboard",)
    """Where scalars, the resolved config and the final summary go, any combination of
    `tensorboard` (`<run_dir>/tensorboard`), `csv` (`<run_dir>/csv`), `wandb` and `mlflow`: each gets
    the same scalars under the same names. A tracker that fails (no network, a server down) costs a
    one-line warning and the run goes on with the others. `report` and `compare` read TensorBoard or CSV."""
    video: Literal["gif", "mp4"] | None = None
    """At the end of the run, record one deterministic episode of the best evaluated policy (the final
    one without eval.every) as `<run_dir>/videos/episode_<step>.<gif|mp4>` and show it in the backends
    that show videos: TensorBoard's Images tab (GIF), W&B, MLflow (an artifact). An env that cannot
    render costs a one-line warning. null: no video."""
    wandb: WandbConfig = dataclasses.field(default_factory=WandbConfig)
    """Weights & Biases settings (used when `backends` names wandb)."""
    mlflow: MlflowConfig = dataclasses.field(default_factory=MlflowConfig)
    """MLflow settings (used when `backends` names mlflow)."""
    checkpoint_every: PositiveInt = 50
    """Write a checkpoint (`checkpoints/update_<N>.pt` and `latest.pt`) every this many updates, at the end,
    and when stopped by Ctrl-C or SIGTERM."""
    keep_last: PositiveInt | None = 3
    """Periodic checkpoints `update_<N>.pt` to keep (older ones are deleted); null keeps all.
    `latest.pt` and `final.pt` are always kept."""
    progress: bool = True
    """Show progress on stderr: a redrawn bar on a terminal; in a log file or a pipe, a plain line each 5%
    of total_steps (steps, steps/s, recent team return)."""
    per_agent: bool = True
    """Also log per-agent returns under `agents/<agent_id>/`."""
    return_window: PositiveInt = 100
    """Episodes averaged for `team_return_mean` in the progress bar and summary.json."""
    episodes: Literal["each", "update"] = "each"
    """How finished episodes reach the backends (`rollout/`, `groups/`, `agents/`): `each` logs every
    episode at the env step it ended; `update` logs once per update, at its env step, each tag's
    mean over the episodes that ended in it, and their count as `rollout/episodes` (which `report`
    weights by). For games of a few moves over millions of steps (Kuhn poker: about 1.7M episodes in
    4M steps), `update` keeps the event files small; training is the same either way."""

    def __post_init__(self) -> None:
        if len(set(self.backends)) != len(self.backends):
            raise ValueError(f"log.backends names a backend twice: {list(self.backends)}; name each once")
