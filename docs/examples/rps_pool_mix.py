"""Rock-paper-scissors: each snapshot's first-move mix, and how far the pool's average is from uniform.

Reads the pools of runs of `experiments/classic/rps_v2.yaml` (with `league.opponents=latest`) and
`rps_v2_league.yaml`. For every snapshot it computes the policy's probabilities of rock, paper and
scissors at the first round of an episode (no move seen yet) in each seat, and the exploitability of
that mix in one round, `max_a sum_b p(b) u(a, b)` (0 for the uniform mix, 1 for a pure one), for the
snapshot alone and for the average of the pool up to it (what fictitious play converges in).

    python docs/examples/rps_pool_mix.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import load_stored_config
from marl_ppo.envs.factory import probe_spec
from marl_ppo.league.pool import pool_files
from marl_ppo.models.team import TeamModel

PAYOFF = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]])  # row's payoff: rock, paper, scissors
NO_MOVE_YET = 3  # rps_v2's observation before the first round


def first_moves(model: TeamModel) -> np.ndarray:
    """`(seats, 3)`: each seat's probabilities of rock, paper and scissors at the first round."""
    actor = model.group("player").actor
    obs = torch.zeros(1, 1, 2, 4)
    obs[..., NO_MOVE_YET] = 1.0
    no_mask = torch.zeros(1, 1, 2, 0, dtype=torch.bool)
    carry = torch.zeros(1, 2, actor.carry_size)
    flags = torch.ones(1, 1, 2, dtype=torch.bool)
    with torch.no_grad():
        dist, _ = actor(obs, no_mask, carry, flags, flags)
        moves = [dist.log_prob(torch.full((1, 1, 2), a)).exp()[0, 0] for a in range(3)]
    return torch.stack(moves, dim=-1).numpy()


def exploitability(mix: np.ndarray) -> float:
    """The best response's expected payoff against `mix` in one round."""
    return float((PAYOFF @ mix).max())


def main(run_dirs: list[str]) -> None:
    for run_dir in map(Path, run_dirs):
        config = load_stored_config(run_dir / "config.yaml")
        spec = probe_spec(config)
        model = TeamModel(spec, config)
        mixes = []
        print(f"{run_dir}: updates, seat 0's mix (R P S), its exploitability, the pool average's")
        for updates, path in pool_files(run_dir).items():
            model.load_state_dict(load_checkpoint(path)["model"])
            mixes.append(first_moves(model))
            own, pooled = mixes[-1], np.mean(mixes, axis=0)
            print(
                f"  u{updates:<5} {np.array2string(own[0], precision=2)} {exploitability(own[0]):.3f} "
                f"{exploitability(pooled[0]):.3f}"
            )
        later = [exploitability(m[0]) for m in mixes[len(mixes) // 2 :]]
        print(
            f"  summary: snapshots of the second half {np.mean(later):.3f} (max {np.max(later):.3f}), "
            f"the whole pool's average {exploitability(np.mean(mixes, axis=0)[0]):.3f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
