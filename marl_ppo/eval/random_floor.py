"""`marl-ppo eval --random`: the uniform random policy on an experiment's (or a run's) env, the floor a
result is read against; for a game (`eval.vs_random`), random against random: the win, draw and loss
rates a first policy has to beat; for a game OpenSpiel solves (`eval.nash_conv`), its NashConv."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from marl_ppo.config import ConfigError, ExperimentConfig, load_config, load_stored_config
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.evaluate import EvalError, EvalResult, eval_config, eval_seed, make_out_dir, run_episodes
from marl_ppo.eval.exploitability import solvable, uniform_nash_conv
from marl_ppo.eval.random_policy import RandomActing
from marl_ppo.eval.versus import VersusResult, play_vs_random
from marl_ppo.plan.settle import plan_eval


@dataclass(frozen=True)
class RandomFloor:
    """What `evaluate_random` computed and where it wrote it."""

    result: EvalResult
    versus: VersusResult | None
    """Random against random by side, where the config's `eval.vs_random` scores sides (a game)."""
    eval_json: Path | None
    nash_conv: float | None = None
    """The uniform random policy's NashConv, on a game OpenSpiel solves unless `eval.nash_conv` is false."""


def experiment_of(target: Path | str | None) -> Path | None:
    """The config file that `eval --random TARGET` reads: an experiment file, or a run directory's config.yaml."""
    if target is None:
        return None
    target = Path(target)
    if target.is_dir():
        if not (target / "config.yaml").is_file():
            raise EvalError(
                f"--random: directory '{target}' has no config.yaml; pass a run directory or an experiment file"
            )
        return target / "config.yaml"
    if target.suffix not in (".yaml", ".yml") or not target.is_file():
        raise EvalError(
            f"--random needs an experiment file or a run directory, not '{target}'; "
            "e.g. experiments/mpe/simple_spread.yaml, or key=value overrides alone (env.id=...)"
        )
    return target


def evaluate_random(
    target: Path | str | None,
    *,
    episodes: int = 100,
    overrides: Sequence[str] = (),
    out: Path | str | None = None,
    seed: int | None = None,
) -> RandomFloor:
    """The uniform random policy's returns on the env of `target` (an experiment file or a run directory;
    None: the defaults with `overrides`), and for a game the random-vs-random rates; writes eval.json
    into `out` when given."""
    if episodes < 1:
        raise EvalError(f"--episodes {episodes} must be at least 1")
    experiment = experiment_of(target)
    try:
        if experiment is not None and Path(str(target)).is_dir():
            config = load_stored_config(experiment, overrides)  # a run's config.yaml, maybe an older one's
        else:
            config = load_config(experiment, overrides)
        plan = plan_eval(config)
    except ConfigError as err:
        raise EvalError(str(err)) from None
    config, device = plan.config, plan.device
    seed = eval_seed(config) if seed is None else seed
    venv = build_vector_env(eval_config(config, episodes), plan.layout, device)
    try:
        result = run_episodes(venv, None, device, episodes=episodes, seed=seed, deterministic=False)
        versus = _random_versus_random(config, venv, device, episodes, seed)
    finally:
        venv.close()
    nash_conv = None
    if config.eval.nash_conv is not False and solvable(config.env.id):
        nash_conv = uniform_nash_conv(config.env.id, config.env.kwargs)
    eval_json = None
    if out is not None:
        eval_json = _write(Path(out), config, experiment, overrides, result, versus, nash_conv)
    return RandomFloor(result, versus, eval_json, nash_conv)


def _random_versus_random(
    config: ExperimentConfig, venv: VectorEnv, device: torch.device, episodes: int, seed: int
) -> VersusResult | None:
    """Random against random on every side (`eval.vs_random`): the rates a trained side is read against."""
    if config.eval.vs_random is None:
        return None
    return play_vs_random(
        venv,
        RandomActing(venv.spec, device),
        device,
        mode=config.eval.vs_random,
        episodes_per_side=episodes,
        seed=seed,
        teams=config.eval.teams,
    )


def _write(
    out_dir: Path,
    config: ExperimentConfig,
    experiment: Path | None,
    overrides: Sequence[str],
    result: EvalResult,
    versus: VersusResult | None,
    nash_conv: float | None,
) -> Path:
    make_out_dir(out_dir)
    summary = {
        "policy": "uniform random",
        "experiment": None if experiment is None else str(experiment),
        "env": {"id": config.env.id, "kwargs": config.env.kwargs},
        "overrides": list(overrides),
        **result.to_dict(),
        "vs_random": versus.to_dict() if versus is not None else None,
        "nash_conv": nash_conv,
    }
    eval_json = out_dir / "eval.json"
    eval_json.write_text(json.dumps(summary, indent=2) + "\n")
    return eval_json
