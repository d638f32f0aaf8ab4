"""What both kinds of rollout workers share: a worker's slice of the env copies, and the learner's side.

`rollout.vector: workers` (worker processes, `rollout.workers`) and `rollout.vector: ray` (Ray actors,
`rollout.ray_workers`) split the E env copies into contiguous slices, one per worker. Every worker
runs a `RolloutSlice`: its env copies, a CPU copy of the team's networks and its own sampling RNG,
answering the same commands ('start', 'reset', 'collect', 'get_state', 'set_state', 'env_states',
'load_env_states', 'opponents', 'close'). On the learner's side both sources are a `SlicedSource`,
which saves and restores them alike: the step counter, every worker's collector state and sampling
RNG, a rollout received ahead of its update (policy lag) and the env copies' states.

With a league's opponents (`SlicedSource.attach_opponents`) each worker also plays its copies' seats
(`rollout.opponents`): every rollout command carries the plan the copies draw by and where the pool's
snapshots are, and the reply the games the copies finished, which the learner's win table takes when
the rollout is handed to the learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.vector.state import EnvStateError, gathered_states, states_or_reason
from marl_ppo.envs.vector.sync import SyncVectorEnv
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.opponents import (
    OpponentGame,
    OpponentsRollout,
    OpponentsSetup,
    SlicedOpponents,
    SnapshotModels,
    WorkerOpponents,
    merge_games,
    read_snapshot_file,
)
from marl_ppo.rollout.source import EpisodeRecord, RolloutResult


def worker_seed(seed: int, worker: int) -> int:
    """The torch seed of worker `worker`'s action sampling in a run with `seed`."""
    return seed * 1_000_003 + 7_919 * (worker + 1)


