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
  as the collector stores it), `rewards`, `terminated`, `truncated`, `final_obs`;
- per group `last_values` `(E, A_g)`: the critic's values of the observations after the last step
  (the bootstrap of the rollout's end, in the critic's units).

`replay` runs the same scan on given actions instead of sampled ones (their log-probabilities
computed): the same trajectories as stepping `JaxVectorEnv.step` in a Python loop.
Feed-forward policies only (`JaxPolicy`): every agent of a JaxMARL env is alive at every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.rollout.jax_policy import GroupParams, JaxPolicy, log_prob

Records = dict[str, Any]
"""The rollout's records (see the module), nested per group under `groups`."""


class CompiledRollout:
    """`steps`-step rollouts of `venv` under `policy`, each one compiled call (compiled on first use)."""

    def __init__(self, venv: JaxVectorEnv, policy: JaxPolicy, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"a compiled rollout needs at least 1 step, got {steps}")
        self.venv, self.policy, self.steps = venv, policy, steps
        jax = policy.jax
        self._sampled = jax.jit(self._scan_sampled)
        self._replayed = jax.jit(self._scan_replayed)

    def run(self, params: Mapping[str, GroupParams], key: Any) -> dict[str, Any]:
        """One rollout from where the env copies are, actions drawn with `key`; the copies continue
        from its end. The records as torch tensors (DLPack views of JAX's arrays)."""
        keys, states, out = self.venv.scan_start()
        (keys, states, out, _), records = self._sampled(params, keys, states, out, key)
        self.venv.continue_from(keys, states, out)
        return _to_torch(self.policy.jax, records)

    def replay(
        self, params: Mapping[str, GroupParams], actions: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        """`run` with the given per-group `(T, E, A_g)` actions instead of sampled ones."""
        jax = self.policy.jax
        forced = {name: jax.dlpack.from_dlpack(a.to(torch.int32).contiguous()) for name, a in actions.items()}
        keys, states, out = self.venv.scan_start()
        (keys, states, out), records = self._replayed(params, keys, states, out, forced)
        self.venv.continue_from(keys, states, out)
        return _to_torch(jax, records)

    def _scan_sampled(self, params: Any, keys: Any, states: Any, out: Any, key: Any) -> tuple[Any, Any]:
        jax = self.policy.jax

        def body(carry: Any, _: Any) -> tuple[Any, Any]:
            keys, states, out, key = carry
            key, draw = jax.random.split(key)
            draws = dict(zip(self.policy.forms, jax.random.split(draw, len(self.policy.forms)), strict=True))

            def choose(name: str, logits: Any) -> tuple[Any, Any]:
                return self.policy.sample(draws[name], logits)

            (keys, states, out), record = self._step(params, keys, states, out, choose)
            return (keys, states, out, key), record

        carry, records = jax.lax.scan(body, (keys, states, out, key), None, length=self.steps)
        records["last_values"] = self._last_values(params, carry[2])
        return carry, records

    def _scan_replayed(self, params: Any, keys: Any, states: Any, out: Any, forced: Any) -> tuple[Any, Any]:
        jax, jnp = self.policy.jax, self.policy.jnp

        def body(carry: Any, actions: Any) -> tuple[Any, Any]:
            keys, states, out = carry

            def choose(name: str, logits: Any) -> tuple[Any, Any]:
                return actions[name], log_prob(jnp, logits, actions[name])

            return self._step(params, keys, states, out, choose)

        carry, records = jax.lax.scan(body, (keys, states, out), forced, length=self.steps)
        records["last_values"] = self._last_values(params, carry[2])
        return carry, records

    def _last_values(self, params: Any, out: Any) -> dict[str, Any]:
        """Per group the critic's values `(E, A_g)` of the observations and state in `out`."""
        return {
            name: self.policy.values(name, params, out["state"], out["obs"][name])
            for name in self.policy.forms
        }

    def _step(self, params: Any, keys: Any, states: Any, out: Any, choose: Any) -> tuple[Any, Any]:
        """One step inside the scan: act with `choose(name, logits) -> (actions, logp)`, step the env,
        and the step's record."""
        policy, jnp = self.policy, self.policy.jnp
        masks = out.get("mask", {})
        groups: dict[str, dict[str, Any]] = {}
        for name in policy.forms:
            obs = out["obs"][name]
            mask = masks.get(name)
            actions, logp = choose(name, policy.logits(name, params, obs, mask))
            mask_record = mask if mask is not None else jnp.zeros((*obs.shape[:-1], 0), bool)
            values = policy.values(name, params, out["state"], obs)
            groups[name] = {"obs": obs, "action_mask": mask_record, "actions": actions, "logp": logp}
            groups[name]["values"] = values
        copies = out["state"].shape[0]
        flat = jnp.concatenate([groups[name]["actions"].reshape(copies, -1) for name in groups], axis=1)
        keys, states, after = self.venv.batched_step(keys, states, flat.astype(jnp.int32))
        truncated_anywhere = after["truncated"].any()
        for name, record in groups.items():
            agents = record["obs"].shape[-2]
            final = policy.values(name, params, after["final_state"], after["final_obs"][name])
            record["final_values"] = jnp.where(truncated_anywhere, final, jnp.zeros_like(final))
            record["rewards"] = after["reward"][name]
            record["final_obs"] = after["final_obs"][name]
            for flag in ("terminated", "truncated"):
                record[flag] = jnp.broadcast_to(after[flag][:, None], (after[flag].shape[0], agents))
        record_team = {
            "state": out["state"],
            "final_state": after["final_state"],
            "episode_over": after["done"],
            "won": after["won"],
            "groups": groups,
        }
        return (keys, states, after), record_team


def _to_torch(jax: Any, records: Records) -> dict[str, Any]:
    """The records as torch tensors sharing JAX's memory (DLPack)."""
    converted: dict[str, Any] = jax.tree.map(torch.from_dlpack, records)
    return converted
