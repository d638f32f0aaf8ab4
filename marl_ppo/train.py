"""train(): the orchestrator. Builds env, model and trainer, then loops collect -> GAE -> update -> log."""

from __future__ import annotations

import ctypes
import dataclasses
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
import numpy as np
import torch
import yaml

from marl_ppo.batch import rollout_batches
from marl_ppo.checkpoint import FORMAT, periodic_path, prune_checkpoints, save_checkpoint
from marl_ppo.config import ExperimentConfig, config_to_dict
from marl_ppo.envs.aec import TurnBasedAdapter, is_aec
from marl_ppo.envs.gymnasium import GymnasiumTeamEnv
from marl_ppo.envs.pettingzoo import ParallelEnvAdapter, TeamArrays, build_team_spec, without_check_wrappers
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.envs.subprocess import SubprocessVectorEnv
from marl_ppo.envs.vector import SyncVectorEnv
from marl_ppo.envs.vmas import VmasVectorEnv
from marl_ppo.evaluate import PeriodicEvaluation, eval_config
from marl_ppo.logging import RunLogger
from marl_ppo.models.layers import resolve_precision
from marl_ppo.models.team import TeamModel
from marl_ppo.registry import EnvError, env_spec, make_env
from marl_ppo.resume import load_resumable, restore_run_state, run_state
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.workers import RolloutWorkers
from marl_ppo.seeding import seed_everything
from marl_ppo.signals import Interrupted, StopSignals
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
    if is_aec(env):
        return TurnBasedAdapter(env, spec)
    return ParallelEnvAdapter(without_check_wrappers(env) if config.env.skip_check_wrappers else env, spec)


def build_vector_env(
    config: ExperimentConfig, device: torch.device | None = None
) -> SyncVectorEnv | SubprocessVectorEnv | VmasVectorEnv:
    """E copies of the configured env: one batched simulator, or copies in this process or in workers."""
    if ":" not in config.env.id and env_spec(config.env.id).batched:
        device = device or torch.device("cpu")
        make = functools.partial(
            make_env, config.env.id, num_envs=config.num_envs, device=str(device), **config.env.kwargs
        )
        return VmasVectorEnv(make(seed=config.seed), config.env.id, make_spare=make)
    config = resolve_vector(config)
    spec = team_spec(config)
    make_adapter = functools.partial(_make_adapter, config, spec)
    if config.vector == "subprocess":
        return SubprocessVectorEnv(
            make_adapter, config.num_envs, config.num_workers, timeout_s=config.worker_timeout_s
        )
    return SyncVectorEnv(make_adapter, config.num_envs)


def team_spec(config: ExperimentConfig) -> TeamSpec:
    """The team layout (groups, spaces, state) of the configured env, from one probe copy."""
    probe = make_team_env(config)
    spec = build_team_spec(
        probe, config.env.id, config.env.groups, image_pool=config.env.image_pool, state=config.env.state
    )
    probe.close()
    return spec


AUTO_WORKERS_MIN_STEP_S = 50e-6
"""`vector: auto` runs env copies in rollout workers when one env step costs at least this long."""


def resolve_vector(config: ExperimentConfig) -> ExperimentConfig:
    """Replace `vector: auto` by `sync` or `workers`, from the cores available and the env's step cost
    (and set policy_lag to 0 unless the envs run in rollout workers).

    Workers pay for themselves when there are at least two cores, enough env copies to split
    (two per worker) and an env step that costs more than the per-step bookkeeping (50 us);
    toy envs and single-core machines run in this process. The choice is recorded in the run's
    config.yaml, so a rerun from that file takes the same path.
    """
    if config.vector != "auto":
        return config if config.vector == "workers" else dataclasses.replace(config, policy_lag=0)
    cores = usable_cores()
    batched = ":" not in config.env.id and env_spec(config.env.id).batched
    enough = cores >= 2 and config.num_envs >= 2 * min(config.num_workers, cores)
    if batched or not enough:
        return dataclasses.replace(config, vector="sync", policy_lag=0)
    seconds = probe_step_seconds(config)
    if seconds >= AUTO_WORKERS_MIN_STEP_S:
        return dataclasses.replace(config, vector="workers")
    return dataclasses.replace(config, vector="sync", policy_lag=0)