class RolloutSlice:
    """A worker's env copies `envs`, its copy of the policy and its sampling RNG (built in the worker).

    'start' makes the envs, the model and a local rollout buffer; each 'collect' then writes one
    rollout of the slice into the shared buffer, with the shared weights.
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
        """The slice's collector, from 'start' on."""
        self.opponents: WorkerOpponents | None = None
        """The league's seats of the slice's copies, from 'opponents' on."""
        self.snapshot_models = SnapshotModels(make_model, self.fetch_snapshot)
        """The pool's snapshots this worker has played."""

    def __call__(self, command: str, argument: Any) -> Any:
        """Run `command`; the reply payload is what it reports ('collect': episodes and timings), or None."""
        if command == "start":
            self._start()
        elif command == "close":
            if self.collector is not None:
                self.collector.close()
        elif command == "collect":
            return self._collect(argument)
        elif command == "opponents":
            self._set_opponents(argument)
        else:
            return self._ask_collector(command, argument)
        return None

    def _start(self) -> None:
        envs = self.envs
        self.model = self.make_model()
        venv = SyncVectorEnv(self.make_adapter, len(envs))
        for i, adapter in zip(envs, venv.adapters, strict=True):
            adapter.copy_index = i  # the run's copy index, named in contract errors
        cpu = torch.device("cpu")
        layout = self.model.memory_layout()  # the stored states travel in the shared buffer
        self.buffer = RolloutBuffer(venv.spec, self.shared_buffer.steps, len(envs), memory=layout)
        self.collector = Collector(venv, self.model, cpu)
        self.targets = [t[:, envs.start : envs.stop] for t in self.shared_buffer.tensors()]

    def fetch_snapshot(self, source: Any) -> Any:
        """A pool snapshot's weights from where the learner said they are (here: its file)."""
        return read_snapshot_file(source)

    def _set_opponents(self, setup: OpponentsSetup) -> None:
        """Play the league's seats of this slice's copies, built from the learner's `setup`."""
        collector = self._running()
        self.opponents = setup.build(
            collector.venv.spec, self.envs, self.snapshot_models.model, torch.device("cpu")
        )
        collector.opponents = self.opponents

    def _ask_collector(self, command: str, argument: Any) -> Any:
        """The commands that read or set the collector's state and the sampling RNG."""
        collector = self._running()
        if command == "reset":
            collector.start(argument + self.envs.start)
            torch.manual_seed(worker_seed(argument, self.worker))
        elif command == "get_state":
            state = {"collector": collector.state_dict(), "torch_rng": torch.get_rng_state()}
            if self.opponents is not None:
                state["opponents"] = self.opponents.state_dict()
            return state
        elif command == "set_state":
            collector.load_state_dict(argument["collector"])
            torch.set_rng_state(argument["torch_rng"])
            if self.opponents is not None:
                self.opponents.load_state_dict(argument["opponents"])
        elif command == "env_states":
            return states_or_reason(collector.env_states)
        elif command == "load_env_states":
            collector.load_env_states(argument)
        else:
            raise ValueError(f"unknown command {command!r}")
        return None

    def _running(self) -> Collector:
        if self.collector is None:
            raise RuntimeError("a rollout slice answers commands only after 'start'")
        return self.collector

    def _collect(self, opponents: OpponentsRollout | None) -> dict[str, Any]:
        """One rollout of this worker's slice with the shared weights (and `opponents`' plan); returns
        episodes, games against snapshots and timings."""
        started = time.perf_counter()
        envs = self.envs
        self.model.load_state_dict(self.shared_weights)
        result, episodes, games = self._rollout(opponents)
        for target, local in zip(self.targets, self.buffer.tensors(), strict=True):
            target.copy_(local)
        for name, target in self.shared_last_values.items():
            target[envs.start : envs.stop] = result.last_values[name]
        for name, target in self.shared_last_alive.items():
            target[envs.start : envs.stop] = result.last_alive[name]
        return {
            "episodes": episodes,
            "games": games,
            "env_s": result.env_seconds,
            "total_s": time.perf_counter() - started,
        }

    def _rollout(
        self, opponents: OpponentsRollout | None
    ) -> tuple[RolloutResult, list[tuple[int, EpisodeRecord]], list[OpponentGame]]:
        """One rollout of the slice into the local buffer with the model's weights: its result, each
        finished episode with the rollout step (0-based) it ended at, for the learner's global step count,
        and the games its copies finished against the league's snapshots."""
        collector = self._running()
        if (opponents is None) != (self.opponents is None):
            raise RuntimeError(
                "a rollout worker plays a league's seats exactly when its rollouts bring their plan: "
                "one came without the other"
            )
        if opponents is not None and self.opponents is not None:
            self.snapshot_models.offer(opponents.sources)
            self.opponents.use_plan(opponents.plan)
        steps_before = collector.env_steps
        self.buffer.reset()
        result = collector.collect(self.buffer)
        episodes = [((e.end_step - steps_before) // len(self.envs) - 1, e) for e in result.episodes]
        games = [] if self.opponents is None else list(self.opponents.games)
        return result, episodes, games


class SlicedSource:
    """The learner's side of rollout workers that each run a `RolloutSlice`: their checkpoint state and
    env states, kept alike for worker processes and Ray actors (so either kind resumes the other's runs).

    A subclass sets `num_envs`, `env_steps`, `_slices`, `_in_flight` and `_pending`, and provides
    `_receive` (wait for the rollout in flight, keep it in `_pending`) and `_ask` (one command per
    worker, the replies in worker order); `_lost_workers` names the workers whose state is gone.
    """

    num_envs: int
    env_steps: int
    """Env steps of the rollouts handed to the learner so far (one per copy per step)."""
    _slices: list[range]
    _in_flight: bool
    _pending: dict[str, Any] | None
    """A received rollout not yet handed to the learner (buffer tensors, last values and alive flags,
    replies)."""
    _worker_name = "rollout worker"
    """What messages call one worker."""
    opponents: SlicedOpponents | None = None
    """The learner's side of the opponents the workers play (a league), where attached."""

    def attach_opponents(self, opponents: SlicedOpponents) -> None:
        """Every worker plays its copies' seats of `opponents` from the next rollout on (before the
        run starts or resumes: a worker's saved state holds its seats)."""
        self.opponents = opponents
        self._ask("opponents", [opponents.setup()] * len(self._slices))

    def _opponents_rollout(self, sources: Callable[[int], Any]) -> OpponentsRollout | None:
        """What a rollout starting now carries for the opponents: the plan, and each snapshot's
        `sources(id)` (where a worker reads its weights)."""
        if self.opponents is None:
            return None
        return OpponentsRollout(
            self.opponents.plan(), {snapshot: sources(snapshot) for snapshot in self.opponents.snapshots()}
        )

    def _hand_over_games(self, replies: list[dict[str, Any] | None]) -> None:
        """The games of a rollout handed to the learner, into the opponents' win table."""
        if self.opponents is None:
            return
        games = [game for reply in replies if reply is not None for game in reply["games"]]
        self.opponents.record(merge_games(games))

    def state_dict(self) -> dict[str, Any]:
        """Step counter, each worker's collector state and sampling RNG, and a rollout already collected.

        With policy lag a rollout is in flight between updates; it is received here (as the next
        `collect` would) and saved, so a resumed run hands the learner the same data. With a worker
        lost, only the step counter: its episodes and RNG are gone.
        """
        workers = self._every_worker("get_state")
        pending = None
        if self._pending is not None and workers is not None:
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
        EnvStateError when an env cannot be pickled or a worker is lost (its env copies are gone)."""
        replies = self._every_worker("env_states")
        if replies is None:
            lost = ", ".join(str(k) for k in self._lost_workers())
            raise EnvStateError(f"{self._worker_name}(s) {lost} were lost, and their env copies with them")
        return gathered_states(replies)

    def load_env_states(self, states: list[bytes]) -> None:
        """Replace the env copies by saved ones (trusted bytes only: unpickling runs code)."""
        if len(states) != self.num_envs:
            raise ValueError(f"got {len(states)} env states for {self.num_envs} env copies")
        self._ask("load_env_states", [list(states[envs.start : envs.stop]) for envs in self._slices])

    def _every_worker(self, command: str) -> list[Any] | None:
        """Every worker's reply to `command`, after receiving a rollout in flight (it stays pending,
        never lost); None when a worker is lost, before or during the command."""
        if self._in_flight:
            self._receive()
        if self._lost_workers():
            return None
        replies = self._ask(command, [None] * len(self._slices))
        return None if self._lost_workers() else replies

    def _episodes(self, replies: list[dict[str, Any] | None], live_envs: int) -> list[EpisodeRecord]:
        """Finished episodes in the order one process over the live env copies would report them, with
        the run's step counts (a None reply: a lost worker)."""
        tagged = [
            (t, k, n, episode)
            for k, reply in enumerate(replies)
            if reply is not None
            for n, (t, episode) in enumerate(reply["episodes"])
        ]
        episodes = []
        for t, _, _, episode in sorted(tagged, key=lambda item: item[:3]):
            episode.end_step = self.env_steps + (t + 1) * live_envs
            episodes.append(episode)
        return episodes

    def _lost_workers(self) -> list[int]:
        """The workers whose env copies and episodes are gone; none unless a subclass loses workers."""
        return []

    def _receive(self) -> dict[str, Any]:
        """Wait for the rollout in flight; keep it in `_pending` for the next `collect`, and return it."""
        raise NotImplementedError

    def _ask(self, command: str, arguments: list[Any]) -> list[Any]:
        """Send worker k `(command, arguments[k])`; the replies in worker order."""
        raise NotImplementedError


def _pending_state(pending: dict[str, Any]) -> dict[str, Any]:
    """A rollout received ahead of its update (policy lag), as a checkpoint holds it."""
    return {
        "buffer": pending["buffer"],
        "last_values": pending["last_values"],
        "last_alive": pending["last_alive"],
        "episodes": [[_episode_state(t, e) for t, e in r["episodes"]] for r in pending["replies"]],
        "games": [[list(game) for game in r["games"]] for r in pending["replies"]],
    }


def _pending_from_state(saved: dict[str, Any] | None) -> dict[str, Any] | None:
    """`_pending_state` read back from a checkpoint."""
    if saved is None:
        return None
    games = saved.get("games", [[] for _ in saved["episodes"]])  # none before leagues ran in workers
    replies = [  # its timings were the stopped process's wall clock: not carried over
        {
            "episodes": [_episode_from_state(e) for e in episodes],
            "games": [OpponentGame(int(a), int(b), int(c), float(d)) for a, b, c, d in worker_games],
            "env_s": 0.0,
            "total_s": 0.0,
        }
        for episodes, worker_games in zip(saved["episodes"], games, strict=True)
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
