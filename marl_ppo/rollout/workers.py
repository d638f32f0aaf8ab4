"""Rollout workers: env copies *and* a copy of the policy in each worker process.

`vector: workers` moves acting out of the learner's process. Each worker owns a contiguous slice of
the E env copies, a CPU copy of the team's networks and its own sampling RNG; per rollout it reads
the learner's weights from shared memory, collects its slice with the ordinary `Collector` (same
auto-reset, truncation bootstrap and episode accounting as in one process) and writes the slice
into a shared rollout buffer. Per rollout the pipes carry one command and one small reply per
worker (finished episodes and timings); no array data is pickled. The processes are started,
commanded and stopped by `marl_ppo.envs.vector.pool`, as `SubprocessVectorEnv`'s are.

`policy_lag = 1` overlaps collection with learning: as soon as rollout k is copied out, the workers
start rollout k + 1 with the weights the learner had *before* update k. PPO then uses that behaviour
policy's log-probabilities as `logp_old`, so the ratio and its clip are taken against the policy that
acted. With `policy_lag = 0` the workers wait for the update: exactly on-policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.vector.pool import WorkerPool, context, split_envs
from marl_ppo.envs.vector.state import gathered_states, states_or_reason
from marl_ppo.envs.vector.sync import SyncVectorEnv
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.source import EpisodeRecord, RolloutResult


def worker_seed(seed: int, worker: int) -> int:
    """The torch seed of worker `worker`'s action sampling in a run with `seed`."""
    return seed * 1_000_003 + 7_919 * (worker + 1)


