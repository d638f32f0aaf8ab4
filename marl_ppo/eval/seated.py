"""Episodes in which each side of the game is played by one of several policies, chosen per env copy.

A policy scored against random opponents (`eval.versus`) and the matches between a league's
policies (`league.match`) both step their envs through `play_seated`: each game of a schedule names
the player of every side, and env copy i plays the schedule's games i, i + E, i + 2E, ... in turn.
Every player acts for every agent of every copy and keeps its own carries over the copies (a
recurrent policy's memory, episode by episode); only the actions of the agents on its own sides are
sent to the env.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.evaluate import MAX_EPISODE_STEPS, _global_rng_untouched, evaluation_step
from marl_ppo.rollout.stepper import Acting, Finished, Stepper


class SeatedActing:
    """Per env copy, each side's agents acted for by the player seated there (`Acting`).

    `seating` `(E, sides)` is the index (in `players`) of each side's player in each copy's episode;
    the loop sets it as episodes end."""

    def __init__(
        self,
        players: Sequence[Acting],
        members: Mapping[str, torch.Tensor],
        copies: int,
        device: torch.device,
    ) -> None:
        """`members`: per group, `(sides, A_g)` whether each of its agents is on each side."""
        self.players, self.members, self.device = list(players), members, device
        sides = next(iter(members.values())).shape[0]
        self.seating = torch.zeros((copies, sides), dtype=torch.int64)

    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """Per group, each agent's action from the player seated on its side (players asked in order)."""
        chosen = [player.act(arrays) for player in self.players]
        seating = self.seating.to(self.device)
        actions = {}
        for name, first in chosen[0].items():
            # (E, A_g): the player of each agent's side, each agent being on exactly one side
            player_of = (seating[:, :, None] * self.members[name][None].long()).sum(1)
            player_of = player_of.reshape(*player_of.shape, *([1] * (first.dim() - 2)))
            combined = first
            for index, actions_of in enumerate(chosen[1:], start=1):
                combined = torch.where(player_of == index, actions_of[name].to(first.dtype), combined)
            actions[name] = combined
        return actions

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """Every player carries on (each acted for every agent, though only its sides' actions counted)."""
        for player in self.players:
            player.advance(arrays, episode_over)


def side_members(
    spec: TeamSpec, sides: Mapping[str, Sequence[str]], device: torch.device
) -> dict[str, torch.Tensor]:
    """Per group, `(sides, A_g)`: whether each of its agents is on each side."""
    return {
        group.name: torch.tensor(
            [[agent in agents for agent in group.agents] for agents in sides.values()], device=device
        )
        for group in spec.groups
    }


def play_seated(
    venv: VectorEnv,
    players: Sequence[Acting],
    sides: Mapping[str, Sequence[str]],
    schedule: Sequence[Sequence[int]],
    device: torch.device,
    *,
    seed: int,
) -> list[tuple[int, Finished]]:
    """Play every game of `schedule` (per game, each side's player index), copy i the games i, i + E, ...;
    per game as it ended, its index in `schedule` and its episode (each agent's return, its length).

    Seeded: the env copies reset with `seed + i` and torch's generator with `seed` (the caller's
    global generators are restored afterwards)."""
    copies = venv.num_envs
    queues = [list(range(i, len(schedule), copies)) for i in range(copies)]
    acting = SeatedActing(players, side_members(venv.spec, sides, device), copies, device)
    stepper = Stepper(venv, max_episode_steps=MAX_EPISODE_STEPS)
    done = [0] * copies
    ended: list[tuple[int, Finished]] = []
    with _global_rng_untouched(device):
        torch.manual_seed(seed)
        stepper.reset(seed)
        while any(done[i] < len(queues[i]) for i in range(copies)):
            # a copy past its last game plays on, seated as in that game, until every copy is done
            acting.seating = torch.tensor(
                [
                    list(schedule[q[min(d, len(q) - 1)]]) if q else [0] * len(sides)
                    for q, d in zip(queues, done, strict=True)
                ]
            )
            for episode in evaluation_step(stepper, acting):
                i = episode.copy
                if done[i] < len(queues[i]):
                    ended.append((queues[i][done[i]], episode))
                done[i] += 1
    return ended
