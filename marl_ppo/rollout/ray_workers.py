"""Rollout workers as Ray actors (`rollout.vector: ray`): the local rollout workers' slices, on any node of a cluster.

Each actor holds a `RolloutSlice` of `marl_ppo.rollout.slice` (its env copies, a CPU copy of the
networks, its sampling RNG; the same 'reset', state and env-state commands) built from small
constructor arguments: the config as a plain dict, its slice of the env copies and its worker index.
Per update the learner puts its weights into Ray's object store once, with a version number, and
asks every live actor for one rollout of its slice; a rollout comes back through the object store
as the slice's buffer tensors. With one worker and `rollout.policy_lag: 0` a run is step for step the run
of `rollout.vector: workers` with one worker. With a league (`uniform` or `pfsp` opponents) each
snapshot of the pool is put into the object store once, and every rollout command carries the
references with the draws' plan: no actor reads the run directory, which may be on another node.

A lost actor (its process or its node died, or it did not answer in time) is restarted by Ray where
resources allow (`ray.max_worker_restarts`). Meanwhile the updates use the rollouts of the workers
that answered, as long as at least `ray.min_workers` did: the lost slice's env copies count as no
agent acting (`alive` false), so they enter no loss and no statistics, and its env steps are not
counted. A probe notices when the actor is back; it rejoins at the next launch with fresh episodes
and the current weights. With fewer than `ray.min_workers` answering, `collect` raises `WorkersLost`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from marl_ppo.config import ConfigError, ExperimentConfig, build_config, config_to_dict
from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.envs.factory import make_adapter
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.vector.pool import split_envs
from marl_ppo.faults import WorkerError, WorkersLost, one_line
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.opponents import OpponentsRollout, read_snapshot_file
from marl_ppo.rollout.slice import RolloutSlice, SlicedSource
from marl_ppo.rollout.source import RolloutResult

RAY_INSTALL = "pip install 'marl-ppo[ray]'"

_PLACEMENT_STRATEGY = {"pack": "PACK", "spread": "SPREAD"}
_REJOIN_SEED_STRIDE = 1_000_003
"""A rejoining worker resets its envs with the run's seed plus this times its rejoin count: fresh episodes."""
START_TIMEOUT_S = 300.0
"""The least time a Ray worker has for its first answer: Ray starts its process (on any node), which
imports torch and builds its envs; on a busy machine that alone can pass a minute. Later answers get
`rollout.worker_timeout_s`."""


def import_ray() -> Any:
    """The `ray` module, or a one-line ConfigError naming the install that provides it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"vector: ray needs Ray, which is not installed; install it with {RAY_INSTALL}"
        ) from None
    return ray


def connect_ray(address: str | None) -> bool:
    """Join the Ray cluster at `address` (null: start one on this machine) unless this process is
    connected already; True when this call connected (and the caller disconnects at its end)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, logging_level="warning", include_dashboard=False)
    except getattr(ray.exceptions, "AuthenticationError", ()) as err:  # token clusters, Ray 2.5x on
        raise ConfigError(
            f"ray.address={address}: the Ray cluster refused this process ({one_line(err)}); give it the "
            "cluster's token (RAY_AUTH_TOKEN, or ~/.ray/auth_token) with RAY_AUTH_MODE=token"
        ) from None
    except ConnectionError as err:
        raise ConfigError(
            f"ray.address={address}: no Ray cluster answers there ({one_line(err)}); start one with "
            "`ray start --head` or set ray.address to its head node's host:port"
        ) from None
    return True


class _ActorSlice(RolloutSlice):
    """A worker's `RolloutSlice` that returns its rollout (into Ray's object store) instead of writing
    it into shared memory."""

    def __init__(self, config: dict[str, Any], envs: range, worker: int, spec: TeamSpec) -> None:
        settings = build_config(config)
        # the shared buffer only sizes the slice here: on the meta device it holds no memory
        sizes = RolloutBuffer(spec, settings.rollout.rollout_steps, envs.stop, device="meta")
        super().__init__(
            lambda: make_adapter(settings, spec),
            lambda: TeamModel(spec, settings),
            envs,
            worker,
            {},
            sizes,
            {},
            {},
        )
        self.version = -1
        """Version of the weights the model holds."""

    def fetch_snapshot(self, source: Any) -> Any:
        """A pool snapshot's weights from Ray's object store (`source`: its object reference)."""
        import ray

        return ray.get(source)

    def rollout(
        self, weights: dict[str, torch.Tensor], version: int, opponents: OpponentsRollout | None
    ) -> dict[str, Any]:
        """One rollout of the slice with `weights` (loaded when `version` is new) and `opponents`' plan:
        its tensors and report."""
        started = time.perf_counter()
        if version != self.version:
            self.model.load_state_dict(weights)
            self.version = version
        result, episodes, games = self._rollout(opponents)
        return {
            "buffer": self.buffer.tensors(),
            "last_values": result.last_values,
            "last_alive": result.last_alive,
            "episodes": episodes,
            "games": games,
            "env_s": result.env_seconds,
            "total_s": time.perf_counter() - started,
        }


