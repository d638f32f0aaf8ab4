"""Scores against a uniformly random opponent: a game's win, draw and loss rates, or each team's return.

A zero-sum game's team return summed over its seats is always 0, so self-play shows no progress in
it. Here the policy plays one side of each episode and a random policy (uniform over the allowed
actions) plays every other agent. Sides (`eval.vs_random`): `seats`, every agent is a side (classic
games); `teams`, agents are sides by their names without the trailing number (`adversary_0` and
`adversary_1` are the team `adversary`), or as `eval.teams` names them where names do not tell teams apart
(simple_crypto's alice and bob against eve). Each side is played for the same number of episodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.grouping import agent_stem, agents_named
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.evaluate import (
    EvalError,
    PeriodicEvaluation,
    PolicyScore,
    mean_ci95,
)
from marl_ppo.eval.random_policy import RandomActing
from marl_ppo.eval.seated import play_seated
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.stepper import Acting, PolicyActing


def sides_of(
    spec: TeamSpec, mode: str, teams: Mapping[str, Sequence[str]] | None = None
) -> dict[str, tuple[str, ...]]:
    """The sides the policy plays in turn: each agent (`seats`), or teams (`teams`): those `teams` names
    (`eval.teams`), else agents by name without its number."""
    if mode not in ("seats", "teams"):
        raise EvalError(f"eval.vs_random '{mode}' is not a scoring mode; use seats or teams")
    if mode == "teams" and teams is not None:
        return _named_teams(spec, teams)
    sides: dict[str, list[str]] = {}
    for agent in spec.agents:
        sides.setdefault(agent if mode == "seats" else agent_stem(agent), []).append(agent)
    if len(sides) < 2:
        raise EvalError(
            f"eval.vs_random: {mode} needs two or more sides, but env '{spec.env_id}' has agents "
            f"{list(spec.agents)} ({'one team' if mode == 'teams' else 'one seat'}); use the other mode, "
            "eval.teams, or null"
        )
    return {name: tuple(agents) for name, agents in sides.items()}


def _named_teams(spec: TeamSpec, teams: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """The teams `eval.teams` names, each name an agent or a stem; every agent on exactly one team."""
    sides: dict[str, tuple[str, ...]] = {}
    for team, names in teams.items():
        sides[team], unknown = agents_named(names, spec.agents)
        if unknown:
            raise EvalError(
                f"eval.teams: team '{team}' names {unknown}, which match none of env '{spec.env_id}''s "
                f"agents {list(spec.agents)}; name agents or their names without the number"
            )
    counts = {a: sum(a in members for members in sides.values()) for a in spec.agents}
    if any(n != 1 for n in counts.values()) or len(sides) < 2:
        raise EvalError(
            f"eval.teams must put each of {list(spec.agents)} on exactly one of two or more teams "
            f"(on none: {[a for a, n in counts.items() if n == 0]}, on several: "
            f"{[a for a, n in counts.items() if n > 1]}, teams: {len(sides)})"
        )
    return sides


@dataclass(frozen=True)
class VersusResult:
    """Episodes of the policy playing one side against random others, in a fixed order."""

    mode: str
    sides: dict[str, tuple[str, ...]]
    agents: tuple[str, ...]
    played: np.ndarray
    """`(N,)`: the index (in `sides`) of the side the policy played in each episode."""
    agent_returns: np.ndarray
    """`(N, num_agents)`: each agent's return in each episode."""

    def side_returns(self) -> np.ndarray:
        """`(N, sides)`: each side's return (the sum over its agents) in each episode."""
        columns = [[self.agents.index(a) for a in agents] for agents in self.sides.values()]
        return np.stack([self.agent_returns[:, c].sum(axis=1) for c in columns], axis=1)

    def outcomes(self) -> np.ndarray:
        """`(N,)`: 1 a win (the policy's side above every other), 0 a draw (tied at the top), -1 a loss."""
        returns = self.side_returns()
        own = returns[np.arange(len(self.played)), self.played]
        others = np.where(np.eye(len(self.sides), dtype=bool)[self.played], -np.inf, returns).max(axis=1)
        return np.sign(own - others).astype(np.int64)

    def scalars(self) -> dict[str, float]:
        """TensorBoard tags under `eval/vs_random/`: rates of a game, or each team's return and its opponents'."""
        prefix, names = "eval/vs_random", list(self.sides)
        returns = self.side_returns()
        if self.mode == "seats":
            outcomes = self.outcomes()
            scalars = {f"{prefix}/{k}_rate": float((outcomes == v).mean()) for k, v in RATES}
            for i, seat in enumerate(names):
                scalars[f"{prefix}/{seat}/win_rate"] = float((outcomes[self.played == i] == 1).mean())
            return scalars
        scalars = {}
        for i, team in enumerate(names):
            mine = self.played == i
            scalars[f"{prefix}/{team}/team_return"] = float(returns[mine, i].mean())
            scalars[f"{prefix}/{team}/opponent_return"] = float(
                np.delete(returns[mine], i, axis=1).sum(1).mean()
            )
        return scalars

    def to_dict(self) -> dict[str, Any]:
        """For eval.json: the mode, sides, the scores with 95% CIs, and every episode's values."""
        names, returns = list(self.sides), self.side_returns()
        summary: dict[str, Any] = {"mode": self.mode, "sides": {k: list(v) for k, v in self.sides.items()}}
        summary.update({key.removeprefix("eval/vs_random/"): value for key, value in self.scalars().items()})
        summary["return_of_the_side_played"] = {
            name: mean_ci95(returns[self.played == i, i]) for i, name in enumerate(names)
        }
        summary["per_episode"] = {
            "side_played": [names[i] for i in self.played],
            "side_returns": returns.tolist(),
            **({"outcome": self.outcomes().tolist()} if self.mode == "seats" else {}),
        }
        return summary


