"""Synchronous vector env: E adapters stepped in turn, auto-reset, results in preallocated `(E, A_g, ...)` arrays."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from marl_ppo.envs.adapters.contract import check_finite
from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.envs.vector.state import dump_env_state, load_env_state


class SyncVectorEnv:
    """Steps `num_envs` copies in this process (a `VectorEnv`; see there what `arrays` holds after a step)."""

    tensor_io = False
    """Actions go in and results come out as NumPy arrays."""

    def __init__(self, make_adapter: Callable[[], ParallelEnvAdapter], num_envs: int) -> None:
        self.adapters = [make_adapter() for _ in range(num_envs)]
        for i, adapter in enumerate(self.adapters):
            adapter.copy_index = i
        self.spec: TeamSpec = self.adapters[0].spec
        self.num_envs = num_envs
        self.arrays = TeamArrays.allocate(self.spec, (num_envs,))
        self._rows = [self.arrays.row(i) for i in range(num_envs)]
        self.episode_over = np.zeros(num_envs, dtype=bool)

    def reset(self, seed: int) -> TeamArrays[np.ndarray]:
        """Reset env i with `seed + i`; later auto-resets continue each env's own RNG."""
        for i, (adapter, row) in enumerate(zip(self.adapters, self._rows, strict=True)):
            adapter.reset(seed + i, row)
        self.episode_over[:] = False
        check_finite(self.arrays, self.adapters, self.episode_over, state=self.spec.state_from_env)
        return self.arrays

    def step(self, actions: Mapping[str, np.ndarray]) -> TeamArrays[np.ndarray]:
        """Step every env with `actions[group]` of shape `(E, A_g, ...)`; reset the envs whose episode ended."""
        for i, (adapter, row) in enumerate(zip(self.adapters, self._rows, strict=True)):
            over = adapter.step({name: a[i] for name, a in actions.items()}, row)
            self.episode_over[i] = over
            if over:
                adapter.reset(None, row)
        check_finite(self.arrays, self.adapters, self.episode_over, state=self.spec.state_from_env)
        return self.arrays

    def env_states(self) -> list[bytes]:
        """Each env copy's complete state, pickled; raises EnvStateError when the env cannot be pickled."""
        return [dump_env_state(adapter) for adapter in self.adapters]

    def load_env_states(self, states: Sequence[bytes]) -> None:
        """Replace the env copies by the ones `env_states` saved (trusted bytes only: unpickling runs code)."""
        if len(states) != self.num_envs:
            raise ValueError(f"got {len(states)} env states for {self.num_envs} env copies")
        self.close()
        self.adapters = [load_env_state(blob) for blob in states]

    def close(self) -> None:
        """Close every env."""
        for adapter in self.adapters:
            adapter.close()
