"""OpenSpiel's sequential games (Kuhn and Leduc poker) as PettingZoo AEC envs, through Shimmy.

`InformationStateGame` is Shimmy's `OpenSpielCompatibilityV0` with three changes, each needed for a
policy whose NashConv OpenSpiel can compute:

- every agent observes its **information state tensor**. Shimmy gives the observation tensor where a
  game has one, and Leduc poker's observation tensor (private card, public card, chips in the pot)
  does not tell apart histories that put the same chips in the pot (a check and a raise-call in the
  first round, then a raise: 360 of its 516 observation tensors stand for more than one information
  state). The information state tensor is one vector per information state, so a feed-forward
  policy of it is a policy of the information state, which exploitability is defined over;
- an episode ends when the game is terminal and never by truncation: Shimmy counts chance outcomes
  as moves against `max_game_length`, which counts only the players' moves, and so cuts Kuhn poker
  off after its first bet;
- a reset without a seed continues the env's own random stream (the next seed drawn from it) instead
  of drawing a fresh one from the operating system, so a seeded run deals the same cards again.

`hanabi` is PettingZoo's Hanabi with the last change (`DealsFromSeed`).

This module imports Shimmy and OpenSpiel (`pyspiel`); the catalog imports it only to build an env.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyspiel
from gymnasium import spaces
from pettingzoo.utils import BaseWrapper
from shimmy import OpenSpielCompatibilityV0

from marl_ppo.envs.registry import EnvError


class InformationStateGame(OpenSpielCompatibilityV0):
    """A sequential OpenSpiel game, each agent observing its information state tensor (see the module)."""

    def __init__(self, game_name: str, params: dict[str, Any] | None = None, render_mode: str | None = None):
        try:
            game = pyspiel.load_game(game_name, params or {})
        except pyspiel.SpielError as err:
            raise EnvError(f"OpenSpiel game '{game_name}' with parameters {params or {}}: {err}") from None
        kind = game.get_type()
        if (
            kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL
            or not kind.provides_information_state_tensor
        ):
            raise EnvError(
                f"OpenSpiel game '{game_name}' is not a sequential game with an information state "
                "tensor; pick a turn-based game such as kuhn_poker or leduc_poker"
            )
        super().__init__(game_name=game_name, config=params or None, render_mode=render_mode)

    def _update_observation_spaces(self) -> None:
        shape = tuple(self._env.information_state_tensor_shape())
        for agent in self.possible_agents:
            self.observation_spaces[agent] = spaces.Box(-np.inf, np.inf, shape=shape, dtype=np.float64)

    def _update_observations(self) -> None:
        if self.game_state.is_terminal():
            return  # as Shimmy: an ended game keeps its last observations
        self.observations = {
            agent: np.asarray(self.game_state.information_state_tensor(player), dtype=np.float64)
            for agent, player in self.agent_name_id_mapping.items()
        }

    def _update_termination_truncation(self) -> None:
        over = bool(self.game_state.is_terminal())
        self.terminations = {agent: over for agent in self.agents}
        self.truncations = {agent: False for agent in self.agents}

    def action_names(self, agent: str) -> list[str]:
        """OpenSpiel's name of each of `agent`'s actions in the current state (`Pass`, `Bet`, ...)."""
        player = self.agent_name_id_mapping[agent]
        return [self.game_state.action_to_string(player, a) for a in range(self._env.num_distinct_actions())]

    def position_text(self, agent: str) -> str:
        """What `agent` knows of the game, in OpenSpiel's words: its information state string."""
        player = self.agent_name_id_mapping[agent]
        return f"information state: {self.game_state.information_state_string(player)}"

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        """Deal a new game; without a seed, the next seed comes from this env's own random stream."""
        if seed is None and hasattr(self, "np_random"):
            seed = int(self.np_random.integers(2**63))
        super().reset(seed=seed, options=options)


class DealsFromSeed(BaseWrapper):
    """A PettingZoo env of an OpenSpiel game through Shimmy (PettingZoo's Hanabi) whose reset without a
    seed continues the stream of the last seeded one, as `InformationStateGame.reset` does, instead of
    dealing from the operating system's entropy: every game of a seeded run is dealt again."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self._deals = np.random.default_rng(seed)
        elif getattr(self, "_deals", None) is not None:
            seed = int(self._deals.integers(2**31))  # Hanabi takes its seed as a C++ int
        self.env.reset(seed=seed, options=options)


def hanabi(**kwargs: Any) -> Any:
    """PettingZoo's Hanabi (OpenSpiel's game through Shimmy) with reproducible deals (`DealsFromSeed`)."""
    import pettingzoo

    return DealsFromSeed(pettingzoo.make("aec", "classic/hanabi-v5", **kwargs))
