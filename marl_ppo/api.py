"""The Python API's two verbs, `train` and `evaluate`: what `marl-ppo train` and `marl-ppo eval` do, from
a script or a notebook. Reached as `marl_ppo.train` and `marl_ppo.evaluate`.

    import marl_ppo

    config = marl_ppo.load_config("experiments/mpe/simple_spread.yaml", ["total_steps=200_000"])
    result = marl_ppo.train(config, "runs/spread")
    print(result.team_return_mean, result.sps)
    scores = marl_ppo.evaluate(result.run_dir, episodes=20, deterministic=True)
    print(scores.result.to_dict()["team_return"])   # mean, std, ci95; also written to eval.json

torch and the envs are imported when a function is first called, not when this module is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from marl_ppo.config import ConfigError, ExperimentConfig, load_config
from marl_ppo.run.rundir import check_new_run_dir, default_run_dir

if TYPE_CHECKING:
    from marl_ppo.eval.from_checkpoint import EvalOutput
    from marl_ppo.run.loop import TrainResult


def train(
    config: ExperimentConfig | str | Path | None,
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
) -> TrainResult:
    """Train one run as `marl-ppo train` does and return its TrainResult (also written to summary.json).

    `config` is an ExperimentConfig (`load_config`) or the path of an experiment YAML file.
    `run_dir` must be new or empty; by default it is `runs/<experiment file's name>-<time>` under
    the current directory (`runs/default-<time>` for an ExperimentConfig), as the CLI names it.

    `resume=True` continues the run in `run_dir` from its latest checkpoint. `config=None` takes
    the run's own config; otherwise `config` may differ from it only in the keys that `--resume`
    may change, e.g. `load_stored_config(run_dir / "config.yaml", ["total_steps=2_000_000"])`
    (`marl_ppo.config`; it reads a config that an older marl_ppo stored, too).

    Ctrl-C or SIGTERM finishes the current update, writes a checkpoint and raises
    `marl_ppo.run.signals.Interrupted`; bad input raises a one-line error (ConfigError, EnvError,
    CheckpointError).
    """
    experiment = None
    if isinstance(config, str | Path):
        experiment, config = config, load_config(config)
    if resume:
        if run_dir is None:
            raise ConfigError("train(..., resume=True) continues the run in run_dir; pass its run_dir")
        run_dir = Path(run_dir)
        if config is None:
            from marl_ppo.run.resume import resume_config  # imports torch

            config = resume_config(run_dir)
    else:
        if config is None:
            raise ConfigError("train(None) needs resume=True; pass an ExperimentConfig or an experiment file")
        run_dir = Path(run_dir) if run_dir is not None else default_run_dir(experiment)
        check_new_run_dir(run_dir)
    from marl_ppo.run.loop import train as train_run  # torch, the envs, tensorboard

    return train_run(config, run_dir, resume=resume)


def evaluate(
    target: str | Path,
    *,
    episodes: int = 10,
    deterministic: bool = False,
    overrides: Sequence[str] = (),
    render: str | None = None,
    out: str | Path | None = None,
    seed: int | None = None,
) -> EvalOutput:
    """Evaluate a run's checkpoint as `marl-ppo eval` does and write eval.json (and a video).

    `target` is a run directory (its final.pt, else latest.pt) or a checkpoint file. `overrides`
    are key=value strings such as `env.kwargs.max_cycles=50`; `render` is "gif" or "mp4"; `out`
    defaults to the run directory; `seed` to the run's seed + 1,000,000. Returns an EvalOutput:
    `.result` (team, agent and per-episode returns; `.to_dict()` adds 95% CIs), `.eval_json`, `.video`.
    """
    from marl_ppo.eval.from_checkpoint import evaluate_checkpoint  # torch and the envs
    from marl_ppo.league.average import pool_average

    return evaluate_checkpoint(
        target,
        episodes=episodes,
        deterministic=deterministic,
        overrides=overrides,
        render=render,
        out=out,
        seed=seed,
        pool_score=pool_average,
    )
