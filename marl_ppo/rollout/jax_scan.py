"""A T-step rollout of a JaxMARL env as one compiled `lax.scan`: env step, policy forward and sampling.

Each step of the scan reads the current observations, state and masks, computes every group's
Categorical logits and critic values with `JaxPolicy`, draws the actions (`jax.random`, from a key the
caller derives from the run's seed), steps every env copy with the vector env's own batched step
(`JaxVectorEnv.batched_step`: the same function the per-step path calls, auto-reset included) and
records what the rollout buffer stores, stacked `(T, E, ...)` and handed to torch by DLPack once:

- the team `state` `(T, E, S)`, `episode_over` and `won` `(T, E)`, the `final_state` `(T, E, S)`;
- per group `(T, E, A_g, ...)`: `obs`, `action_mask` (mask_dim 0 without masks), `actions`, `logp`,
  `values` and `final_values` (the critic's units: `ValueNorm.denormalize` is torch's, once per
  rollout; `final_values` is V(final obs, final state) where any copy truncated at the step, else 0,
  as the collector stores it, from the critic's carry after the step), `rewards`, `terminated`,
  `truncated`, `final_obs`, `shaped` (the env's shaped reward, for an env that reports one), and
  the policy's memory as the step read it (`GroupCarry`): `is_first`,
  `actor_state` and `critic_state` (`(T, E, rows, S_c)`), the carries before the step's reset;
- per group `last_values` `(E, A_g)`: the critic's values of the observations after the last step
  (the bootstrap of the rollout's end, in the critic's units, from the critic's carry then).

The scan carries each group's memory (`GroupCarry`) from step to step as `PolicyMemory` carries it
on the per-step path: the networks reset a carry where `is_first`, every agent of a JaxMARL env acts
at every step (so every carry advances), and an agent's next step is first where its copy's episode
ended. A rollout starts from the memory the caller hands it (the last rollout's) and returns the
memory after its last step beside the records.

A program takes the policy's parameters as torch holds them (`JaxPolicy.weights`) and folds them
for the forward at its start (`JaxPolicy.fold`): the same numbers whether the weights were read from
torch or handed over as the JAX learner's outputs. `launch` dispatches a rollout and returns at once
(JAX runs the program while Python goes on), leaving the vector env where it was; `land` waits for
it and moves the env copies on to its end. `run` is the two together.

`replay` runs the same scan on given actions instead of sampled ones (their log-probabilities
computed): the same trajectories as stepping `JaxVectorEnv.step` in a Python loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.rollout.jax_policy import GroupWeights, JaxPolicy, log_prob

Records = dict[str, Any]
"""The rollout's records (see the module), nested per group under `groups`."""


class GroupCarry(NamedTuple):
    """One group's policy memory between two steps, as JAX arrays: `is_first` `(E, A_g)` (the agent's
    episode starts at the next step), the actor's carry `(E, A_g, S_a)` and the critic's
    `(E, rows, S_c)` (sizes 0 for feed-forward networks)."""

    is_first: Any
    actor: Any
    critic: Any


class Launched(NamedTuple):
    """A dispatched rollout's outputs (JAX arrays, computed or on their way): the copies' keys, states
    and last `out` after its last step, the policy's memory then, and the records."""

    keys: Any
    states: Any
    out: Any
    memory: Any
    records: Any