def usable_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


ALLOCATOR_KEEP_BYTES = (2 << 30) - 1
"""Freed heap memory glibc keeps for reuse rather than handing back to the kernel (the largest value
mallopt takes). A 1,024-copy VMAS minibatch step allocates about 400 MB of activations; with 256 MiB
kept, every update faulted in about 140,000 fresh pages."""


def keep_freed_memory() -> bool:
    """Make glibc reuse freed tensor memory instead of returning it to the kernel (Linux only).

    By default glibc maps large blocks fresh from the kernel and gives them back on free, so a
    rollout step's activations, allocated and freed every step, fault in every page again. Here
    every block comes from the heap (glibc maps no block on its own; it cannot raise the size
    above which it does past 32 MiB), and up to ALLOCATOR_KEEP_BYTES of freed heap stays mapped.
    A 8,192-copy VMAS update, whose 64-wide activations are 52 MB each, faulted in 3.3M pages
    (13 GB) per update when blocks over 32 MiB were still mapped on their own; it now runs 1.8x
    faster, for 22-37% more peak memory from a more fragmented heap. Forked workers inherit the
    setting. Returns False where it could not be applied.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, ALLOCATOR_KEEP_BYTES))


def learner_threads(config: ExperimentConfig) -> int:
    """Torch threads of the learner: `torch_threads`, or for `auto` every core with a batched simulator
    (large tensors, nothing else running) and 1 otherwise.

    The networks here are small: a second thread buys nothing on their matrices, and where env
    workers or other processes keep the cores busy, threads that wait for each other made a
    small run 7x slower in our measurements.
    """
    if config.torch_threads != "auto":
        return config.torch_threads
    batched = ":" not in config.env.id and env_spec(config.env.id).batched
    return usable_cores() if batched else 1


def probe_step_seconds(config: ExperimentConfig, budget_s: float = 0.25) -> float:
    """Typical seconds (25th percentile) of one adapter step of one env copy, with a fixed legal action."""
    spec = team_spec(config)
    adapter = _make_adapter(config, spec)
    arrays = TeamArrays.allocate(spec)
    adapter.reset(config.seed, arrays)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline and len(times) < 200:
        actions = [_first_allowed(g, m) for g, m in zip(spec.groups, arrays.action_mask, strict=True)]
        started = time.perf_counter()
        over = adapter.step(actions, arrays)
        times.append(time.perf_counter() - started)
        if over:
            adapter.reset(None, arrays)
    adapter.close()
    return float(np.percentile(times, 25))  # robust to a busy machine: preempted steps are outliers


def _first_allowed(group: GroupSpec, mask: np.ndarray) -> np.ndarray:
    """Per agent of the group, the first action its mask allows (the middle of a Box)."""
    space = group.action_space
    if isinstance(space, gym.spaces.Discrete):
        return mask.argmax(-1) if mask.shape[-1] else np.zeros(group.num_agents, dtype=np.int64)
    if isinstance(space, gym.spaces.MultiDiscrete):
        if not mask.shape[-1]:
            return np.zeros((group.num_agents, *group.action_shape), dtype=np.int64)
        bounds = np.cumsum([0, *space.nvec.reshape(-1)])
        return np.stack([mask[:, a:b].argmax(-1) for a, b in zip(bounds[:-1], bounds[1:], strict=True)], -1)
    middle = (np.clip(space.low, -1e6, 1e6) + np.clip(space.high, -1e6, 1e6)) / 2
    return np.broadcast_to(middle.reshape(-1), (group.num_agents, *group.action_shape)).astype(np.float32)


def build_collector(
    config: ExperimentConfig, device: torch.device
) -> tuple[Collector | RolloutWorkers, TeamModel]:
    """The rollout collector and the team's networks: acting here, or in rollout workers (`vector: workers`)."""
    config = resolve_vector(config)
    batched = ":" not in config.env.id and env_spec(config.env.id).batched
    if config.vector == "workers" and not batched:
        spec = team_spec(config)
        model = TeamModel(spec, config).to(device)
        workers = RolloutWorkers(
            functools.partial(_make_adapter, config, spec),
            functools.partial(TeamModel, spec, config),
            model,
            spec=spec,
            num_envs=config.num_envs,
            steps=config.rollout_steps,
            num_workers=min(config.num_workers, config.num_envs),
            policy_lag=config.policy_lag,
            timeout_s=config.worker_timeout_s,
        )
        return workers, model
    venv = build_vector_env(config, device)
    model = TeamModel(venv.spec, config).to(device)
    return Collector(venv, model, device), model


