"""Head to head: the final policies of two groups of runs, each pair on both seats, with a 95% CI.

Pairs run i of the first group with run i of the second (seeds 0, 1, 2 of two configurations), plays
`episodes` games with the first on each seat (sampled actions, as ratings play), and reports the
first group's score (a win 1, a draw 1/2) per pair and per seat, with a Wilson interval of the win
rate over all games.

    python docs/examples/head_to_head.py EPISODES "runs/c4_league_s*" "runs/c4_naive_s*"

For sides that are not alike (simple_tag's adversaries and runner), `--sides teams --score roles`
plays duplicate games (`league.match.play_duplicate`): on each side, the first player's return
against the second's from the same starts; a win is the higher return on the same side.

    python docs/examples/head_to_head.py 50 "runs/tag_league_s*" "runs/tag_naive_s*" --sides teams --score roles
"""

from __future__ import annotations

import argparse
import glob
import math
from pathlib import Path

import numpy as np

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import build_config
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.eval.evaluate import eval_config
from marl_ppo.eval.from_checkpoint import load_policy
from marl_ppo.eval.players import policy_player
from marl_ppo.eval.versus import sides_of
from marl_ppo.league.match import play_duplicate, play_pair
from marl_ppo.plan.settle import plan_eval


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a rate."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def main(episodes: int, first: str, second: str, side_rule: str = "seats", scoring: str = "returns") -> None:
    pairs = list(zip(sorted(glob.glob(first)), sorted(glob.glob(second)), strict=True))
    wins = draws = games = 0
    by_seat: dict[str, list[float]] = {}
    for a, b in pairs:
        payload_a = load_checkpoint(Path(a) / "checkpoints/final.pt")
        payload_b = load_checkpoint(Path(b) / "checkpoints/final.pt")
        config = build_config(payload_a["config"])
        plan = plan_eval(eval_config(config, 2 * episodes))
        spec, device = plan.layout, plan.device
        venv = build_vector_env(plan.config, spec, device)
        model_a = load_policy(payload_a, spec, config, device)
        model_b = load_policy(payload_b, spec, build_config(payload_b["config"]), device)
        sides = sides_of(spec, side_rule)
        play = play_duplicate if scoring == "roles" else play_pair
        played = play(
            venv, device, policy_player("A", model_a), policy_player("B", model_b),
            sides=sides, episodes_per_side=episodes, seed=12345,
        )  # fmt: skip
        venv.close()
        scores = []
        for game in played:
            seat = next(s for s, p in game.players.items() if p == "A").partition("@")[0]
            rank = game.player_ranks()
            points = 1.0 if rank["A"] < rank["B"] else 0.5 if rank["A"] == rank["B"] else 0.0
            by_seat.setdefault(seat, []).append(points)
            scores.append(points)
        wins += sum(s == 1.0 for s in scores)
        draws += sum(s == 0.5 for s in scores)
        games += len(scores)
        print(f"{Path(a).name} vs {Path(b).name}: score {np.mean(scores):.3f} over {len(scores)} games")
    low, high = wilson(wins, games)
    print(
        f"all: win rate {wins / games:.3f} [{low:.3f}, {high:.3f}], draws {draws / games:.3f}, {games} games"
    )
    for seat, scores in by_seat.items():
        print(f"  first group on {seat}: score {np.mean(scores):.3f} over {len(scores)} games")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("episodes", type=int)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--sides", choices=("seats", "teams"), default="seats")
    parser.add_argument("--score", choices=("returns", "roles"), default="returns")
    args = parser.parse_args()
    main(args.episodes, args.first, args.second, args.sides, args.score)
