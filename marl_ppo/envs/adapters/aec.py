"""PettingZoo AEC (turn-based) envs: one move per step, only the agent to move is alive.

Each step sends the action of `env.agent_selection` and writes every agent's reward of that move
(in a two-player game the loser is paid on the winner's move). `fold_turns` then joins each
agent's moves into transitions from one of its turns to the next, so a reward that arrives
while an agent waits is credited to its last move. Agents that are done are stepped with `None`
until the env removes them, as the AEC API requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.spec import TeamArrays


def is_aec(env: Any) -> bool:
    """True for PettingZoo AEC envs (and their wrappers)."""
    from pettingzoo import AECEnv

    return isinstance(env, AECEnv)


class TurnBasedAdapter(ParallelEnvAdapter):
    """Steps one AEC env a move at a time, with the ParallelEnvAdapter interface."""

    def reset(self, seed: int | None, out: TeamArrays[np.ndarray]) -> None:
        """Reset the env; every agent's observation is written, only the agent to move is alive."""
        self.ended_at, self.step_count = self.step_count, 0
        self._left_at.clear()
        self._call("reset", self.env.reset, seed=seed)
        if not self.env.agents:
            raise self._error(None, "reset returned no agents; at least one must be live")
        self._next_turn(out)

    def step(self, actions: Mapping[str, np.ndarray], out: TeamArrays[np.ndarray]) -> bool:
        """Play the move of the agent to move; True when the game is over."""
        mover = self.env.agent_selection
        group, i = self._slot(mover)
        present = list(self.env.agents)
        self.step_count += 1
        self._call("step", self.env.step, self._to_env_action(group, actions[group.name][i]))
        self._clear_step(out)
        for agent in self.env.rewards:
            group, i = self._slot(agent)
            self._write_reward(agent, self.env.rewards, out.groups[group.name].reward, i)
        for agent in self.env.agents:
            group, i = self._slot(agent)
            arrays = out.groups[group.name]
            arrays.terminated[i] = bool(self.env.terminations[agent])
            arrays.truncated[i] = bool(self.env.truncations[agent]) and not arrays.terminated[i]
        ended = all(self._done(agent) for agent in self.env.agents)
        if ended and not any(arrays.truncated.any() for arrays in out.groups.values()):
            out.final_state.fill(0.0)  # a game over by termination: no bootstrap reads these, so the
            # finished env is not asked for observations or its state
        else:
            self._observe_all(out, "final_obs")
            self._write_state(out.final_state, out, "final_obs")
        while self.env.agents and self._done(self.env.agent_selection):
            self._call("step", self.env.step, None)  # finished agents leave through a None step
        live = set(self.env.agents)
        silent = [a for a in present if a not in live and not self._flagged(a, out)]
        if silent or self._left_at:
            self._check_leavers(silent, live, over=not live)
        if self.env.agents:
            self._next_turn(out)
            return False
        for arrays in out.groups.values():
            arrays.alive.fill(False)
            arrays.obs.fill(0.0)
        out.state[...] = out.final_state
        return True

    def _done(self, agent: str) -> bool:
        return bool(self.env.terminations[agent] or self.env.truncations[agent])

    def _observe_all(self, out: TeamArrays[np.ndarray], field: str) -> None:
        """Every present agent's observation into its group's `field` array (`obs` or `final_obs`)."""
        for agent in self.env.agents:
            group, i = self._slot(agent)
            getattr(out.groups[group.name], field)[i] = self._flatten(agent, self.env.observe(agent))

    def _next_turn(self, out: TeamArrays[np.ndarray]) -> None:
        """Observations for the next move: every present agent's view; alive and mask for the mover only."""
        mover = self.env.agent_selection
        for arrays in out.groups.values():
            arrays.obs.fill(0.0)
            arrays.alive.fill(False)
            arrays.action_mask.fill(True)
        self._observe_all(out, "obs")
        group, i = self._slot(mover)
        arrays = out.groups[group.name]
        arrays.alive[i] = True
        self._write_mask(mover, self.env.observe(mover), self.env.infos, arrays.action_mask[i])
        self._write_state(out.state, out, "obs")