def train(
    config: ExperimentConfig,
    run_dir: Path | str,
    *,
    resume: bool = False,
    on_update: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train MAPPO/IPPO as configured, writing logs, checkpoints and summary.json into `run_dir`.

    `resume=True` continues the run checkpointed in `run_dir/checkpoints/latest.pt` where it stopped;
    `config` may differ from that run's only in `resume.RESUMABLE_KEYS`. Ctrl-C or SIGTERM lets the
    current update finish, writes a checkpoint and raises `Interrupted`. `on_update(updates)` is
    called after each update (the memory benchmark samples RSS there).
    """
    run_dir = Path(run_dir)
    config = resolve_vector(config)  # before seeding: the probe steps an env copy
    device = resolve_device(config.device)
    precision = resolve_precision(config.model.precision, device)  # recorded in config.yaml as chosen
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, precision=precision))
    saved = load_resumable(run_dir, config) if resume else None  # a bad checkpoint fails before any work
    torch.set_num_threads(learner_threads(config))
    keep_freed_memory()
    generator = seed_everything(config.seed)
    # before touching run_dir: a bad env leaves nothing behind
    collector, model = build_collector(config, device)
    spec = model.spec
    evaluation = None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
        trainer = Trainer(model, config.ppo, generator=generator)
        if config.eval_every:  # deterministic episodes on env copies of their own, logged under eval/
            eval_venv = build_vector_env(eval_config(config, config.eval_episodes), device)
            evaluation = PeriodicEvaluation(config, eval_venv, model, device)
        logger = _make_logger(config, run_dir, spec, None if saved is None else saved["env_steps"])
        try:
            run = _Run(config, run_dir, model, trainer, collector, logger, evaluation, on_update)
            run.begin(saved)
            buffer = RolloutBuffer(spec, config.rollout_steps, config.num_envs, device)
            with StopSignals() as stop:  # also covers the last save: a first signal cannot cut it short
                run.loop(buffer, stop)
                if stop.received is not None and collector.env_steps < config.total_steps:
                    checkpoint = run.save()
                    raise Interrupted(
                        stop.received, run_dir=run_dir, checkpoint=checkpoint, env_steps=collector.env_steps
                    )
                run.save(final=True)
        finally:
            logger.close()
    finally:
        collector.close()
        if evaluation is not None:
            evaluation.close()
    result = run.result()
    _write_summary(result)
    return result


def _make_logger(
    config: ExperimentConfig, run_dir: Path, spec: TeamSpec, resume_step: int | None
) -> RunLogger:
    return RunLogger(
        run_dir,
        agents=spec.agents,
        groups={g.name: g.agents for g in spec.groups},
        total_steps=config.total_steps,
        return_window=config.log.return_window,
        per_agent=config.log.per_agent,
        progress=config.log.progress,
        resume_step=resume_step,
    )


class _Run:
    """One run's components and counters: runs updates, writes and restores checkpoints."""

    def __init__(
        self,
        config: ExperimentConfig,
        run_dir: Path,
        model: TeamModel,
        trainer: Trainer,
        collector: Collector | RolloutWorkers,
        logger: RunLogger,
        evaluation: PeriodicEvaluation | None = None,
        on_update: Callable[[int], None] | None = None,
    ) -> None:
        self.config, self.run_dir = config, run_dir
        self.model, self.trainer, self.collector, self.logger = model, trainer, collector, logger
        self.evaluation, self.on_update = evaluation, on_update
        self.updates = 0
        self.timing = {"env_s": 0.0, "act_s": 0.0, "learn_s": 0.0}
        self.start = time.perf_counter()
        """perf_counter() at the run's start; a resumed run moves it back by the time already trained."""

    def begin(self, saved: dict[str, Any] | None) -> None:
        """Reset the envs for a new run, or restore everything a checkpoint saved."""
        if saved is None:
            self.collector.start(self.config.seed)
            return
        restore_run_state(
            saved,
            model=self.model,
            trainer=self.trainer,
            collector=self.collector,
            logger=self.logger,
            seed=self.config.seed,
        )
        self.updates = int(saved["updates"])
        self.timing = dict(saved["timing"])
        if self.evaluation is not None:  # the stopped run evaluated up to its checkpoint's step
            self.evaluation.next_step = (
                self.collector.env_steps // self.evaluation.every + 1
            ) * self.evaluation.every
        self.start = time.perf_counter() - saved["wall_s"]

    def loop(self, buffer: RolloutBuffer, stop: StopSignals) -> None:
        """Update until total_steps or a stop signal, checkpointing every `log.checkpoint_every` updates."""
        while self.collector.env_steps < self.config.total_steps and stop.received is None:
            seconds = _one_update(self.config, self.collector, buffer, self.trainer, self.logger, self.start)
            for name, value in seconds.items():
                self.timing[name] += value
            self.updates += 1
            if self.evaluation is not None:  # before the checkpoint, which then covers it
                steps = self.collector.env_steps
                final = steps >= self.config.total_steps
                self.logger.scalars(steps, self.evaluation.after_update(steps, final=final))
            if self.updates % self.config.log.checkpoint_every == 0:
                self.save()
            if self.on_update is not None:
                self.on_update(self.updates)

    def save(self, *, final: bool = False) -> Path:
        """Write `update_<N>.pt` and `latest.pt` (and `final.pt`), prune old ones; return the periodic file."""
        self.logger.flush()  # events up to this checkpoint survive a kill -9; later ones are purged on resume
        directory = self.run_dir / "checkpoints"
        path = periodic_path(directory, self.updates)
        copies = [directory / "latest.pt"] + ([directory / "final.pt"] if final else [])
        save_checkpoint(path, self._payload(), copies)
        prune_checkpoints(directory, self.config.log.keep_last)
        return path

    def _payload(self) -> dict[str, Any]:
        spec = self.model.spec
        return {
            "format": FORMAT,
            "config": config_to_dict(self.config),
            "agents": list(spec.agents),
            "groups": {g.name: list(g.agents) for g in spec.groups},
            "updates": self.updates,
            "env_steps": self.collector.env_steps,
            "wall_s": time.perf_counter() - self.start,
            "timing": dict(self.timing),
            **run_state(model=self.model, trainer=self.trainer, collector=self.collector, logger=self.logger),
        }

    def result(self) -> TrainResult:
        """The finished run's figures."""
        wall = time.perf_counter() - self.start
        steps = self.collector.env_steps
        return TrainResult(
            self.run_dir,
            steps,
            self.updates,
            self.logger.episodes,
            self.logger.team_return_mean,
            self.logger.agent_return_mean,
            steps / wall if wall > 0 else 0.0,
            wall,
            dict(self.timing),
        )


def _one_update(
    config: ExperimentConfig,
    collector: Collector | RolloutWorkers,
    buffer: RolloutBuffer,
    trainer: Trainer,
    logger: RunLogger,
    start: float,
) -> dict[str, float]:
    t0 = time.perf_counter()
    buffer.reset()
    # rollout workers with policy lag start the next rollout now, unless this is the run's last
    ahead = collector.env_steps + buffer.steps * buffer.num_envs < config.total_steps
    rollout = collector.collect(buffer, ahead=ahead)
    t1 = time.perf_counter()
    batches = rollout_batches(buffer, rollout.last_values, gamma=config.gamma, lam=config.gae_lambda)
    trainer.set_progress((collector.env_steps - rollout.env_steps) / config.total_steps)
    stats = trainer.update(batches)
    t2 = time.perf_counter()
    logger.episodes_done(rollout.episodes)
    act_s = rollout.act_seconds if rollout.act_seconds is not None else (t1 - t0) - rollout.env_seconds
    extra = {
        "perf/sps": collector.env_steps / (t2 - start),
        "perf/env_s": rollout.env_seconds,
        "perf/act_s": act_s,
        "perf/collect_wait_s": t1 - t0,
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
