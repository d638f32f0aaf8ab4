"""A JaxMARL env's rollouts, each one compiled program (`rollout.jax_scan`), behind the same
`RolloutSource` interface as the collector: the loop, checkpoints and resume see no difference.

`collect` reads the policy's weights into JAX once, runs the scan with a key derived from the run's
seed and the rollout's number (a resumed run draws what the uninterrupted one drew, with no state of
its own), and writes the records into the buffer as the collector writes its steps: values through
the group's `ValueNorm`, every agent alive (a JaxMARL env's agents all act at every step), the
flags and carries each step read (a feed-forward network's are empty). The policy's live memory
(`PolicyMemory`, saved in checkpoints as the collector saves it) goes into the scan and takes up the
memory after its last step, so a rollout's carries continue the last one's. The episode
accounting (each copy's running returns and length, the episodes that ended and whether they were
won) is computed once per rollout from the recorded rewards and episode ends, as `Stepper` keeps it
step by step, and is saved in checkpoints under the same names. The scan's time is the rollout's
env time (`env_s`): JAX steps the env and the policy's forward in one program.

`launch` starts the next rollout early: the JAX learner hands it its new weights as soon as it has
dispatched the update's program (`JaxTrainer.next_rollout`), so the rollout's program runs right after
the update's while Python writes the weights back, logs and checkpoints. `collect` takes it up only
where it is the rollout it would run itself (the same env position, step count, memory and weights,
compared by value), else runs its own; either way the same numbers, so a resumed run stays exact. A
launched rollout's `env_s` is the time `collect` waited for it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.vector.base import WinsEpisodes
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.buffer import GroupMemory, GroupStorage, RolloutBuffer
from marl_ppo.rollout.collector import arrays_state, load_arrays
from marl_ppo.rollout.jax_policy import GroupWeights, JaxPolicy
from marl_ppo.rollout.jax_scan import CompiledRollout, GroupCarry, Launched, Records
from marl_ppo.rollout.memory import make_memory
from marl_ppo.rollout.shaping import WEIGHT_TAG, RewardShaping
from marl_ppo.rollout.source import EpisodeRecord, InProcessSource, RolloutResult
from marl_ppo.rollout.stepper import Finished

ACTING_STREAM = 0x4A4158
"""The spawn key's first word of the acting keys (`SeedSequence(seed, spawn_key=(ACTING_STREAM,
rollout))`): a stream of its own beside the seed's other uses (env resets, torch, a resume's reseed)."""


class EpisodeTally:
    """Each env copy's running per-agent returns (team agent order) and episode length, carried across
    rollouts; the episodes a rollout's records end, in step order and copy order within a step (as
    `Stepper` hands them out, with the same sums: float32 rewards added into float64 totals)."""

    def __init__(self, spec: TeamSpec, copies: int) -> None:
        self.columns = {g.name: [spec.agents.index(agent) for agent in g.agents] for g in spec.groups}
        self.returns = np.zeros((copies, spec.num_agents), dtype=np.float64)
        self.lengths = np.zeros(copies, dtype=np.int64)

    def reset(self) -> None:
        """Every copy starts an episode."""
        self.returns[:] = 0.0
        self.lengths[:] = 0

    def account(
        self, rewards: Mapping[str, np.ndarray], over: np.ndarray, won: np.ndarray | None
    ) -> list[tuple[int, Finished]]:
        """Add a rollout's per-group `(T, E, A_g)` rewards; the episodes that ended (`over` `(T, E)`;
        `won` `(T, E)` or None for an env whose episodes cannot be won), each with its step's index."""
        steps = over.shape[0]
        team = np.zeros((steps, *self.returns.shape), dtype=np.float64)
        for name, columns in self.columns.items():
            team[:, :, columns] = rewards[name]
        ended: list[tuple[int, Finished]] = []
        start = 0
        # from one step where an episode ends to the next, the running returns of every copy as
        # `np.add.accumulate` sums them: one addition per step in step order, the loop's own sums
        for t in [*np.flatnonzero(over.any(1)).tolist(), steps - 1]:
            if t < start:  # the last step ended episodes too: nothing left after it
                continue
            running = np.add.accumulate(np.concatenate([self.returns[None], team[start : t + 1]]), axis=0)
            self.returns[...] = running[-1]
            self.lengths += t + 1 - start
            start = t + 1
            copies = np.flatnonzero(over[t])
            for copy in copies.tolist():
                copy_won = None if won is None else bool(won[t, copy])
                ended.append(
                    (t, Finished(copy, self.returns[copy].copy(), int(self.lengths[copy]), copy_won))
                )
            self.returns[copies] = 0.0
            self.lengths[copies] = 0
        return ended

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The unfinished episodes' running returns and lengths, named as `Stepper.state_dict` names them."""
        return {
            "returns": torch.from_numpy(self.returns.copy()),
            "lengths": torch.from_numpy(self.lengths.copy()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`."""
        self.returns[...] = torch.as_tensor(state["returns"]).numpy()
        self.lengths[...] = torch.as_tensor(state["lengths"]).numpy()


class CompiledSource(InProcessSource):
    """Rollouts of a JaxMARL vector env under `model`'s policy, each one compiled
    `lax.scan` of `steps` steps (compiled at the first; new weights each update need no new compile)."""

    def __init__(
        self, venv: JaxVectorEnv, model: TeamModel, device: torch.device, *, steps: int, seed: int
    ) -> None:
        """Raises `jax_policy.NotCompilable` for a model the JAX forward does not cover."""
        self.venv, self.model, self.device, self.seed = venv, model, device, seed
        self.policy = JaxPolicy(model)
        self.rollout = CompiledRollout(venv, self.policy, steps)
        self.memory = make_memory(model, venv.num_envs, device)
        """The `is_first` flags and carries the next rollout starts with (saved in checkpoints)."""
        self.tally = EpisodeTally(venv.spec, venv.num_envs)
        self.env_steps = 0
        """Env steps taken so far over all copies (one per copy per step)."""
        self._wins = isinstance(venv, WinsEpisodes)
        self.shaping: RewardShaping | None = None
        """Where set, the env's shaped reward is added to the rewards stored (the venv reports one)."""
        self._ahead: _Ahead | None = None
        """The next rollout, launched on the learner's new weights (`launch`)."""

    def start(self, seed: int) -> None:
        """Reset every env copy (copy i from `seed + i`) and clear the episode accounting."""
        self._ahead = None
        self.venv.reset(seed)
        self.tally.reset()
        self.memory.start()

    def state_dict(self) -> dict[str, Any]:
        """Counters, the unfinished episodes' returns and lengths, and the env arrays the next step
        reads, as the collector saves them."""
        return {
            "env_steps": self.env_steps,
            **self.tally.state_dict(),
            "arrays": arrays_state(self.venv.arrays),
            "memory": self.memory.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], *, episodes: bool = True) -> None:
        """Restore `state_dict()`; `episodes=False` keeps only the step counter (the envs were reset instead)."""
        self._ahead = None
        self.env_steps = int(state["env_steps"])
        if not episodes:
            return
        self.tally.load_state_dict(state)
        load_arrays(self.venv.arrays, state["arrays"])
        self.memory.load_state_dict(state["memory"])

    def rollout_key(self) -> Any:
        """The sampling key of the next rollout: from the run's seed and the rollouts handed out so far."""
        rollouts = self.env_steps // (self.rollout.steps * self.venv.num_envs)
        words = np.random.SeedSequence(self.seed, spawn_key=(ACTING_STREAM, rollouts)).generate_state(2)
        return self.policy.jnp.asarray(words, dtype=self.policy.jnp.uint32)

    def launch(self, new: Mapping[int, Any]) -> None:
        """Start the next rollout now, on weights the policy's parameters are about to take: `new` holds
        JAX arrays under the `id` of the torch tensor each will be written into (the others are read
        from torch as they are). `collect` takes it up if nothing else has changed by then."""
        here = self.rollout.venv.here()
        weights = self.policy.weights(new)
        launched = self.rollout.launch(weights, self.rollout_key(), self._live_memory())
        self._ahead = _Ahead(launched, weights, self.env_steps, here)

    @torch.no_grad()
    def collect(self, buffer: RolloutBuffer, *, ahead: bool = True) -> RolloutResult:
        """Fill `buffer` (empty, `steps` long) with one compiled rollout of every copy: the launched one
        where it is still this rollout (see the module), else one run now. `ahead` does not matter
        here: no rollout runs on weights older than the learner's."""
        if buffer.steps != self.rollout.steps:
            raise ValueError(
                f"the compiled rollout has {self.rollout.steps} steps, the buffer {buffer.steps}"
            )
        started = time.perf_counter()
        launched, self._ahead = self._ahead, None
        if launched is not None and launched.holds(self):
            records = self.rollout.land(launched.rollout)
        else:
            records = self.rollout.run(self.policy.weights(), self.rollout_key(), self._live_memory())
        scan_s = time.perf_counter() - started
        return self._store(records, buffer, scan_s=scan_s)

    def _store(self, records: Records, buffer: RolloutBuffer, *, scan_s: float = 0.0) -> RolloutResult:
        """Write a rollout's records into `buffer` as the collector writes its steps, account its
        episodes and count its steps; what the loop reads of it."""
        before = self.env_steps
        records = {key: _on(value, self.device) for key, value in records.items()}
        weight = None if self.shaping is None else self.shaping.weight_at(before)
        buffer.add_rollout(
            records["state"],
            self._groups(records, buffer, weight),
            self._memory(records),
            episode_over=records["episode_over"],
        )
        self.env_steps += buffer.steps * self.venv.num_envs
        copies = self.venv.num_envs
        # JAX steps the env and the policy's forward together: the scan counts as the env's time, and
        # acting's is what torch does (writing the buffer, the accounting)
        result = RolloutResult(
            env_steps=buffer.steps * copies, env_seconds=scan_s, perf={"perf/scan_s": scan_s}
        )
        if weight is not None:
            result.perf[WEIGHT_TAG] = weight
        result.episodes = [
            _record(episode, before + (t + 1) * copies) for t, episode in self._finished(records)
        ]
        for name in buffer.groups:
            norm = self.model.group(name).value_norm
            result.last_values[name] = norm.denormalize(records["last_values"][name])
            result.last_alive[name] = torch.ones_like(result.last_values[name], dtype=torch.bool)
        return result

    def _groups(
        self, records: Records, buffer: RolloutBuffer, weight: float | None
    ) -> dict[str, GroupStorage]:
        """Each group's records in return units, as the collector stores them: V(final obs) where any
        copy truncated at the step, else 0; the env's reward plus `weight` times its shaped reward
        where `weight` is set."""
        groups = records["groups"]
        truncated = torch.stack([g["truncated"].flatten(1).any(1) for g in groups.values()]).any(0)
        stored = {}
        for name, storage in buffer.groups.items():
            record, norm = groups[name], self.model.group(name).value_norm
            final = torch.where(truncated[:, None, None], norm.denormalize(record["final_values"]), 0.0)
            stored[name] = GroupStorage(
                obs=record["obs"],
                actions=record["actions"],
                logp=record["logp"],
                values=norm.denormalize(record["values"]),
                final_values=final,
                rewards=record["rewards"]
                if weight is None
                else record["rewards"] + weight * record["shaped"],
                terminated=record["terminated"],
                truncated=record["truncated"],
                alive=torch.ones_like(storage.alive),
                action_mask=record["action_mask"],
            )
        return stored

    def _live_memory(self) -> dict[str, GroupCarry]:
        """The live flags and carries (`PolicyMemory.live`) as the JAX arrays the scan starts from."""
        jnp = self.policy.jnp

        def jax_of(tensor: torch.Tensor) -> Any:
            return jnp.array(tensor.detach().cpu().numpy(), copy=True)

        return {
            name: GroupCarry(jax_of(live.is_first), jax_of(live.actor_state), jax_of(live.critic_state))
            for name, live in self.memory.live.items()
        }

    def _memory(self, records: Records) -> dict[str, GroupMemory]:
        """Each group's `(T, E, ...)` memory records (the flags and carries each step read); the live
        ones move on to the memory after the rollout's last step."""
        memory = {}
        for name, live in self.memory.live.items():
            record, after = records["groups"][name], records["memory"][name]
            memory[name] = GroupMemory(
                is_first=record["is_first"],
                actor_state=record["actor_state"],
                critic_state=record["critic_state"],
            )
            live.is_first.copy_(after.is_first)
            live.actor_state.copy_(after.actor)
            live.critic_state.copy_(after.critic)
        return memory

    def _finished(self, records: Records) -> list[tuple[int, Finished]]:
        """The episodes the rollout ended, each with its step's index."""
        rewards = {name: g["rewards"].cpu().numpy() for name, g in records["groups"].items()}
        won = records["won"].cpu().numpy() if self._wins else None
        return self.tally.account(rewards, records["episode_over"].cpu().numpy(), won)


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """A launched rollout and what it started from."""

    rollout: Launched
    weights: Mapping[str, GroupWeights]
    env_steps: int
    here: tuple[Any, ...]
    """`JaxVectorEnv.here()` when it was launched."""

    def holds(self, source: CompiledSource) -> bool:
        """Whether it is the rollout `source` would run now: the same step count (so the same key and,
        with `start` and `load_state_dict` dropping it, the same memory), env position and weights."""
        return (
            self.env_steps == source.env_steps
            and source.rollout.venv.still_at(self.here)
            and source.policy.holds(self.weights)
        )


def _record(episode: Finished, end_step: int) -> EpisodeRecord:
    returns = episode.agent_returns
    return EpisodeRecord(float(returns.sum()), returns, episode.length, end_step, episode.won)


def _on(value: Any, device: torch.device) -> Any:
    """`value` (a tensor, or a dict or named tuple of them) on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, GroupCarry):
        return GroupCarry(*(_on(item, device) for item in value))
    return {key: _on(item, device) for key, item in value.items()}