class CompiledRollout:
    """`steps`-step rollouts of `venv` under `policy`, each one compiled call (compiled on first use)."""

    def __init__(self, venv: JaxVectorEnv, policy: JaxPolicy, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"a compiled rollout needs at least 1 step, got {steps}")
        self.venv, self.policy, self.steps = venv, policy, steps
        jax = policy.jax
        self._sampled = jax.jit(self._scan_sampled)
        self._replayed = jax.jit(self._scan_replayed)

    def fresh_memory(self) -> dict[str, GroupCarry]:
        """Every copy about to start an episode: every `is_first` set, the carries zero."""
        jnp, copies = self.policy.jnp, self.venv.num_envs
        layout = self.policy.model.memory_layout()
        return {
            group.name: GroupCarry(
                is_first=jnp.ones((copies, group.num_agents), bool),
                actor=jnp.zeros((copies, group.num_agents, layout[group.name].actor_size), jnp.float32),
                critic=jnp.zeros(
                    (copies, layout[group.name].critic_rows, layout[group.name].critic_size), jnp.float32
                ),
            )
            for group in self.venv.spec.groups
        }

    def run(
        self, weights: Mapping[str, GroupWeights], key: Any, memory: Mapping[str, GroupCarry] | None = None
    ) -> dict[str, Any]:
        """One rollout from where the env copies and the policy's `memory` are (None: `fresh_memory`),
        actions drawn with `key`; the copies continue from its end. The records as torch tensors (DLPack
        views of JAX's arrays), with the memory after the last step under `memory`."""
        return self.land(self.launch(weights, key, memory))

    def launch(
        self, weights: Mapping[str, GroupWeights], key: Any, memory: Mapping[str, GroupCarry] | None = None
    ) -> Launched:
        """`run`'s rollout dispatched: its outputs, on their way while Python goes on; the env copies
        stay where they are until `land`."""
        keys, states, out = self.venv.scan_start()
        memory = self.fresh_memory() if memory is None else memory
        (keys, states, out, memory, _), records = self._sampled(weights, keys, states, out, memory, key)
        return Launched(keys, states, out, memory, records)

    def land(self, launched: Launched) -> dict[str, Any]:
        """`run`'s result of a launched rollout (waiting for it): the env copies continue from its end."""
        self.venv.continue_from(launched.keys, launched.states, launched.out)
        return _to_torch(self.policy.jax, {**launched.records, "memory": launched.memory})

    def replay(
        self,
        weights: Mapping[str, GroupWeights],
        actions: Mapping[str, torch.Tensor],
        memory: Mapping[str, GroupCarry] | None = None,
    ) -> dict[str, Any]:
        """`run` with the given per-group `(T, E, A_g)` actions instead of sampled ones."""
        jax = self.policy.jax
        forced = {name: jax.dlpack.from_dlpack(a.to(torch.int32).contiguous()) for name, a in actions.items()}
        keys, states, out = self.venv.scan_start()
        memory = self.fresh_memory() if memory is None else memory
        (keys, states, out, memory), records = self._replayed(weights, keys, states, out, memory, forced)
        self.venv.continue_from(keys, states, out)
        return _to_torch(jax, {**records, "memory": memory})

    def _scan_sampled(
        self, weights: Any, keys: Any, states: Any, out: Any, memory: Any, key: Any
    ) -> tuple[Any, Any]:
        jax, params = self.policy.jax, self.policy.fold(weights)

        def body(carry: Any, _: Any) -> tuple[Any, Any]:
            keys, states, out, memory, key = carry
            key, draw = jax.random.split(key)
            draws = dict(zip(self.policy.forms, jax.random.split(draw, len(self.policy.forms)), strict=True))

            def choose(name: str, logits: Any) -> tuple[Any, Any]:
                return self.policy.sample(draws[name], logits)

            (keys, states, out, memory), record = self._step(params, keys, states, out, memory, choose)
            return (keys, states, out, memory, key), record

        carry, records = jax.lax.scan(body, (keys, states, out, memory, key), None, length=self.steps)
        records["last_values"] = self._last_values(params, carry[2], carry[3])
        return carry, records

    def _scan_replayed(
        self, weights: Any, keys: Any, states: Any, out: Any, memory: Any, forced: Any
    ) -> tuple[Any, Any]:
        jax, jnp, params = self.policy.jax, self.policy.jnp, self.policy.fold(weights)

        def body(carry: Any, actions: Any) -> tuple[Any, Any]:
            keys, states, out, memory = carry

            def choose(name: str, logits: Any) -> tuple[Any, Any]:
                return actions[name], log_prob(jnp, logits, actions[name])

            return self._step(params, keys, states, out, memory, choose)

        carry, records = jax.lax.scan(body, (keys, states, out, memory), forced, length=self.steps)
        records["last_values"] = self._last_values(params, carry[2], carry[3])
        return carry, records

    def _last_values(self, params: Any, out: Any, memory: Mapping[str, GroupCarry]) -> dict[str, Any]:
        """Per group the critic's values `(E, A_g)` of the observations and state in `out`, from the
        critic's carry in `memory` (reset where an episode starts)."""
        values = {}
        for name in self.policy.forms:
            carry = memory[name]
            values[name], _ = self.policy.values(
                name, params, out["state"], out["obs"][name], carry.critic, carry.is_first
            )
        return values

    def _step(
        self, params: Any, keys: Any, states: Any, out: Any, memory: Mapping[str, GroupCarry], choose: Any
    ) -> tuple[Any, Any]:
        """One step inside the scan: act with `choose(name, logits) -> (actions, logp)`, step the env,
        carry the policy's memory on, and the step's record."""
        policy, jnp = self.policy, self.policy.jnp
        masks = out.get("mask", {})
        groups: dict[str, dict[str, Any]] = {}
        stepped: dict[str, tuple[Any, Any]] = {}
        for name in policy.forms:
            obs, carry = out["obs"][name], memory[name]
            mask = masks.get(name)
            logits, actor_next = policy.logits(name, params, obs, mask, carry.actor, carry.is_first)
            actions, logp = choose(name, logits)
            mask_record = mask if mask is not None else jnp.zeros((*obs.shape[:-1], 0), bool)
            values, critic_next = policy.values(name, params, out["state"], obs, carry.critic, carry.is_first)
            stepped[name] = (actor_next, critic_next)
            groups[name] = {"obs": obs, "action_mask": mask_record, "actions": actions, "logp": logp}
            groups[name] |= {"values": values, "is_first": carry.is_first}
            groups[name] |= {"actor_state": carry.actor, "critic_state": carry.critic}
        copies = out["state"].shape[0]
        flat = jnp.concatenate([groups[name]["actions"].reshape(copies, -1) for name in groups], axis=1)
        keys, states, after = self.venv.batched_step(keys, states, flat.astype(jnp.int32))
        truncated_anywhere = after["truncated"].any()
        following = {}
        for name, record in groups.items():
            agents = record["obs"].shape[-2]
            actor_next, critic_next = stepped[name]

            # from the critic's carry after the step, with no reset: the episode's next step; only
            # read where a copy truncated, so the critic runs at those steps alone
            def final_values(name: str = name, record: Any = record, critic_next: Any = critic_next) -> Any:
                final, _ = policy.values(
                    name,
                    params,
                    after["final_state"],
                    after["final_obs"][name],
                    critic_next,
                    jnp.zeros_like(record["is_first"]),
                )
                return final

            record["final_values"] = self.policy.jax.lax.cond(
                truncated_anywhere, final_values, lambda record=record: jnp.zeros_like(record["values"])
            )
            record["rewards"] = after["reward"][name]
            if "shaped" in after:
                record["shaped"] = after["shaped"][name]
            record["final_obs"] = after["final_obs"][name]
            for flag in ("terminated", "truncated"):
                record[flag] = jnp.broadcast_to(after[flag][:, None], (after[flag].shape[0], agents))
            # every agent acts at every step, and each one's episode ends where its copy's does
            is_first = jnp.broadcast_to(after["done"][:, None], (copies, agents))
            following[name] = GroupCarry(is_first, actor_next, critic_next)
        record_team = {
            "state": out["state"],
            "final_state": after["final_state"],
            "episode_over": after["done"],
            "won": after["won"],
            "groups": groups,
        }
        return (keys, states, after, following), record_team


def _to_torch(jax: Any, records: Records) -> dict[str, Any]:
    """The records as torch tensors sharing JAX's memory (DLPack)."""
    converted: dict[str, Any] = jax.tree.map(torch.from_dlpack, records)
    return converted
