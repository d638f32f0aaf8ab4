"""train(): the orchestrator. Builds env, model and trainer, then loops collect -> GAE -> update -> log."""

from __future__ import annotations

import functools
import json
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
import yaml

from marl_ppo.batch import rollout_batches
from marl_ppo.checkpoint import FORMAT, save_checkpoint
from marl_ppo.config import ExperimentConfig, config_to_dict
from marl_ppo.envs.aec import TurnBasedAdapter, is_aec
from marl_ppo.envs.gymnasium import GymnasiumTeamEnv
from marl_ppo.envs.pettingzoo import ParallelEnvAdapter, build_team_spec
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.subprocess import SubprocessVectorEnv
from marl_ppo.envs.vector import SyncVectorEnv
from marl_ppo.envs.vmas import VmasVectorEnv
from marl_ppo.logging import RunLogger
from marl_ppo.models.team import TeamModel
from marl_ppo.registry import EnvError, env_spec, make_env
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.seeding import seed_everything
from marl_ppo.trainer import Trainer


@dataclass(frozen=True)
class TrainResult:
    """What a finished run reports (also written to `summary.json`)."""

    run_dir: Path
    env_steps: int
    updates: int
    episodes: int
    team_return_mean: float
    agent_return_mean: float
    sps: float
    wall_s: float
    timing: dict[str, float]
    """Seconds spent over the run stepping envs (`env_s`), acting (`act_s`) and learning (`learn_s`)."""


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when available; `cuda` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise EnvError("device=cuda but no CUDA device is available; use device=cpu or device=auto")
    return torch.device(name)


def make_team_env(config: ExperimentConfig) -> Any:
    """Build one env copy and check it is a PettingZoo env (parallel or AEC)."""
    env = make_env(config.env.id, **config.env.kwargs)
    if isinstance(env, gym.Env):  # a Gymnasium env: single-agent, or a team with Tuple spaces
        env = GymnasiumTeamEnv(env)
    if not hasattr(env, "possible_agents"):
        raise EnvError(
            f"env '{config.env.id}' returned {type(env).__name__}, not a PettingZoo env; return a ParallelEnv "
            "or AEC env (wrap a Gymnasium env in marl_ppo.envs.gymnasium.GymnasiumTeamEnv)"
        )
    return env


def _make_adapter(config: ExperimentConfig, spec: TeamSpec) -> ParallelEnvAdapter:
    env = make_team_env(config)
    return TurnBasedAdapter(env, spec) if is_aec(env) else ParallelEnvAdapter(env, spec)


def build_vector_env(
    config: ExperimentConfig, device: torch.device | None = None
) -> SyncVectorEnv | SubprocessVectorEnv | VmasVectorEnv:
    """E copies of the configured env: one batched simulator, or copies in this process or in workers."""
    if ":" not in config.env.id and env_spec(config.env.id).batched:
        device = device or torch.device("cpu")
        env = make_env(
            config.env.id, num_envs=config.num_envs, device=str(device), seed=config.seed, **config.env.kwargs
        )
        return VmasVectorEnv(env, config.env.id)
    probe = make_team_env(config)
    spec = build_team_spec(
        probe, config.env.id, config.env.groups, image_pool=config.env.image_pool, state=config.env.state
    )
    probe.close()
    make_adapter = functools.partial(_make_adapter, config, spec)
    if config.vector == "subprocess":
        return SubprocessVectorEnv(
            make_adapter, config.num_envs, config.num_workers, timeout_s=config.worker_timeout_s
        )
    return SyncVectorEnv(make_adapter, config.num_envs)


