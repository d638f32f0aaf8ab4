"""The evaluation protocol's records in a run directory (Gorsane et al. 2022, as marl-eval reads it).

Every periodic evaluation (`eval.every`) appends its episodes' team returns to `evaluations.jsonl`;
the best evaluated policy so far is kept as `checkpoints/best.pt`; at the end of the run that
policy plays `eval.absolute` times `eval.episodes` fresh episodes: the absolute metric, written to
`absolute_metric.json`. `marl-ppo compare` reads both files. With `log.video`, the run ends with a
recorded episode of that policy (`record_video`).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.evaluate import EvalError, EvalResult, eval_seed, mean_ci95, run_episodes
from marl_ppo.models.team import TeamModel

EVALUATIONS = "evaluations.jsonl"
ABSOLUTE_METRIC = "absolute_metric.json"
BEST_CHECKPOINT = "best.pt"

ABSOLUTE_SEED_OFFSET = 1_000_000
"""The absolute metric's episodes start at the evaluation seed plus this: none of the episodes that
chose the best policy is played again."""


class EvaluationRecord:
    """The run's periodic evaluations, one JSON line each, and which of them scored best."""

    def __init__(self, run_dir: Path, *, resume_step: int | None) -> None:
        self.path = run_dir / EVALUATIONS
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        # a resumed run drops what the stopped process evaluated after its checkpoint
        kept = [line for line in lines if resume_step is not None and json.loads(line)["step"] <= resume_step]
        if len(kept) != len(lines):
            self.path.write_text("".join(line + "\n" for line in kept))
        self.best_step: int | None = None
        self.best_return = -math.inf
        for line in kept:
            entry = json.loads(line)
            self._offer(entry["step"], entry["team_return_mean"])

    def _offer(self, step: int, team_return: float) -> bool:
        if team_return > self.best_return:
            self.best_step, self.best_return = step, team_return
            return True
        return False

    def add(self, step: int, result: EvalResult) -> bool:
        """Append an evaluation's episodes; True when it is the best so far (ties keep the earlier)."""
        mean = float(result.team_returns.mean())
        entry = {
            "step": step,
            "team_return_mean": mean,
            "team_return": result.team_returns.tolist(),
            "episode_length": result.lengths.tolist(),
            "seed": result.seed,
        }
        with self.path.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")
        return self._offer(step, mean)


def read_evaluations(run_dir: Path) -> list[dict[str, Any]]:
    """The entries of a run's `evaluations.jsonl` (empty without one)."""
    path = run_dir / EVALUATIONS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def read_absolute_metric(run_dir: Path) -> dict[str, Any] | None:
    """A run's `absolute_metric.json`; None without one."""
    path = run_dir / ABSOLUTE_METRIC
    return json.loads(path.read_text()) if path.is_file() else None


def absolute_metric(
    config: ExperimentConfig,
    run_dir: Path,
    record: EvaluationRecord,
    model: TeamModel,
    venv: VectorEnv,
    device: torch.device,
) -> dict[str, Any] | None:
    """Play the best evaluated policy (`checkpoints/best.pt`) for `eval.absolute * eval.episodes`
    deterministic episodes, write `absolute_metric.json` and return it; None when the run has none.

    Loads the best weights into `model`: call it once training is over and saved."""
    if not config.eval.absolute or record.best_step is None:
        return None
    best = load_checkpoint(run_dir / "checkpoints" / BEST_CHECKPOINT)
    if best["env_steps"] != record.best_step:  # best.pt from a stopped process's discarded evaluations
        return None
    model.load_state_dict(best["model"])
    episodes = config.eval.absolute * config.eval.episodes
    seed = eval_seed(config) + ABSOLUTE_SEED_OFFSET
    result = run_episodes(venv, model, device, episodes=episodes, seed=seed, deterministic=True)
    metric = {
        "step": record.best_step,
        "best_eval_team_return": record.best_return,
        "checkpoint": f"checkpoints/{BEST_CHECKPOINT}",
        "episodes": episodes,
        "seed": seed,
        "team_return": mean_ci95(result.team_returns),
        "per_episode": {"team_return": result.team_returns.tolist(), "length": result.lengths.tolist()},
    }
    temporary = run_dir / (ABSOLUTE_METRIC + ".tmp")
    temporary.write_text(json.dumps(metric, indent=2) + "\n")
    temporary.replace(run_dir / ABSOLUTE_METRIC)
    return metric


class VideoWarning(UserWarning):
    """The run's video could not be recorded; the run is complete without it."""


def record_video(config: ExperimentConfig, run_dir: Path, model: TeamModel, step: int) -> Path | None:
    """One deterministic episode of `model` as `<run_dir>/videos/episode_<step>.<log.video>`; None, with a
    one-line warning, when the env cannot render."""
    from marl_ppo.eval.video import record_episode, render_env, write_video

    if config.log.video is None:
        return None
    path = run_dir / "videos" / f"episode_{step}.{config.log.video}"
    device = next(model.parameters()).device
    try:
        env = render_env(config)
        try:
            frames, fps = record_episode(
                env, model.spec, model, device, seed=eval_seed(config), deterministic=True
            )
        finally:
            env.close()
        path.parent.mkdir(exist_ok=True)
        write_video(frames, path, fps=fps)
    except EvalError as err:
        warnings.warn(f"log.video: {err}", VideoWarning, stacklevel=2)
        return None
    return path