class _RolloutSlice:
    """A worker's env copies `envs`, its copy of the policy and its sampling RNG (built in the worker).

    'start' makes the envs, the model and a local rollout buffer; each 'collect' then writes one
    rollout of the slice into the shared buffer.
    """

    def __init__(
        self,
        make_adapter: Callable[[], ParallelEnvAdapter],
        make_model: Callable[[], TeamModel],
        envs: range,
        worker: int,
        shared_weights: dict[str, torch.Tensor],
        shared_buffer: RolloutBuffer,
        shared_last_values: dict[str, torch.Tensor],
        shared_last_alive: dict[str, torch.Tensor],
    ) -> None:
        torch.set_num_threads(1)
        self.make_adapter = make_adapter
        self.make_model = make_model
        self.envs = envs
        self.worker = worker
        self.shared_weights = shared_weights
        self.shared_buffer = shared_buffer
        self.shared_last_values = shared_last_values
        self.shared_last_alive = shared_last_alive
        self.collector: Collector | None = None

    def __call__(self, command: str, argument: Any) -> Any:
        """Run `command`; the reply payload is what it reports ('collect': episodes and timings), or None."""
        envs, collector = self.envs, self.collector
        if command == "start":
            self.model = self.make_model()
            venv = SyncVectorEnv(self.make_adapter, len(envs))
            for i, adapter in zip(envs, venv.adapters, strict=True):
                adapter.copy_index = i  # the run's copy index, named in contract errors
            cpu = torch.device("cpu")
            layout = self.model.memory_layout()  # the stored states travel in the shared buffer
            self.buffer = RolloutBuffer(venv.spec, self.shared_buffer.steps, len(envs), memory=layout)
            self.collector = Collector(venv, self.model, cpu)
            self.targets = [t[:, envs.start : envs.stop] for t in self.shared_buffer.tensors()]
        elif command == "reset":
            collector.start(argument + envs.start)
            torch.manual_seed(worker_seed(argument, self.worker))
        elif command == "collect":
            return self._collect()
        elif command == "get_state":
            return {"collector": collector.state_dict(), "torch_rng": torch.get_rng_state()}
        elif command == "set_state":
            collector.load_state_dict(argument["collector"])
            torch.set_rng_state(argument["torch_rng"])
        elif command == "env_states":
            return states_or_reason(collector.env_states)
        elif command == "load_env_states":
            collector.load_env_states(argument)
        elif command == "close":
            if collector is not None:
                collector.close()
        else:
            raise ValueError(f"unknown command {command!r}")
        return None

    def _collect(self) -> dict[str, Any]:
        """One rollout of this worker's slice with the shared weights; returns episodes and timings."""
        started = time.perf_counter()
        collector, envs = self.collector, self.envs
        self.model.load_state_dict(self.shared_weights)
        steps_before = collector.env_steps
        self.buffer.reset()
        result = collector.collect(self.buffer)
        for target, local in zip(self.targets, self.buffer.tensors(), strict=True):
            target.copy_(local)
        for name, target in self.shared_last_values.items():
            target[envs.start : envs.stop] = result.last_values[name]
        for name, target in self.shared_last_alive.items():
            target[envs.start : envs.stop] = result.last_alive[name]
        # rollout step (0-based) at which each episode ended, for the learner's global step count
        episodes = [((e.end_step - steps_before) // len(envs) - 1, e) for e in result.episodes]
        return {"episodes": episodes, "env_s": result.env_seconds, "total_s": time.perf_counter() - started}


def _pending_state(pending: dict[str, Any]) -> dict[str, Any]:
    """A rollout received ahead of its update (policy lag), as a checkpoint holds it."""
    return {
        "buffer": pending["buffer"],
        "last_values": pending["last_values"],
        "last_alive": pending["last_alive"],
        "episodes": [[_episode_state(t, e) for t, e in r["episodes"]] for r in pending["replies"]],
    }


def _pending_from_state(saved: dict[str, Any] | None) -> dict[str, Any] | None:
    """`_pending_state` read back from a checkpoint."""
    if saved is None:
        return None
    replies = [  # its timings were the stopped process's wall clock: not carried over
        {"episodes": [_episode_from_state(e) for e in episodes], "env_s": 0.0, "total_s": 0.0}
        for episodes in saved["episodes"]
    ]
    return {
        "buffer": saved["buffer"],
        "last_values": saved["last_values"],
        "last_alive": saved["last_alive"],
        "replies": replies,
    }


def _episode_state(step: int, episode: EpisodeRecord) -> dict[str, Any]:
    """An episode record as primitives and a tensor (checkpoints load with weights_only)."""
    return {
        "step": step,
        "team_return": episode.team_return,
        "agent_returns": torch.from_numpy(episode.agent_returns),
        "length": episode.length,
        "end_step": episode.end_step,
    }


def _episode_from_state(state: dict[str, Any]) -> tuple[int, EpisodeRecord]:
    record = EpisodeRecord(
        state["team_return"], state["agent_returns"].numpy(), state["length"], state["end_step"]
    )
    return state["step"], record


class RolloutWorkers:
    """E env copies in `num_workers` processes that act with a copy of the policy; a Collector's interface."""

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
        """Env steps of the rollouts handed to the learner so far (one per copy per step)."""
        self._weights = {k: v.detach().cpu().clone().share_memory_() for k, v in model.state_dict().items()}
        self._shared = RolloutBuffer(spec, steps, num_envs, memory=model.memory_layout())
        for tensor in self._shared.tensors():
            tensor.share_memory_()
        self._last_values = {g.name: torch.zeros(num_envs, g.num_agents).share_memory_() for g in spec.groups}
        self._last_alive = {
            g.name: torch.ones(num_envs, g.num_agents, dtype=torch.bool).share_memory_() for g in spec.groups
        }
        self._in_flight = False
        self._pending: dict[str, Any] | None = None
        """A received rollout not yet handed to the learner (buffer tensors, last values and alive flags,
        replies)."""
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
            _RolloutSlice,
            args,
            "marl_ppo-rollout-worker",
            timeout_s,
            timeout_name="worker_timeout_s per env step",
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
        if self._pending is None:
            if not self._in_flight:
                self._launch()
            self._receive()
        replies = self._pending["replies"]
        for target, shared in zip(buffer.tensors(), self._pending["buffer"], strict=True):
            target.copy_(shared)
        buffer.pos = buffer.steps
        last_values, last_alive = (
            {name: v.to(buffer.device, copy=True) for name, v in self._pending[field].items()}
            for field in ("last_values", "last_alive")
        )
        self._pending = None
        if self.policy_lag and ahead:
            self._launch()  # the next rollout runs with these weights while the learner updates
        result = RolloutResult(
            last_values=last_values, last_alive=last_alive, env_steps=buffer.steps * self.num_envs
        )
        result.episodes = self._episodes(replies)
        result.env_seconds = max(r["env_s"] for r in replies)
        result.act_seconds = max(r["total_s"] - r["env_s"] for r in replies)
        self.env_steps += result.env_steps
        return result

    def close(self) -> None:
        """Stop the workers and close their envs (also done on garbage collection and at exit)."""
        self._pool.close()

    def state_dict(self) -> dict[str, Any]:
        """Step counter, each worker's collector state and sampling RNG, and a rollout already collected.

        With policy lag a rollout is in flight between updates; it is received here (as the next
        `collect` would) and saved, so a resumed run hands the learner the same data.
        """
        workers = self._command("get_state", None)  # receives a rollout in flight first
        pending = None
        if self._pending is not None:
            pending = _pending_state(self._pending)
        return {"env_steps": self.env_steps, "workers": workers, "pending": pending}

    def load_state_dict(self, state: dict[str, Any], *, episodes: bool = True) -> None:
        """Restore `state_dict()`; `episodes=False` keeps only the step counter (the envs are reset instead)."""
        self.env_steps = int(state["env_steps"])
        if not episodes:
            return
        self._ask("set_state", state["workers"])
        self._pending = _pending_from_state(state["pending"])

    def env_states(self) -> list[bytes]:
        """Every env copy's pickled state, in env order (see `marl_ppo.envs.vector.state`); raises
        EnvStateError when an env cannot be pickled."""
        return gathered_states(self._command("env_states", None))

    def load_env_states(self, states: list[bytes]) -> None:
        """Replace the env copies by saved ones (trusted bytes only: unpickling runs code)."""
        if len(states) != self.num_envs:
            raise ValueError(f"got {len(states)} env states for {self.num_envs} env copies")
        self._ask("load_env_states", [list(states[envs.start : envs.stop]) for envs in self._slices])

    def _receive(self) -> None:
        """Wait for the rollout in flight and keep it for the next `collect`.

        The pending rollout refers to the shared tensors without copying them: nothing writes them
        again before the next launch, and `collect` copies them out before it launches.
        """
        replies = self._pool.gather("collect", self._shared.steps)  # a rollout takes that many env steps
        self._in_flight = False
        self._pending = {
            "replies": replies,
            "buffer": self._shared.tensors(),
            "last_values": self._last_values,
            "last_alive": self._last_alive,
        }

    def _episodes(self, replies: list[dict[str, Any]]) -> list[EpisodeRecord]:
        """Finished episodes in the order one process would report them, with the run's step counts."""
        tagged = [
            (t, k, n, episode)
            for k, reply in enumerate(replies)
            for n, (t, episode) in enumerate(reply["episodes"])
        ]
        episodes = []
        for t, _, _, episode in sorted(tagged, key=lambda item: item[:3]):
            episode.end_step = self.env_steps + (t + 1) * self.num_envs
            episodes.append(episode)
        return episodes

    def _launch(self) -> None:
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                self._weights[name].copy_(tensor)
        self._pool.send("collect", [None] * len(self._slices))
        self._in_flight = True

    def _command(self, command: str, argument: Any) -> list[Any]:
        """Send every worker the same command; their replies in worker order."""
        return self._ask(command, [argument] * len(self._slices))

    def _ask(self, command: str, arguments: list[Any]) -> list[Any]:
        """Send worker k `(command, arguments[k])`; their replies in worker order."""
        if self._in_flight:
            self._receive()  # a rollout started with policy lag stays pending, never lost
        return self._pool.ask(command, arguments)