def train(
    config: ExperimentConfig, run_dir: Path | str, *, on_update: Callable[[int], None] | None = None
) -> TrainResult:
    """Train MAPPO/IPPO as configured, writing logs, checkpoints and summary.json into `run_dir`.

    `on_update(updates)` is called after each update (the memory benchmark samples RSS there).
    """
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    generator = seed_everything(config.seed)
    device = resolve_device(config.device)
    venv = build_vector_env(config, device)  # before touching run_dir: a bad env leaves nothing behind
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    model = TeamModel(venv.spec, config).to(device)
    trainer = Trainer(model, config.ppo, generator=generator)
    buffer = RolloutBuffer(venv.spec, config.rollout_steps, config.num_envs, device)
    collector = Collector(venv, model, device)
    collector.start(config.seed)
    logger = RunLogger(
        run_dir,
        agents=venv.spec.agents,
        groups={g.name: g.agents for g in venv.spec.groups},
        total_steps=config.total_steps,
        return_window=config.log.return_window,
        per_agent=config.log.per_agent,
        progress=config.log.progress,
    )
    start = time.perf_counter()
    updates = 0
    timing = {"env_s": 0.0, "act_s": 0.0, "learn_s": 0.0}

    def save(name: str) -> None:
        _save(run_dir / "checkpoints" / name, config, venv.spec, model, trainer, updates, collector)

    try:
        while collector.env_steps < config.total_steps:
            for name, seconds in _one_update(config, collector, buffer, trainer, logger, start).items():
                timing[name] += seconds
            updates += 1
            if updates % config.log.checkpoint_every == 0:
                save("latest.pt")
            if on_update is not None:
                on_update(updates)
    finally:
        logger.close()
        venv.close()
    wall = time.perf_counter() - start
    save("latest.pt")
    save("final.pt")
    result = TrainResult(
        run_dir,
        collector.env_steps,
        updates,
        logger.episodes,
        logger.team_return_mean,
        logger.agent_return_mean,
        collector.env_steps / wall if wall > 0 else 0.0,
        wall,
        timing,
    )
    _write_summary(result)
    return result


def _one_update(
    config: ExperimentConfig,
    collector: Collector,
    buffer: RolloutBuffer,
    trainer: Trainer,
    logger: RunLogger,
    start: float,
) -> dict[str, float]:
    t0 = time.perf_counter()
    buffer.reset()
    rollout = collector.collect(buffer)
    t1 = time.perf_counter()
    batches = rollout_batches(buffer, rollout.last_values, gamma=config.gamma, lam=config.gae_lambda)
    trainer.set_progress((collector.env_steps - rollout.env_steps) / config.total_steps)
    stats = trainer.update(batches)
    t2 = time.perf_counter()
    logger.episodes_done(rollout.episodes)
    extra = {
        "perf/sps": collector.env_steps / (t2 - start),
        "perf/env_s": rollout.env_seconds,
        "perf/act_s": (t1 - t0) - rollout.env_seconds,
        "perf/learn_s": t2 - t1,
        "perf/peak_rss_mb": peak_rss_mb(),
        "perf/rss_mb": rss_mb(),
        "train/pi_lr": trainer.actor_optimizer.param_groups[0]["lr"],
    }
    logger.update_done(collector.env_steps, stats, extra)
    return {"env_s": extra["perf/env_s"], "act_s": extra["perf/act_s"], "learn_s": extra["perf/learn_s"]}


def rss_mb(pid: int | str = "self") -> float:
    """Current resident memory of a process (this one by default), in MiB; nan where /proc is missing."""
    try:
        with open(f"/proc/{pid}/statm") as handle:
            resident_pages = int(handle.read().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB (Linux reports ru_maxrss in KiB)."""
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return self_kib / 1024


def _save(
    path: Path,
    config: ExperimentConfig,
    spec: TeamSpec,
    model: TeamModel,
    trainer: Trainer,
    updates: int,
    collector: Collector,
) -> None:
    save_checkpoint(
        path,
        {
            "format": FORMAT,
            "config": config_to_dict(config),
            "agents": list(spec.agents),
            "groups": {g.name: list(g.agents) for g in spec.groups},
            "model": model.state_dict(),
            "actor_optimizer": trainer.actor_optimizer.state_dict(),
            "critic_optimizer": trainer.critic_optimizer.state_dict(),
            "updates": updates,
            "env_steps": collector.env_steps,
        },
    )


def _write_summary(result: TrainResult) -> None:
    summary = {
        "env_steps": result.env_steps,
        "updates": result.updates,
        "episodes": result.episodes,
        "team_return_mean": result.team_return_mean,
        "agent_return_mean": result.agent_return_mean,
        "sps": result.sps,
        "wall_s": result.wall_s,
        "peak_rss_mb": peak_rss_mb(),
        **result.timing,
    }
    (result.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
