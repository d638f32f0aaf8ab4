"""The league in the collector: in each env copy's episode the learner plays one side and a snapshot
every other side (`rollout.opponents.Opponents`), in this process or in a rollout worker.

The learner samples every agent's action as in self-play; on the agents of the sides it does not play
in a copy, the snapshot's actions replace them, and those agents' steps are left out of training
(their `alive` is false in the buffer). A copy whose opponent is the current policy (`self_play`)
trains every side. Each snapshot in use acts over all copies with its own carries (a recurrent
snapshot keeps its state across the steps of its episodes), its actions sampled from its policy.
When a copy's episode ends, the learner's score in it is recorded (an `OpponentGame`, for PFSP's win
table) and the copy's next side and opponent are drawn with the copy's own generator
(`sampling.copy_generator`) by the plan fixed when the rollout began (`sampling.DrawPlan`). The
copies' first draws are made as their first rollout begins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.league.sampling import CURRENT, DrawPlan, copy_generator
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.opponents import OpponentGame
from marl_ppo.rollout.stepper import Finished, PolicyActing


class LeagueSeats:
    """Each copy's learner side and opponent, and the snapshots that play (`Opponents`)."""

    def __init__(
        self,
        spec: TeamSpec,
        sides: Mapping[str, Sequence[str]],
        copies: range,
        *,
        seed: int,
        models: Callable[[int], TeamModel],
        plans: Callable[[], DrawPlan],
        record: Callable[[OpponentGame], None],
        device: torch.device,
    ) -> None:
        """The seats of env copies `copies` (the run's indices) in a run with `seed`: snapshot `i` acts
        as `models(i)`, each rollout draws by `plans()` and each finished game goes to `record`."""
        self.spec, self.copies, self.device = spec, copies, device
        self.models, self.plans, self.record = models, plans, record
        self.sides = {name: tuple(agents) for name, agents in sides.items()}
        self.members = {
            group.name: torch.tensor(
                [[agent in agents for agent in group.agents] for agents in self.sides.values()], device=device
            )
            for group in spec.groups
        }
        """Per group `(sides, A_g)`: whether each of its agents is on each side."""
        self._columns = [[spec.agents.index(a) for a in agents] for agents in self.sides.values()]
        self.rngs = [copy_generator(seed, copy) for copy in copies]
        """Each copy's generator of its draws."""
        self.side = np.zeros(len(copies), dtype=np.int64)
        """The side the learner plays in each copy's episode."""
        self.opponent = np.full(len(copies), CURRENT, dtype=np.int64)
        """The snapshot id that plays every other side in each copy's episode (CURRENT: the policy itself)."""
        self.drawn = False
        """Whether the copies' first episodes have been drawn."""
        self.players: dict[int, PolicyActing] = {}
        """The snapshots in use, each acting over every copy."""
        self._plan: DrawPlan | None = None
        self._step = 0
        self._carries: dict[int, Any] = {}
        """Restored carries of snapshots in use, put in place when their players start."""

    def begin_rollout(self) -> None:
        """Fix the rollout's plan (`plans()`); draw the copies' first episodes before the first rollout."""
        self._plan, self._step = self.plans(), 0
        if not self.drawn:
            for index in range(len(self.copies)):
                self._draw(index)
            self.drawn = True
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
        """Record the learner's score in each ended episode against its snapshot; draw the copy's next
        side and opponent (called once per step)."""
        step, self._step = self._step, self._step + 1
        if not ended:
            return
        for episode in ended:
            index = episode.copy
            opponent = int(self.opponent[index])
            if opponent != CURRENT:
                score = self.score(episode.agent_returns, int(self.side[index]))
                self.record(OpponentGame(step, self.copies[index], opponent, score))
            self._draw(index)
        self._refresh_players()

    def score(self, agent_returns: np.ndarray, side: int) -> float:
        """The learner's score in an episode: 1 where its side's return is above every other side's, 1/2
        where it ties the best, else 0."""
        returns = np.array([agent_returns[c].sum() for c in self._columns])
        own, others = returns[side], np.delete(returns, side).max()
        return 1.0 if own > others else 0.5 if own == others else 0.0

    def _draw(self, index: int) -> None:
        if self._plan is None:
            raise RuntimeError("the league's seats draw only within a rollout (after begin_rollout)")
        self.side[index], self.opponent[index] = self._plan.draw(self.rngs[index], len(self.sides))

    def _refresh_players(self) -> None:
        """Start acting objects for the snapshots newly in use; drop those no copy plays."""
        used = {int(s) for s in self.opponent if s != CURRENT}
        for snapshot in list(self.players):
            if snapshot not in used:
                del self.players[snapshot]
        for snapshot in sorted(used - set(self.players)):
            player = PolicyActing(self.models(snapshot), len(self.copies), self.device, deterministic=False)
            if snapshot in self._carries:
                player.memory.load_state_dict(self._carries[snapshot])
            self.players[snapshot] = player
        self._carries.clear()
        # they sample in the order of their ids, whatever order they came into use in: a resumed run's
        # players, started afresh, draw the same random numbers as the uninterrupted run's
        self.players = dict(sorted(self.players.items()))

    def state_dict(self) -> dict[str, Any]:
        """Each copy's side, opponent and generator, and the carries of the snapshots in use."""
        return {
            "side": torch.from_numpy(self.side.copy()),
            "opponent": torch.from_numpy(self.opponent.copy()),
            "rngs": [rng.bit_generator.state for rng in self.rngs],
            "drawn": self.drawn,
            "memories": {int(s): p.memory.state_dict() for s, p in self.players.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`; the snapshots in use start acting, with their carries, as the next
        rollout begins. (A checkpoint written before each copy drew with its own generator has none:
        the copies' draws go on from fresh generators.)"""
        self.side[:] = torch.as_tensor(state["side"]).numpy()
        self.opponent[:] = torch.as_tensor(state["opponent"]).numpy()
        for rng, saved in zip(self.rngs, state.get("rngs", []), strict=False):
            rng.bit_generator.state = dict(saved)
        self.drawn = bool(state.get("drawn", True))
        self.players = {}
        self._carries = {int(s): memory for s, memory in state["memories"].items()}


@dataclass(frozen=True)
class WorkerSeats:
    """What a rollout worker builds its slice's `LeagueSeats` from (`rollout.opponents.OpponentsSetup`)."""

    sides: Mapping[str, tuple[str, ...]]
    seed: int

    def build(
        self, spec: TeamSpec, copies: range, models: Callable[[int], TeamModel], device: torch.device
    ) -> SlicedSeats:
        """The seats of the worker's env copies `copies`."""
        return SlicedSeats(spec, self.sides, copies, seed=self.seed, models=models, device=device)


class SlicedSeats(LeagueSeats):
    """A rollout worker's seats: drawn by the plan each rollout command brings, their games kept for
    the reply (`rollout.opponents.WorkerOpponents`)."""

    def __init__(
        self,
        spec: TeamSpec,
        sides: Mapping[str, Sequence[str]],
        copies: range,
        *,
        seed: int,
        models: Callable[[int], TeamModel],
        device: torch.device,
    ) -> None:
        self.games: list[OpponentGame] = []
        self._next: DrawPlan | None = None
        super().__init__(
            spec,
            sides,
            copies,
            seed=seed,
            models=models,
            plans=self._take_plan,
            record=self.games.append,
            device=device,
        )

    def use_plan(self, plan: Any) -> None:
        """The plan the next rollout draws by."""
        if not isinstance(plan, DrawPlan):
            raise TypeError(f"a league's seats draw by a DrawPlan, got {type(plan).__name__}")
        self._next = plan

    def _take_plan(self) -> DrawPlan:
        if self._next is None:
            raise RuntimeError("a rollout worker's league seats got no plan for the rollout")
        self.games.clear()
        return self._next
