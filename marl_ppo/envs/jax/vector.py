"""JaxMARL envs as one jitted, vmapped batch: every copy steps in one XLA call, results reach torch by DLPack.

`JaxVectorEnv` has the vector-env interface with `tensor_io`: actions come in as torch tensors and the
arrays it hands out are torch tensors that share memory with JAX's outputs (DLPack), so nothing passes
through NumPy. One compiled function steps all E copies, resets the finished ones (keeping their
final observations for the truncation bootstrap, which JaxMARL's own auto-reset discards), and reads
the next action masks and the global state. Each step's arrays are new tensors: `arrays` is replaced,
never written into, except after `load_env_states`, when it holds torch-owned copies that a resumed
collector may overwrite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.envs.grouping import group_members
from marl_ppo.envs.jax.families import JaxFamily
from marl_ppo.envs.jax.runtime import TensorMarks, jax_modules, marks_hold, tensor_marks
from marl_ppo.envs.spec import GroupArrays, GroupSpec, TeamArrays, TeamSpec
from marl_ppo.envs.vector.state import dump_env_state, load_env_state

MASKS_FROM_ENV = "env"
"""`GroupSpec.mask_source` of a JAX env: the family reads the masks from the env's state."""


def _to_gymnasium(space: Any, env_id: str, agent: str) -> gym.spaces.Box | gym.spaces.Discrete:
    """A JaxMARL space as the Gymnasium space the learner reads (observations flattened)."""
    if hasattr(space, "n"):
        return gym.spaces.Discrete(int(space.n))
    if hasattr(space, "shape"):
        return gym.spaces.Box(-np.inf, np.inf, (int(np.prod(space.shape)),), np.float32)
    raise EnvContractError(
        f"JAX env '{env_id}': agent '{agent}' has the space {space!r}; Box or Discrete expected"
    )