RATES = (("win", 1), ("draw", 0), ("loss", -1))


def play_vs_random(
    venv: VectorEnv,
    policy: Acting,
    device: torch.device,
    *,
    mode: str,
    episodes_per_side: int,
    seed: int,
    teams: Mapping[str, Sequence[str]] | None = None,
) -> VersusResult:
    """Play every side (`sides_of`) for `episodes_per_side` episodes with `policy`, the other agents at random."""
    spec = venv.spec
    sides = sides_of(spec, mode, teams)
    # game k plays side k // episodes_per_side: the policy (player 0) there, random (player 1) elsewhere
    schedule = [
        tuple(0 if side == k // episodes_per_side else 1 for side in range(len(sides)))
        for k in range(episodes_per_side * len(sides))
    ]
    players = (policy, RandomActing(spec, device))
    ended = play_seated(venv, players, sides, schedule, device, seed=seed)
    played = [schedule[game].index(0) for game, _ in ended]
    order = np.argsort(played, kind="stable")  # side by side, each side's episodes in the order played
    kept = np.stack([episode.agent_returns for _, episode in ended])
    return VersusResult(mode, sides, tuple(spec.agents), np.array(played)[order], kept[order])


class PeriodicEvaluationVsRandom(PeriodicEvaluation):
    """The periodic evaluation, and at each of its evaluations the policy's scores against random opponents."""

    def __init__(
        self,
        config: ExperimentConfig,
        venv: VectorEnv,
        model: TeamModel,
        device: torch.device,
        *,
        scores: Sequence[PolicyScore] = (),
    ) -> None:
        super().__init__(config, venv, model, device, scores=scores)
        if config.eval.vs_random is None:
            raise ValueError("PeriodicEvaluationVsRandom needs eval.vs_random: seats or teams")
        self.mode, self.teams = config.eval.vs_random, config.eval.teams
        sides_of(
            venv.spec, self.mode, self.teams
        )  # fewer than two sides stops the run before its first update

    def after_update(self, env_steps: int, *, final: bool) -> dict[str, float]:
        """The periodic evaluation's tags, with `eval/vs_random/...` whenever it evaluated."""
        scalars = super().after_update(env_steps, final=final)
        if not scalars:
            return scalars
        policy = PolicyActing(self.model, self.venv.num_envs, self.device, deterministic=True)
        versus = play_vs_random(
            self.venv,
            policy,
            self.device,
            mode=self.mode,
            episodes_per_side=self.episodes,
            seed=self.seed,
            teams=self.teams,
        )
        return {**scalars, **versus.scalars()}


def periodic_evaluation(
    config: ExperimentConfig, venv: VectorEnv, model: TeamModel, device: torch.device
) -> PeriodicEvaluation:
    """The periodic evaluation the config asks for: with scores against random opponents where `eval.vs_random`
    is set, and the policy's NashConv where `eval.nash_conv` settles on."""
    from marl_ppo.eval.exploitability import policy_scores

    scores: list[PolicyScore] = list(policy_scores(config))
    if config.eval.partners:
        from marl_ppo.eval.partners import partner_score

        scores.append(partner_score(config, venv, device))
    if config.eval.vs_random is None:
        return PeriodicEvaluation(config, venv, model, device, scores=scores)
    return PeriodicEvaluationVsRandom(config, venv, model, device, scores=scores)
