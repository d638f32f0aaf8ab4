"""One env copy as a vector env for the stepping loop, reset only when its caller asks.

A vector env resets a copy as soon as its episode ends; a recorded episode (`video.py`) and a game
played by hand (`play.py`) need the last position kept, to draw it, so their copy resets only when
the caller calls `reset` (through `Stepper.reset`), once per episode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marl_ppo.envs.adapters.aec import TurnBasedAdapter, is_aec
from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.eval.evaluate import EvalError


class OneCopy:
    """`env` (a PettingZoo env from `make_team_env`) behind its adapter, as a one-copy vector env without
    auto-reset: after the step that ends an episode, the env holds its last position until `reset`."""

    tensor_io = False
    num_envs = 1

    def __init__(self, env: Any, spec: TeamSpec) -> None:
        self.env, self.spec = env, spec
        self.adapter = TurnBasedAdapter(env, spec) if is_aec(env) else ParallelEnvAdapter(env, spec)
        self.arrays = TeamArrays.allocate(spec, (1,))
        self._row = self.arrays.row(0)
        self.episode_over = np.zeros(1, dtype=bool)

    def reset(self, seed: int) -> TeamArrays:
        """Reset the env with `seed`."""
        self.adapter.reset(seed, self._row)
        self.episode_over[:] = False
        return self.arrays

    def step(self, actions: Mapping[str, np.ndarray]) -> TeamArrays:
        """One step of the episode (copy 0's actions); no reset when it ends."""
        self.episode_over[0] = self.adapter.step({name: a[0] for name, a in actions.items()}, self._row)
        return self.arrays

    def observe(self, agent: str) -> np.ndarray:
        """`agent`'s flat observation of the position the env holds now (after the episode's last step
        too): a turn-based env is asked (`observe`), a parallel env's last step gave it."""
        if is_aec(self.env):
            return self.adapter._flatten(agent, self.env.observe(agent))  # the adapter's own flattening
        group, index = self.spec.group_of(agent)
        arrays = self.arrays.groups[group.name]
        return arrays.final_obs[0, index] if self.episode_over[0] else arrays.obs[0, index]

    def env_states(self) -> list[bytes]:
        """Not saved: the copy lasts one session."""
        raise EvalError("a single env copy's state is not saved")

    def load_env_states(self, states: Sequence[bytes]) -> None:
        """Not restored: the copy lasts one session."""
        raise EvalError("a single env copy's state is not restored")

    def close(self) -> None:
        """The caller closes the env it built."""
