"""The `rollout` and `ray` sections: the env copies, where they step, and the steps per update."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from marl_ppo.config.base import STRICT, PositiveFloat, PositiveInt


@dataclass(frozen=True, config=STRICT)
class RolloutConfig:
    """How experience is collected: the env copies, where they step, and the steps per update."""

    num_envs: PositiveInt | None = None
    """Environment copies stepped in parallel; null (the default): the number the env's registration
    asks for (a batched simulator: `vmas/*` 1,024, `jaxmarl/*` 64), else 16. A run's plan settles
    it, and its config.yaml records the number."""
    rollout_steps: PositiveInt = 100
    """Steps per env copy collected before each update (batch = rollout_steps * num_envs)."""
    vector: Literal["auto", "sync", "subprocess", "workers", "ray"] = "auto"
    """Where the env copies run: `sync` in this process; `subprocess` in `num_workers` processes that
    step them while this process acts; `workers` in `num_workers` processes that also act, each with a
    copy of the policy (no per-step round trips; see policy_lag); `ray` in `num_workers` such workers
    as Ray actors, on any node of a Ray cluster (see `ray.*`; needs `pip install 'marl-ppo[ray]'`); `auto` picks `workers` when there
    are 2+ cores, 2+ env copies per worker and an env step costs 50 us or more, or a worker per copy
    when a step costs 2 ms or more (pistonball), else `sync` (the choice is written to the run's
    config.yaml). Batched simulators (VMAS) ignore it."""
    num_workers: PositiveInt = 2
    """Worker processes for `vector: subprocess|workers|ray` (each owns a contiguous slice of the env copies)."""
    policy_lag: Literal[0, 1] = 0
    """With `vector: workers|ray`, 1 collects the next rollout with the pre-update policy while the learner
    updates (collection overlaps learning; `ppo.lagged_ratio` says how the update treats such a batch); 0 waits.
    Other vector modes (and `auto` when it picks `sync`) run with 0, and record 0 in config.yaml."""
    compiled: Literal["auto", True, False] = "auto"
    """Whether a JaxMARL env's rollouts run as one compiled program (a `lax.scan` over the rollout's
    steps: the env's step, the policy's forward in JAX and its sampling) instead of a Python loop that
    steps the env and the torch policy once per step. `auto`: compiled where the run allows it (a
    `jaxmarl/*` env; feed-forward or GRU networks over vector inputs with Discrete actions, in fp32; no league
    opponents but `latest`), else per step, with the reason in the run's start line; `false`: per
    step; `true`: compiled, or an error that says why it cannot be. The choice is written to the
    run's config.yaml. Compiled rollouts draw their actions with JAX's random numbers (from the seed
    and the update's number), so their runs differ from per-step ones in the actions drawn, not in
    what is learned from them. Other envs always step per step."""
    worker_timeout_s: PositiveFloat = 60.0
    """Seconds a worker process (`vector: subprocess|workers|ray`) may take to answer (build, reset or
    step its envs; rollout workers get this per step of a rollout) before it is reported as hung and
    every worker is stopped. A Ray worker's start (Ray starting its process on a node) gets at least
    300 s."""

    @property
    def copies(self) -> int:
        """`num_envs` as a run's plan settles it (`marl_ppo.plan.copies.settle_copies`); an error while
        it is still null, which only code that skipped the plan can meet."""
        if self.num_envs is None:
            raise ValueError(
                "rollout.num_envs is still null (the env's own number of copies); settle the config "
                "with marl_ppo.plan.copies.settle_copies, as a run's plan does, or set rollout.num_envs"
            )
        return self.num_envs


@dataclass(frozen=True, config=STRICT)
class RayConfig:
    """Rollout workers as Ray actors (`rollout.vector: ray`), on this machine or across a Ray cluster."""

    address: str | None = None
    """The Ray cluster to join: null starts a Ray instance on this machine for the run (and stops it
    after); `auto` joins the cluster started on this machine with `ray start`; `host:port` joins the
    head node there (its GCS port, 6379 unless `ray start --head --port` set another)."""
    num_cpus_per_worker: PositiveFloat = 1.0
    """CPUs Ray reserves for each rollout worker actor (the learner runs in this process, outside them)."""
    max_worker_restarts: Annotated[int, Field(ge=-1)] = 1000
    """Times Ray restarts a lost worker actor (its process or node died) before giving it up; -1: no limit.
    A restarted worker rejoins at the next update with the current weights and fresh episodes."""
    min_workers: PositiveInt = 1
    """Workers whose rollouts an update needs: while fewer are lost, updates go on with the rollouts of
    the others (a smaller batch); when fewer than this answer, the run writes a checkpoint and stops
    (exit status 1) to be resumed once the cluster is back."""
    placement: Literal["pack", "spread"] = "pack"
    """Where the workers go: `pack` fills as few nodes as possible (less traffic), `spread` puts them on
    as many nodes as possible (a lost node takes fewer workers with it)."""