class _Spaces:
    """The per-agent space lookups `group_members` expects."""

    def __init__(self, observation: dict[str, gym.Space], action: dict[str, gym.Space]) -> None:
        self.observation, self.action = observation, action

    def observation_space(self, agent: str) -> gym.Space:
        return self.observation[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self.action[agent]


def jax_team_spec(env: Any, family: JaxFamily, env_id: str, state_dim: int) -> TeamSpec:
    """Groups of agents with identical spaces; masks where the family has them."""
    agents = tuple(env.agents)
    spaces = _Spaces(
        {a: _to_gymnasium(env.observation_space(a), env_id, a) for a in agents},
        {a: _to_gymnasium(env.action_space(a), env_id, a) for a in agents},
    )
    masks = None if family.masks is None else MASKS_FROM_ENV
    groups = []
    for name, members in group_members(spaces, agents, None):
        obs_space = spaces.observation_space(members[0])
        action_space = spaces.action_space(members[0])
        assert isinstance(obs_space, gym.spaces.Box) and isinstance(action_space, gym.spaces.Discrete)
        obs_dim = int(obs_space.shape[0])
        groups.append(GroupSpec(name, members, obs_space, action_space, obs_dim, mask_source=masks))
    return TeamSpec(env_id, agents, tuple(groups), state_dim, state_from_env=family.world_state)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Which agents' arrays go where: groups in team order, and the flat action order `step` takes."""

    spec: TeamSpec

    @property
    def action_order(self) -> tuple[str, ...]:
        """Agents in the order of the groups' concatenated action columns."""
        return tuple(agent for group in self.spec.groups for agent in group.agents)


def _batched_functions(env: Any, family: JaxFamily, spec: TeamSpec) -> tuple[Any, Any]:
    """`(reset, step)` jitted over E copies: `reset(keys)` and `step(keys, states, actions)` return
    `(keys, states, out)`, `out` a dict of arrays (see `_pack`)."""
    jax, jnp = jax_modules()
    order = _Layout(spec).action_order

    def pack(obs: dict[str, Any], state: Any) -> dict[str, Any]:
        groups = {
            g.name: jnp.stack([obs[a].reshape(-1).astype(jnp.float32) for a in g.agents]) for g in spec.groups
        }
        if family.world_state:
            team_state = obs["world_state"].reshape(-1).astype(jnp.float32)
        else:
            team_state = jnp.concatenate([groups[g.name].reshape(-1) for g in spec.groups])
        out = {"obs": groups, "state": team_state}
        if family.masks is not None:
            masks = family.masks(env, state)
            out["mask"] = {g.name: jnp.stack([masks[a] for a in g.agents]).astype(bool) for g in spec.groups}
        return out

    def reset_one(key: Any) -> tuple[Any, Any, dict[str, Any]]:
        key, reset_key = jax.random.split(key)
        obs, state = env.reset(reset_key)
        # a reset may leave weakly typed leaves (a Python constant's type) where a step leaves strongly
        # typed ones: made strong, a reset's state and a step's compile one program, not two
        state = jax.tree.map(lambda leaf: jax.lax.convert_element_type(leaf, leaf.dtype), state)
        out = pack(obs, state)
        out["final_obs"], out["final_state"] = out["obs"], out["state"]
        out["reward"] = {g.name: jnp.zeros(g.num_agents, jnp.float32) for g in spec.groups}
        out["terminated"] = out["truncated"] = out["done"] = out["won"] = jnp.zeros((), bool)
        if family.shaped_reward:
            out["shaped"] = {g.name: jnp.zeros(g.num_agents, jnp.float32) for g in spec.groups}
        return key, state, out

    def step_one(key: Any, state: Any, actions: Any) -> tuple[Any, Any, dict[str, Any]]:
        key, step_key, reset_key = jax.random.split(key, 3)
        obs, after, rewards, dones, info = env.step_env(
            step_key, state, dict(zip(order, actions, strict=True))
        )
        done = dones["__all__"]
        truncated = done & family.time_limit(env, after)
        won = done & family.won(env, after) if family.won is not None else jnp.zeros((), bool)
        final = pack(obs, after)
        reset_obs, reset_state = env.reset(reset_key)
        chosen = jax.tree.map(lambda new, old: jnp.where(done, new, old), reset_state, after)
        fresh = pack(reset_obs, reset_state)
        out = jax.tree.map(lambda new, old: jnp.where(done, new, old), fresh, final)
        out["final_obs"], out["final_state"] = final["obs"], final["state"]
        out["reward"] = {
            g.name: jnp.stack([rewards[a] for a in g.agents]).astype(jnp.float32) for g in spec.groups
        }
        out["terminated"], out["truncated"] = done & ~truncated, truncated
        out["done"], out["won"] = done, won
        if family.shaped_reward:
            shaped = info["shaped_reward"]
            out["shaped"] = {
                g.name: jnp.stack([shaped[a] for a in g.agents]).astype(jnp.float32) for g in spec.groups
            }
        return key, chosen, out

    return jax.jit(jax.vmap(reset_one)), jax.jit(jax.vmap(step_one))


def _to_torch(array: Any) -> torch.Tensor:
    """A JAX array as a torch tensor sharing its memory (DLPack)."""
    return torch.from_dlpack(array)


class JaxVectorEnv:
    """E copies of a JaxMARL env stepped as one compiled batch; `arrays` are torch views of JAX's outputs."""

    tensor_io = True
    """Actions go in and results come out as torch tensors (on JAX's device)."""

    def __init__(self, env: Any, family: JaxFamily, env_id: str, num_envs: int) -> None:
        """`env`: the raw JaxMARL env (one copy's logic; JAX vmaps it over `num_envs` copies)."""
        jax, _ = jax_modules()
        if num_envs < 1:
            raise EnvContractError(f"JAX env '{env_id}': num_envs must be at least 1, got {num_envs}")
        self.env, self.family, self.num_envs = env, family, num_envs
        self._jax = jax
        probe_obs, _ = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
        state_dim = (
            int(np.prod(probe_obs["world_state"].shape))
            if family.world_state
            else sum(int(np.prod(probe_obs[a].shape)) for a in env.agents)
        )
        self.spec = jax_team_spec(env, family, env_id, state_dim)
        self._reset, self._step = _batched_functions(env, family, self.spec)
        self._keys: Any = None
        self._states: Any = None
        self.arrays = TeamArrays.allocate(self.spec, (num_envs,)).map(torch.from_numpy)
        self._alive = {
            g.name: torch.ones((num_envs, g.num_agents), dtype=torch.bool) for g in self.spec.groups
        }
        self._no_mask = {
            g.name: torch.ones((num_envs, g.num_agents, 0), dtype=torch.bool) for g in self.spec.groups
        }
        self._episode_over = torch.zeros(num_envs, dtype=torch.bool)
        self._episode_won = torch.zeros(num_envs, dtype=torch.bool)
        self._shaped: dict[str, torch.Tensor] | None = (
            {g.name: torch.zeros((num_envs, g.num_agents)) for g in self.spec.groups}
            if family.shaped_reward
            else None
        )
        self._scan_out: tuple[dict[str, Any], TeamArrays[torch.Tensor], TensorMarks] | None = None
        """The last compiled rollout's `out`, the arrays published from it and their tensors' versions
        (`scan_start` takes it up again while they are untouched)."""

    @property
    def episode_over(self) -> torch.Tensor:
        """`(E,)` bools: the copy's episode ended at the last step (and it was reset)."""
        return self._episode_over

    @property
    def shaped_reward(self) -> dict[str, torch.Tensor] | None:
        """Per group `(E, A_g)`: the shaped reward of the last step (0 after a reset), beside the env's own
        reward in `arrays`; None for an env that reports none (`JaxFamily.shaped_reward`)."""
        return self._shaped

    def reset(self, seed: int) -> TeamArrays[torch.Tensor]:
        """Reset copy i from the key of `seed + i`."""
        jax = self._jax
        seeds = np.arange(seed, seed + self.num_envs, dtype=np.uint32)
        keys = jax.vmap(jax.random.PRNGKey)(seeds)
        self._keys, self._states, out = self._reset(keys)
        self._publish(out)
        return self.arrays

    def step(self, actions: Mapping[str, torch.Tensor]) -> TeamArrays[torch.Tensor]:
        """Step every copy with per-group `(E, A_g)` actions; finished copies start new episodes."""
        flat = torch.cat([actions[g.name].reshape(self.num_envs, -1) for g in self.spec.groups], dim=1)
        jax_actions = self._jax.dlpack.from_dlpack(flat.to(torch.int32).contiguous())
        self._keys, self._states, out = self._step(self._keys, self._states, jax_actions)
        self._publish(out)
        return self.arrays

    def _publish(self, out: dict[str, Any]) -> None:
        """Point `arrays` at a reset's or step's outputs (DLPack views) and count the finished episodes."""
        groups = {}
        for g in self.spec.groups:
            flags = {
                name: _to_torch(out[name]).unsqueeze(1).expand(-1, g.num_agents)
                for name in ("terminated", "truncated")
            }
            groups[g.name] = GroupArrays(
                obs=_to_torch(out["obs"][g.name]),
                alive=self._alive[g.name],
                action_mask=_to_torch(out["mask"][g.name]) if "mask" in out else self._no_mask[g.name],
                reward=_to_torch(out["reward"][g.name]),
                terminated=flags["terminated"],
                truncated=flags["truncated"],
                final_obs=_to_torch(out["final_obs"][g.name]),
            )
        state, final_state = _to_torch(out["state"]), _to_torch(out["final_state"])
        self.arrays = TeamArrays(groups=groups, state=state, final_state=final_state)
        self._episode_over = _to_torch(out["done"])
        self._episode_won = _to_torch(out["won"])
        if self._shaped is not None:
            self._shaped = {name: _to_torch(reward) for name, reward in out["shaped"].items()}

    @property
    def batched_step(self) -> Any:
        """The jitted `step(keys, states, actions) -> (keys, states, out)` over every copy (see
        `_batched_functions`), for a compiled rollout to call inside its own program."""
        return self._step

    def scan_start(self) -> tuple[Any, Any, dict[str, Any]]:
        """`(keys, states, out)` where the next step starts: the copies' keys and states, and the last
        step's `out` (as `_batched_functions` gives it): the last compiled rollout's own while nothing
        has replaced or written into `arrays` since, else rebuilt from `arrays` as JAX arrays."""
        kept = self._scan_out
        if kept is not None and kept[1] is self.arrays and marks_hold(kept[2], self._tensors()):
            out = kept[0]
            device = next(iter(out["state"].devices()))
            keys, states = self._jax.device_put((self._keys, self._states), device)
            return keys, states, out
        groups = self.arrays.groups
        jnp = self._jax.numpy

        def jax_of(tensor: torch.Tensor) -> Any:
            return jnp.array(
                self._jax.dlpack.from_dlpack(tensor.contiguous()), copy=True
            )  # torch may write it later

        def per_group(field: str) -> dict[str, Any]:
            return {g.name: jax_of(getattr(groups[g.name], field)) for g in self.spec.groups}

        first = groups[self.spec.groups[0].name]
        out = {
            "obs": per_group("obs"),
            "state": jax_of(self.arrays.state),
            "final_obs": per_group("final_obs"),
            "final_state": jax_of(self.arrays.final_state),
            "reward": per_group("reward"),
            "terminated": jax_of(first.terminated[:, 0]),
            "truncated": jax_of(first.truncated[:, 0]),
            "done": jax_of(self._episode_over),
            "won": jax_of(self._episode_won),
        }
        if self.family.masks is not None:
            out["mask"] = per_group("action_mask")
        if self._shaped is not None:
            out["shaped"] = {name: jax_of(reward) for name, reward in self._shaped.items()}
        # committed to the arrays' device, as the scan's own outputs are: one compiled program for both
        device = next(iter(out["state"].devices()))
        keys, states = self._jax.device_put((self._keys, self._states), device)
        return keys, states, out

    def here(self) -> tuple[Any, ...]:
        """Where the copies are now, for `still_at` to tell later whether anything has moved them."""
        return (self._keys, self._states, self.arrays, tensor_marks(self._tensors()))

    def still_at(self, here: tuple[Any, ...]) -> bool:
        """Whether the copies are where `here()` found them: no step, reset or load since, and nothing
        written into `arrays` (a rollout launched from there is the one to take up)."""
        keys, states, arrays, marks = here
        return (
            keys is self._keys
            and states is self._states
            and arrays is self.arrays
            and marks_hold(marks, self._tensors())
        )

    def continue_from(self, keys: Any, states: Any, out: dict[str, Any]) -> None:
        """Take up the copies where a compiled rollout left them: its last keys, states and `out`."""
        self._keys, self._states = keys, states
        self._publish(out)
        self._scan_out = (out, self.arrays, tensor_marks(self._tensors()))

    def _tensors(self) -> list[torch.Tensor]:
        """Every tensor `arrays` and the episode flags hold."""
        tensors = [self.arrays.state, self.arrays.final_state, self._episode_over, self._episode_won]
        tensors.extend((self._shaped or {}).values())
        for group in self.arrays.groups.values():
            tensors.extend(getattr(group, field.name) for field in dataclasses.fields(group))
        return tensors

    def env_states(self) -> list[bytes]:
        """Every copy's keys and state, as NumPy arrays, in one blob."""
        return [dump_env_state(self._jax.device_get((self._keys, self._states)))]

    def load_env_states(self, states: Sequence[bytes]) -> None:
        """Restore what `env_states` saved; `arrays` become torch-owned copies until the next step."""
        if len(states) != 1:
            raise ValueError(f"got {len(states)} env states for one batched JAX env")
        keys, env_states = load_env_state(states[0])
        self._keys = self._jax.numpy.asarray(keys)
        self._states = self._jax.tree.map(self._jax.numpy.asarray, env_states)
        self.arrays = self.arrays.map(lambda tensor: tensor.clone())

    def close(self) -> None:
        """Nothing to release (JAX frees the arrays)."""


class JaxVectorEnvWithWins(JaxVectorEnv):
    """A JAX env whose episodes can be won (SMAX): the stepper reads `episode_won` (`WinsEpisodes`)."""

    @property
    def episode_won(self) -> torch.Tensor:
        """`(E,)` bools: the copy's episode ended at the last step with a win."""
        return self._episode_won


def jax_vector_env(env: Any, family: JaxFamily, env_id: str, num_envs: int) -> JaxVectorEnv:
    """The vector env of `num_envs` copies of `env`, reporting wins where the family has them."""
    kind = JaxVectorEnv if family.won is None else JaxVectorEnvWithWins
    return kind(env, family, env_id, num_envs)
