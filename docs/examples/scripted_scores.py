"""Two players on an experiment file's env, each named as `--partner` names one: a scripted player
(`scripted/NAME`), `random`, a run directory or a checkpoint, `module:callable`.

On a competitive env (the file's `eval.vs_random` is `seats` or `teams`) the first player meets the
second with each on each side for EPISODES games: the first's win, draw and loss rates per side and
overall, with Wilson 95% intervals. On a cooperative env every agent is a seat: the first player
takes each seat in turn with the second on the others (every seat when both are the same player) for
EPISODES games each: the mean team return with its 95% CI, and the win rate where the env has wins.

    python docs/examples/scripted_scores.py experiments/classic/connect_four_v3.yaml scripted/connect_four random 100
    python docs/examples/scripted_scores.py experiments/classic/hanabi_v5.yaml scripted/hanabi scripted/hanabi 100
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from marl_ppo.config import load_config
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.eval.evaluate import eval_config, mean_ci95
from marl_ppo.eval.partners import play_seating
from marl_ppo.eval.players import partner_player
from marl_ppo.eval.versus import sides_of
from marl_ppo.league.match import play_pair
from marl_ppo.plan.settle import plan_eval

SEED = 12345
SAME = " (2)"
"""The second player's name when both are the same player."""


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a rate."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rates(outcomes: list[str]) -> str:
    """Win, draw and loss rates of `outcomes` ('win', 'draw', 'loss'), each with its Wilson interval."""
    n = len(outcomes)
    parts = []
    for kind in ("win", "draw", "loss"):
        count = outcomes.count(kind)
        low, high = wilson(count, n)
        parts.append(f"{kind} {count / n:.3f} [{low:.3f}, {high:.3f}]")
    return ", ".join(parts) + f" ({n} games)"


def competitive(venv, device, first, second, sides, episodes: int) -> None:
    """The first player's results against the second, per side and overall."""
    games = play_pair(venv, device, first, second, sides=sides, episodes_per_side=episodes, seed=SEED)
    by_side: dict[str, list[str]] = {side: [] for side in sides}
    for game in games:
        side = next(s for s, name in game.players.items() if name == first.name)
        ranks = game.player_ranks()
        mine, theirs = ranks[first.name], ranks[second.name]
        by_side[side].append("win" if mine < theirs else "draw" if mine == theirs else "loss")
    for side, outcomes in by_side.items():
        print(f"{first.name} on {side}: {rates(outcomes)}")
    print(f"{first.name} overall: {rates([o for outcomes in by_side.values() for o in outcomes])}")


def cooperative(venv, device, first, second, agents, episodes: int) -> None:
    """The team's return with the first player on each seat in turn (on all of them when the two are
    the same player)."""
    sides = {agent: (agent,) for agent in agents}
    seatings = (
        [[0] * len(agents)]
        if first.name == second.name.removesuffix(SAME)
        else [[0 if k == seat else 1 for k in range(len(agents))] for seat in range(len(agents))]
    )
    for seating in seatings:
        players = [first, second]
        result = play_seating(
            venv, device, players, sides, seating, episodes=episodes, seed=SEED, deterministic=False
        )
        seated = ", ".join(f"{agent}={players[p].name}" for agent, p in zip(agents, seating, strict=True))
        summary = mean_ci95(result.team_returns)
        low, high = summary["ci95"]
        line = f"{seated}: team return {summary['mean']:.2f} [{low:.2f}, {high:.2f}]"
        line += f", min {result.team_returns.min():.1f}, max {result.team_returns.max():.1f}"
        if result.won is not None:
            won_low, won_high = wilson(result.won.sum(), result.won.size)
            line += f", win rate {result.won.mean():.3f} [{won_low:.3f}, {won_high:.3f}]"
        print(f"{line} ({episodes} episodes)")


def main(experiment: str, first_name: str, second_name: str, episodes: int) -> None:
    config = load_config(Path(experiment))
    plan = plan_eval(eval_config(config, 2 * episodes))
    spec, device = plan.layout, plan.device
    venv = build_vector_env(plan.config, spec, device)
    started = time.perf_counter()
    try:
        first = partner_player(first_name, venv.spec, device)
        # the same player twice is two players on a competitive env, one team on a cooperative one
        second = partner_player(
            second_name, venv.spec, device, name=second_name + SAME if second_name == first_name else None
        )
        mode = config.eval.vs_random
        if mode is None:
            cooperative(venv, device, first, second, list(venv.spec.agents), episodes)
        else:
            competitive(venv, device, first, second, sides_of(venv.spec, mode, config.eval.teams), episodes)
    finally:
        venv.close()
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
