"""Rollout workers: env copies *and* a copy of the policy in each worker process.

`rollout.vector: workers` moves acting out of the learner's process. Each worker owns a contiguous slice of
the E env copies, a CPU copy of the team's networks and its own sampling RNG (a `RolloutSlice` of
`marl_ppo.rollout.slice`, as the Ray workers' actors do); per rollout it reads the learner's weights
from shared memory, collects its slice with the ordinary `Collector` (same auto-reset, truncation
bootstrap and episode accounting as in one process) and writes the slice into a shared rollout
buffer. Per rollout the pipes carry one command and one small reply per
worker (finished episodes and timings); no array data is pickled. The processes are started,
commanded and stopped by `marl_ppo.envs.vector.pool`, as `SubprocessVectorEnv`'s are.

With a league (`uniform` or `pfsp` opponents) each worker also plays its copies' seats; the pool's
snapshots reach it as their files in the run directory, which the workers share with the learner.

`rollout.policy_lag = 1` overlaps collection with learning: as soon as rollout k is copied out, the workers
start rollout k + 1 with the weights the learner had *before* update k. PPO then uses that behaviour
policy's log-probabilities as `logp_old`, so the ratio and its clip are taken against the policy that
acted. With `rollout.policy_lag = 0` the workers wait for the update: exactly on-policy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.vector.pool import WorkerPool, context, split_envs
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.slice import RolloutSlice, SlicedSource
from marl_ppo.rollout.source import RolloutResult


class RolloutWorkers(SlicedSource):
    """E env copies in `rollout.num_workers` processes that act with a copy of the policy; a Collector's interface."""

    def __init__(
        self,
        make_adapter: Callable[[], ParallelEnvAdapter],
        make_model: Callable[[], TeamModel],
        model: TeamModel,
        *,
        spec: TeamSpec,
        num_envs: int,
        steps: int,
        num_workers: int,
        policy_lag: int,
        start_method: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if not 1 <= num_workers <= num_envs:
            raise ValueError(f"num_workers ({num_workers}) must be between 1 and num_envs ({num_envs})")
        if policy_lag not in (0, 1):
            raise ValueError(f"policy_lag must be 0 or 1, got {policy_lag}")
        self.spec = spec
        self.num_envs = num_envs
        self.model = model
        self.policy_lag = policy_lag
        self.timeout_s = timeout_s
        """Seconds a worker may take to answer a command ('collect': per env step); None waits forever."""
        self.env_steps = 0
        self._weights = {k: v.detach().cpu().clone().share_memory_() for k, v in model.state_dict().items()}
        self._shared = RolloutBuffer(spec, steps, num_envs, memory=model.memory_layout())
        for tensor in self._shared.tensors():
            tensor.share_memory_()
        self._last_values = {g.name: torch.zeros(num_envs, g.num_agents).share_memory_() for g in spec.groups}
        self._last_alive = {
            g.name: torch.ones(num_envs, g.num_agents, dtype=torch.bool).share_memory_() for g in spec.groups
        }
        self._in_flight = False
        self._pending = None
        self._slices = split_envs(num_envs, num_workers)
        args = [
            (
                make_adapter,
                make_model,
                envs,
                k,
                self._weights,
                self._shared,
                self._last_values,
                self._last_alive,
            )
            for k, envs in enumerate(self._slices)
        ]
        self._pool = WorkerPool(
            "RolloutWorkers",
            context(start_method),
            RolloutSlice,
            args,
            "marl_ppo-rollout-worker",
            timeout_s,
            timeout_name="rollout.worker_timeout_s per env step",
        )
        self._processes = self._pool.processes  # in worker order (tests watch and kill them)

    def start(self, seed: int) -> None:
        """Reset every env copy (env i gets `seed + i`); worker k samples with `worker_seed(seed, k)`."""
        self._command("reset", seed)
        self._pending = None

    def collect(self, buffer: RolloutBuffer, *, ahead: bool = True) -> RolloutResult:
        """Fill `buffer` with the next rollout of every env copy (launched now, or earlier with policy lag).

        With policy lag and `ahead` the next rollout is launched before returning; the run passes
        `ahead=False` for its last one, so the workers do not step a rollout that nobody will learn from.
        """
        pending = self._pending
        if pending is None:
            if not self._in_flight:
                self._launch()
            pending = self._receive()
        replies = pending["replies"]
        for target, shared in zip(buffer.tensors(), pending["buffer"], strict=True):
            target.copy_(shared)
        buffer.pos = buffer.steps
        last_values, last_alive = (
            {name: v.to(buffer.device, copy=True) for name, v in pending[field].items()}
            for field in ("last_values", "last_alive")
        )
        self._pending = None
        if self.policy_lag and ahead:
            self._launch()  # the next rollout runs with these weights while the learner updates
        result = RolloutResult(
            last_values=last_values, last_alive=last_alive, env_steps=buffer.steps * self.num_envs
        )
        result.episodes = self._episodes(replies, self.num_envs)
        self._hand_over_games(replies)
        result.env_seconds = max(r["env_s"] for r in replies)
        result.act_seconds = max(r["total_s"] - r["env_s"] for r in replies)
        self.env_steps += result.env_steps
        return result

    def close(self) -> None:
        """Stop the workers and close their envs (also done on garbage collection and at exit)."""
        self._pool.close()

    def _receive(self) -> dict[str, Any]:
        """Wait for the rollout in flight, keep it for the next `collect` and return it.

        The pending rollout refers to the shared tensors without copying them: nothing writes them
        again before the next launch, and `collect` copies them out before it launches.
        """
        replies = self._pool.gather("collect", self._shared.steps)  # a rollout takes that many env steps
        self._in_flight = False
        self._pending = pending = {
            "replies": replies,
            "buffer": self._shared.tensors(),
            "last_values": self._last_values,
            "last_alive": self._last_alive,
        }
        return pending

    def _launch(self) -> None:
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                self._weights[name].copy_(tensor)
        opponents = self._opponents_rollout(lambda snapshot: str(self._snapshot_file(snapshot)))
        self._pool.send("collect", [opponents] * len(self._slices))
        self._in_flight = True

    def _snapshot_file(self, snapshot: int) -> Path:
        """A league snapshot's policy file: the workers run on this machine and read it there."""
        assert self.opponents is not None
        return self.opponents.snapshot_file(snapshot)

    def _command(self, command: str, argument: Any) -> list[Any]:
        """Send every worker the same command; their replies in worker order."""
        return self._ask(command, [argument] * len(self._slices))

    def _ask(self, command: str, arguments: list[Any]) -> list[Any]:
        """Send worker k `(command, arguments[k])`; their replies in worker order."""
        if self._in_flight:
            self._receive()  # a rollout started with policy lag stays pending, never lost
        return self._pool.ask(command, arguments)
