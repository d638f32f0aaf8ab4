"""The `eval` section: deterministic evaluations during training, and the scores against random play."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from marl_ppo.config.base import STRICT, PositiveInt


@dataclass(frozen=True, config=STRICT)
class EvalConfig:
    """Periodic evaluation of the policy during training, and what `marl-ppo eval` scores besides returns."""

    every: Annotated[int, Field(ge=0)] | None = None
    """Evaluate the policy deterministically every this many env steps (at the first update that reaches
    each multiple, and at the end), logged under `eval/`; 0 or null disables."""
    episodes: PositiveInt = 10
    """Episodes per periodic evaluation, on their own env copies seeded apart from training's."""
    absolute: Annotated[int, Field(ge=0)] = 10
    """The evaluation protocol's absolute metric: with `every`, the best evaluated policy (kept as
    `checkpoints/best.pt`) plays this many times `episodes` fresh deterministic episodes at the end of
    the run, written to `absolute_metric.json` and logged as `eval/absolute_team_return`; 0: none."""
    vs_random: Literal["seats", "teams"] | None = None
    """Also score the policy against a uniformly random opponent at each evaluation (periodic, logged
    under `eval/vs_random/`, and `marl-ppo eval`, in eval.json). `seats`: every agent is a player of a
    game (classic games); the policy plays each seat in turn for `episodes` episodes against random
    moves, scored as win, draw and loss rates (a win: its return above every other seat's). `teams`:
    agents form teams by their names without the trailing number (simple_tag's adversary and agent,
    battle's red and blue); the policy plays each team in turn, scored as that team's return and its
    random opponents'. null: no such score."""
    nash_conv: Literal["auto", True, False] = "auto"
    """Also compute the policy's exploitability (NashConv, by OpenSpiel: 0 at a Nash equilibrium) at each
    evaluation: periodic ones log `eval/nash_conv`, `marl-ppo eval` writes `nash_conv` in eval.json. Only
    for games OpenSpiel solves exactly (classic/kuhn_poker, classic/leduc_poker) and a feed-forward
    actor. auto: on wherever it can be computed; true: on, and a run where it cannot is refused."""
    teams: dict[str, list[str]] | None = None
    """The sides of `vs_random: teams` where agents' names do not tell them apart: `{team: [name,
    ...]}`, each name an agent (`alice_0`) or agents' name without the trailing number (`alice`), every
    agent on exactly one team (simple_crypto: `{speakers: [alice, bob], eavesdropper: [eve]}`). null:
    teams by the agents' names without the trailing number."""

    partners: dict[str, str] | None = None
    """Also evaluate the policy with partners on some seats at each periodic evaluation, logged under
    `eval/partners/`: `{seat: partner}`, a seat being an agent (`agent_1`) or agents' name without the
    trailing number, a partner a run directory, a checkpoint, `random`, `scripted/NAME` or a scripted
    policy `package.module:callable` / `path/to/file.py:callable` (docs/partners.md); the policy plays
    every other seat. The same as `marl-ppo eval RUN --partner SEAT=PARTNER`. null: none."""

    def __post_init__(self) -> None:
        if self.partners is not None and any(
            not seat or not partner for seat, partner in self.partners.items()
        ):
            raise ValueError(
                "eval.partners maps seats to partners: {agent_1: random}; a seat or partner is empty"
            )
        if self.teams is not None and self.vs_random != "teams":
            raise ValueError(
                "eval.teams names the sides of eval.vs_random: teams; set eval.vs_random: teams, or drop eval.teams"
            )
