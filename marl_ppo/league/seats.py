"""The league in the collector: in each env copy's episode the learner plays one side and a snapshot
every other side (`rollout.collector.Opponents`).

The learner samples every agent's action as in self-play; on the agents of the sides it does not play
in a copy, the snapshot's actions replace them, and those agents' steps are left out of training
(their `alive` is false in the buffer). A copy whose opponent is the current policy (`self_play`)
trains every side. Each snapshot in use acts over all copies with its own carries (a recurrent
snapshot keeps its state across the steps of its episodes), its actions sampled from its policy.
When a copy's episode ends, the learner's score in it goes to the sampler (for PFSP) and the copy's
next side and opponent are drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.league.pool import Pool
from marl_ppo.league.sampling import CURRENT, OpponentSampler
from marl_ppo.rollout.stepper import Finished, PolicyActing


class LeagueSeats:
    """Each copy's learner side and opponent, and the snapshots that play (`Opponents`)."""

    def __init__(
        self,
        spec: TeamSpec,
        sides: Mapping[str, Sequence[str]],
        pool: Pool,
        sampler: OpponentSampler,
        copies: int,
        device: torch.device,
    ) -> None:
        self.spec, self.pool, self.sampler, self.copies, self.device = spec, pool, sampler, copies, device
        self.sides = {name: tuple(agents) for name, agents in sides.items()}
        self.members = {
            group.name: torch.tensor(
                [[agent in agents for agent in group.agents] for agents in self.sides.values()], device=device
            )
            for group in spec.groups
        }
        """Per group `(sides, A_g)`: whether each of its agents is on each side."""
        self._columns = [[spec.agents.index(a) for a in agents] for agents in self.sides.values()]
        self.side = np.zeros(copies, dtype=np.int64)
        """The side the learner plays in each copy's episode."""
        self.opponent = np.full(copies, CURRENT, dtype=np.int64)
        """The snapshot id that plays every other side in each copy's episode (CURRENT: the policy itself)."""
        self.players: dict[int, PolicyActing] = {}
        """The snapshots in use, each acting over every copy."""

    def start(self) -> None:
        """Draw every copy's side and opponent (a run's first episodes)."""
        for copy in range(self.copies):
            self._draw(copy)
        self._refresh_players()

    def act(
        self,
        obs: Mapping[str, torch.Tensor],
        masks: Mapping[str, torch.Tensor],
        alive: Mapping[str, torch.Tensor],
        actions: dict[str, torch.Tensor],
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The actions with each snapshot's on the agents it plays, and per group `(E, A_g)` whether each
        agent's step trains the learner (its side, or every agent where the opponent is CURRENT)."""
        side = torch.from_numpy(self.side).to(self.device)
        opponent = torch.from_numpy(self.opponent).to(self.device)
        mine = {name: members[side] for name, members in self.members.items()}  # (E, A_g)
        current = (opponent == CURRENT).unsqueeze(-1)
        played = dict(actions)
        for snapshot, player in self.players.items():
            theirs = player.act_on(obs, masks, alive)
            here = (opponent == snapshot).unsqueeze(-1)
            for name, chosen in played.items():
                rows = here & ~mine[name]
                rows = rows.reshape(*rows.shape, *([1] * (chosen.dim() - 2)))
                played[name] = torch.where(rows, theirs[name].to(chosen.dtype), chosen)
        return played, {name: rows | current for name, rows in mine.items()}

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """Every snapshot in use carries its state on."""
        for player in self.players.values():
            player.advance(arrays, episode_over)

    def episodes_ended(self, ended: Sequence[Finished]) -> None:
        """Score the learner in each ended episode against its snapshot; draw the copy's next side and
        opponent."""
        if not ended:
            return
        for episode in ended:
            copy = episode.copy
            opponent = int(self.opponent[copy])
            if opponent != CURRENT:
                self.sampler.record(opponent, self.score(episode.agent_returns, int(self.side[copy])))
            self._draw(copy)
        self._refresh_players()

    def score(self, agent_returns: np.ndarray, side: int) -> float:
        """The learner's score in an episode: 1 where its side's return is above every other side's, 1/2
        where it ties the best, else 0."""
        returns = np.array([agent_returns[c].sum() for c in self._columns])
        own, others = returns[side], np.delete(returns, side).max()
        return 1.0 if own > others else 0.5 if own == others else 0.0

    def _draw(self, copy: int) -> None:
        self.side[copy], self.opponent[copy] = self.sampler.draw(self.pool.snapshots, len(self.sides))

    def _refresh_players(self) -> None:
        """Start acting objects for the snapshots newly in use; drop those no copy plays."""
        used = {int(s) for s in self.opponent if s != CURRENT}
        for snapshot in list(self.players):
            if snapshot not in used:
                del self.players[snapshot]
        for snapshot in sorted(used - set(self.players)):
            model = self.pool.model(snapshot)
            self.players[snapshot] = PolicyActing(model, self.copies, self.device, deterministic=False)

    def state_dict(self) -> dict[str, Any]:
        """Each copy's side and opponent, and the carries of the snapshots in use."""
        return {
            "side": torch.from_numpy(self.side.copy()),
            "opponent": torch.from_numpy(self.opponent.copy()),
            "memories": {int(s): p.memory.state_dict() for s, p in self.players.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()` (the pool must be restored first)."""
        self.side[:] = torch.as_tensor(state["side"]).numpy()
        self.opponent[:] = torch.as_tensor(state["opponent"]).numpy()
        self.players = {}
        self._refresh_players()
        for snapshot, memory in state["memories"].items():
            self.players[int(snapshot)].memory.load_state_dict(memory)