class RolloutActor:
    """The Ray actor of one rollout worker (wrapped with `ray.remote` when a run starts)."""

    def __init__(self, config: dict[str, Any], envs: tuple[int, int], worker: int, spec: TeamSpec) -> None:
        """`spec`: the run's team layout (the learner's plan read it once; no actor builds a copy to)."""
        self.slice = _ActorSlice(config, range(*envs), worker, spec)
        self.slice("start", None)

    def call(self, command: str, argument: Any) -> Any:
        """One command of the local workers' protocol ('reset', 'get_state', 'env_states', ...)."""
        return self.slice(command, argument)

    def collect(
        self, weights: dict[str, torch.Tensor], version: int, opponents: OpponentsRollout | None = None
    ) -> dict[str, Any]:
        """One rollout with the weights of `version` (Ray resolves `weights` from the object store) and
        the league's plan and snapshot references, where the run has one."""
        return self.slice.rollout(weights, version, opponents)

    def ping(self) -> bool:
        """Answers once the actor is up (again)."""
        return True


class RayRolloutWorkers(SlicedSource):
    """E env copies in `rollout.num_workers` Ray actors that act with a copy of the policy; a RolloutSource."""

    _worker_name = "Ray rollout worker"

    def __init__(self, config: ExperimentConfig, model: TeamModel, spec: TeamSpec) -> None:
        if config.rollout.policy_lag not in (0, 1):
            raise ValueError(f"rollout.policy_lag must be 0 or 1, got {config.rollout.policy_lag}")
        self._ray = import_ray()
        self.spec = spec
        self.model = model
        self.num_envs = config.rollout.copies
        self.steps = config.rollout.rollout_steps
        self.policy_lag = config.rollout.policy_lag
        self.min_workers = config.ray.min_workers
        self.timeout_s = config.rollout.worker_timeout_s
        self.env_steps = 0
        self.rejoins = 0
        """Times a lost worker came back (Ray restarted its actor)."""
        self._slices = split_envs(
            config.rollout.copies, min(config.rollout.num_workers, config.rollout.copies)
        )
        self._version = 0
        self._seed = config.seed
        self._refs: dict[int, Any] = {}
        self._in_flight = False
        self._pending = None
        self._lost: dict[int, Any] = {}
        """Per lost worker, the probe that answers once Ray has restarted its actor."""
        self._closed = False
        self._snapshot_refs: dict[int, Any] = {}
        """Per league snapshot, its weights in the object store (put there once)."""
        self._disconnect = connect_ray(config.ray.address)
        try:
            self._start_actors(config)
        except BaseException:
            self.close()
            raise

    def _start_actors(self, config: ExperimentConfig) -> None:
        ray = self._ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cpus = config.ray.num_cpus_per_worker
        bundles = [{"CPU": cpus} for _ in self._slices]
        self._group = placement_group(bundles, strategy=_PLACEMENT_STRATEGY[config.ray.placement])
        try:
            ray.get(self._group.ready(), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            offered = ray.available_resources().get("CPU", 0.0)
            raise ConfigError(
                f"the Ray cluster offers {offered:g} free CPUs, fewer than rollout.num_workers={len(self._slices)} x "
                f"ray.num_cpus_per_worker={cpus:g}; lower them or add nodes to the cluster"
            ) from None
        actor = ray.remote(RolloutActor)
        plain = config_to_dict(config)
        self._actors = [
            actor.options(
                num_cpus=cpus,
                max_restarts=config.ray.max_worker_restarts,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=k
                ),
            ).remote(plain, (envs.start, envs.stop), k, self.spec)
            for k, envs in enumerate(self._slices)
        ]
        pings = {k: actor.ping.remote() for k, actor in enumerate(self._actors)}
        self._wait_all(pings, "start", timeout_s=max(self.timeout_s, START_TIMEOUT_S))

    @property
    def live_workers(self) -> int:
        """Workers that are not lost (their rollouts count)."""
        return len(self._slices) - len(self._lost)

    def start(self, seed: int) -> None:
        """Reset every env copy (env i gets `seed + i`); worker k samples with `worker_seed(seed, k)`."""
        self._seed = seed
        self._ask("reset", [seed] * len(self._slices))
        self._pending = None

    def collect(self, buffer: RolloutBuffer, *, ahead: bool = True) -> RolloutResult:
        """Fill `buffer` with the next rollout of every live worker's env copies (see the module docstring)."""
        pending = self._pending
        if pending is None:
            if not self._in_flight:
                self._launch()
            pending = self._receive()
        self._pending = None
        for target, source in zip(buffer.tensors(), pending["buffer"], strict=True):
            target.copy_(source)
        buffer.pos = buffer.steps
        last_values, last_alive = (
            {name: v.to(buffer.device, copy=True) for name, v in pending[key].items()}
            for key in ("last_values", "last_alive")
        )
        if self.policy_lag and ahead:
            self._launch()  # the next rollout runs with these weights while the learner updates
        replies = pending["replies"]
        answered = [k for k, reply in enumerate(replies) if reply is not None]
        live_envs = sum(len(self._slices[k]) for k in answered)
        result = RolloutResult(
            last_values=last_values, last_alive=last_alive, env_steps=buffer.steps * live_envs
        )
        result.episodes = self._episodes(replies, live_envs)
        self._hand_over_games(replies)
        result.env_seconds = max(replies[k]["env_s"] for k in answered)
        result.act_seconds = max(replies[k]["total_s"] - replies[k]["env_s"] for k in answered)
        result.perf = {
            "perf/ray_live_workers": float(len(answered)),
            "perf/ray_worker_rejoins": float(self.rejoins),
        }
        self.env_steps += result.env_steps
        return result

    def _lost_workers(self) -> list[int]:
        """The workers lost now, whose probes wait for Ray to restart them."""
        return sorted(self._lost)

    def close(self) -> None:
        """Stop the actors, free their placement group, and leave a Ray instance this run started."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        for actor in getattr(self, "_actors", []):
            ray.kill(actor, no_restart=True)
        if getattr(self, "_group", None) is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
        if self._disconnect:
            ray.shutdown()

    def _launch(self) -> None:
        """Publish the weights once (a new version) and start a rollout on every live worker."""
        self._rejoin()
        self._version += 1
        with torch.no_grad():
            weights = {name: tensor.detach().cpu() for name, tensor in self.model.state_dict().items()}
        reference = self._ray.put(weights)
        opponents = self._opponents_rollout(self._snapshot_ref)
        self._refs = {
            k: actor.collect.remote(reference, self._version, opponents)
            for k, actor in enumerate(self._actors)
            if k not in self._lost
        }
        self._in_flight = True

    def _snapshot_ref(self, snapshot: int) -> Any:
        """League snapshot `snapshot`'s weights in the object store, put there on first use."""
        if snapshot not in self._snapshot_refs:
            assert self.opponents is not None
            weights = read_snapshot_file(self.opponents.snapshot_file(snapshot))
            self._snapshot_refs[snapshot] = self._ray.put(dict(weights))
        return self._snapshot_refs[snapshot]

    def _rejoin(self) -> None:
        """Take back the lost workers whose actors Ray has restarted, with fresh episodes."""
        ray = self._ray
        for k, probe in list(self._lost.items()):
            ready, _ = ray.wait([probe], timeout=0)
            if not ready:
                continue
            try:
                ray.get(probe)
            except ray.exceptions.RayActorError:  # its restarts are used up: it stays lost
                continue
            del self._lost[k]
            self.rejoins += 1
            seed = self._seed + _REJOIN_SEED_STRIDE * self.rejoins
            self._actors[k].call.remote("reset", seed)  # runs before the next rollout (actor order)
            if (
                self.opponents is not None
            ):  # its restarted slice plays fresh seats from its copies' first draws
                self._actors[k].call.remote("opponents", self.opponents.setup())
            print(f"Ray rollout worker {k} is back and rejoins the run", file=sys.stderr, flush=True)

    def _receive(self) -> dict[str, Any]:
        """Wait for the rollouts in flight; keep them, assembled in env order, for the next `collect`,
        and return them."""
        ray, refs = self._ray, self._refs
        self._in_flight = False
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.timeout_s * self.steps)
        replies: list[dict[str, Any] | None] = [None] * len(self._slices)
        reasons = []
        for k, ref in refs.items():
            try:
                replies[k] = reply = ray.get(ref, timeout=0)
                for _, episode in reply["episodes"]:  # arrays from the object store are read-only
                    episode.agent_returns = episode.agent_returns.copy()
            except ray.exceptions.GetTimeoutError:
                ray.kill(self._actors[k], no_restart=False)  # hung: Ray restarts it
                reasons.append(
                    self._lose(
                        k, f"no rollout within rollout.worker_timeout_s per step ({self.timeout_s:g} s)"
                    )
                )
            except ray.exceptions.RayActorError as err:
                reasons.append(self._lose(k, type(err).__name__))
            except ray.exceptions.RayTaskError as err:
                raise self._task_error(k, err) from None
        answered = sum(reply is not None for reply in replies)
        if answered < self.min_workers:
            raise WorkersLost(
                f"only {answered} of {len(self._slices)} Ray rollout workers answered, fewer than "
                f"ray.min_workers={self.min_workers} ({'; '.join(reasons) or 'lost before this rollout'})"
            )
        self._pending = pending = {"replies": replies, **self._assemble(replies)}
        return pending

    def _lose(self, k: int, why: str) -> str:
        """Mark worker k lost (a probe waits for Ray to restart it); the reason, for messages."""
        self._lost[k] = self._actors[k].ping.options(max_task_retries=-1).remote()
        reason = f"worker {k}: {why}"
        print(
            f"Ray rollout worker {k} lost ({why}); updates go on with {self.live_workers} of "
            f"{len(self._slices)} workers' rollouts while Ray restarts it",
            file=sys.stderr,
            flush=True,
        )
        return reason

    def _assemble(self, replies: list[dict[str, Any] | None]) -> dict[str, Any]:
        """The workers' slices side by side in env order; a lost worker's env copies hold no live agent."""
        full = RolloutBuffer(self.spec, self.steps, self.num_envs, memory=self.model.memory_layout())
        last_values = {g.name: torch.zeros(self.num_envs, g.num_agents) for g in self.spec.groups}
        last_alive = {
            g.name: torch.zeros(self.num_envs, g.num_agents, dtype=torch.bool) for g in self.spec.groups
        }
        for envs, reply in zip(self._slices, replies, strict=True):
            if reply is None:
                continue
            for target, piece in zip(full.tensors(), reply["buffer"], strict=True):
                target[:, envs.start : envs.stop] = piece
            for name in last_values:
                last_values[name][envs.start : envs.stop] = reply["last_values"][name]
                last_alive[name][envs.start : envs.stop] = reply["last_alive"][name]
        return {"buffer": full.tensors(), "last_values": last_values, "last_alive": last_alive}

    def _ask(self, command: str, arguments: list[Any]) -> list[Any]:
        """Send every live worker k `(command, arguments[k])`; the replies in worker order, None from a
        worker that is lost (now or before)."""
        if self._in_flight:
            self._receive()  # a rollout started with policy lag stays pending, never lost
        refs = {
            k: actor.call.remote(command, argument)
            for k, (actor, argument) in enumerate(zip(self._actors, arguments, strict=True))
            if k not in self._lost
        }
        return self._wait_all(refs, command)

    def _wait_all(self, refs: dict[int, Any], command: str, *, timeout_s: float | None = None) -> list[Any]:
        """The replies to `refs` in worker order, waiting `timeout_s` (`rollout.worker_timeout_s` by default); a
        worker that died meanwhile is marked lost (None)."""
        ray = self._ray
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        limit = "rollout.worker_timeout_s" if timeout_s == self.timeout_s else "a Ray worker's start"
        replies: list[Any] = [None] * len(self._actors)
        for k, ref in refs.items():
            try:
                replies[k] = ray.get(ref, timeout=0)
            except ray.exceptions.GetTimeoutError:
                raise WorkerError(
                    f"Ray rollout worker {k} did not answer '{command}' within {timeout_s:g} s ({limit})"
                ) from None
            except ray.exceptions.RayActorError as err:
                self._lose(k, f"{type(err).__name__} during '{command}'")
            except ray.exceptions.RayTaskError as err:
                raise self._task_error(k, err) from None
        return replies

    def _task_error(self, k: int, err: Any) -> Exception:
        """What a worker's own exception becomes here: the env's contract error as it is, else a WorkerError."""
        cause = getattr(err, "cause", None)
        if isinstance(cause, EnvContractError):
            return cause
        what = f"{type(cause).__name__}: {one_line(cause)}" if cause is not None else one_line(err)
        return WorkerError(f"Ray rollout worker {k} failed: {what}")
