"""Evaluation with partners: some seats played by other policies, the rest by the evaluated one.

`marl-ppo eval RUN_DIR --partner SEAT=PARTNER` (and `marl-ppo crossplay`) seat a partner (a player
`eval.players.partner_player` reads: another run, a checkpoint, `random`, a scripted policy) on a
seat: an agent (`player_1`) or every agent of a name without its number (`agent` for `agent_0`,
`agent_1`, ...). The evaluated policy plays every agent no partner sits on. The episodes are seeded
as a self-play evaluation is (`eval.evaluate.play_episodes`): the same seed gives the same env
resets, so a partner's score and the policy's own are read on the same episodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.grouping import agents_named
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.evaluate import EvalError, EvalResult, PolicyScore, episodes_result, eval_seed
from marl_ppo.eval.players import Player, partner_player, policy_player
from marl_ppo.eval.seated import play_seated
from marl_ppo.models.team import TeamModel

OWN = "policy"
"""The side of the agents no partner sits on (the evaluated policy's)."""


def parse_partners(pairs: Sequence[str]) -> dict[str, str]:
    """`SEAT=PARTNER` pairs (`--partner`) as seat -> partner; one line for a malformed or repeated pair."""
    partners: dict[str, str] = {}
    for pair in pairs:
        seat, sep, partner = pair.partition("=")
        if not sep or not seat or not partner:
            raise EvalError(
                f"--partner '{pair}' must be SEAT=PARTNER, e.g. player_1=random or agent_2=runs/other_seed"
            )
        if seat in partners:
            raise EvalError(f"--partner names seat '{seat}' twice; give each seat one partner")
        partners[seat] = partner
    return partners


def partner_sides(spec: TeamSpec, seats: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Side -> its agents: first the evaluated policy's (`OWN`: agents no seat names), then each seat's.

    One line for a seat that names no agent, an agent named by two seats, or no agent left to the policy."""
    sides: dict[str, tuple[str, ...]] = {}
    taken: set[str] = set()
    for seat in seats:
        agents, unknown = agents_named([seat], spec.agents)
        if unknown:
            raise EvalError(
                f"partner seat '{seat}' is not an agent of env '{spec.env_id}' nor a name of its agents "
                f"without the number; its agents are {list(spec.agents)}"
            )
        overlap = taken.intersection(agents)
        if overlap:
            raise EvalError(f"partner seat '{seat}' includes {sorted(overlap)}, already given a partner")
        taken.update(agents)
        sides[seat] = tuple(agents)
    own = tuple(agent for agent in spec.agents if agent not in taken)
    if not own:
        raise EvalError(
            "every agent has a partner, so the evaluated policy plays none; leave it at least one seat"
        )
    return {OWN: own, **sides}


def play_seating(
    venv: VectorEnv,
    device: torch.device,
    players: Sequence[Player],
    sides: Mapping[str, Sequence[str]],
    seating: Sequence[int],
    *,
    episodes: int,
    seed: int,
    deterministic: bool,
) -> EvalResult:
    """`episodes` episodes with `players[seating[k]]` on the k-th of `sides`, seeded and ordered as a
    self-play evaluation (`play_episodes`) with the same seed: env copy by copy, then as played."""
    if len(seating) != len(sides):
        raise ValueError(f"seating {list(seating)} does not name a player for each of the {len(sides)} sides")
    copies = venv.num_envs
    actings = [player.build(venv.spec, copies, device) for player in players]
    schedule = [tuple(seating)] * episodes
    ended = play_seated(venv, actings, sides, schedule, device, seed=seed)
    # game g was copy g % E's (g // E)-th episode: the order play_episodes keeps
    kept = [episode for _, episode in sorted(ended, key=lambda game: (game[0] % copies, game[0] // copies))]
    return episodes_result(venv.spec.agents, kept, seed=seed, deterministic=deterministic)


def partner_score(config: ExperimentConfig, venv: VectorEnv, device: torch.device) -> PolicyScore:
    """`eval/partners/...` at each periodic evaluation: the policy (its mode) with `eval.partners` on
    their seats, on the evaluation's env copies and seed. The partners are loaded now, so a bad seat or
    partner stops the run before its first update."""
    partners = dict(config.eval.partners or {})
    sides = partner_sides(venv.spec, list(partners))
    seated = [
        partner_player(text, venv.spec, device, agents=sides[seat], deterministic=True)
        for seat, text in partners.items()
    ]

    def score(model: TeamModel) -> dict[str, float]:
        result = play_seating(
            venv,
            device,
            [policy_player(OWN, model, deterministic=True), *seated],
            sides,
            range(len(sides)),
            episodes=config.eval.episodes,
            seed=eval_seed(config),
            deterministic=True,
        )
        own = [venv.spec.agents.index(agent) for agent in sides[OWN]]
        scalars = {
            "eval/partners/team_return": float(result.team_returns.mean()),
            "eval/partners/policy_return": float(result.agent_returns[:, own].sum(axis=1).mean()),
        }
        if result.won is not None:
            scalars["eval/partners/win_rate"] = float(result.won.mean())
        return scalars

    return score
