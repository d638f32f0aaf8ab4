"""Our hand-written pieces against the library's own, side by side: `python -m bench.library`.

Each piece of `marl_ppo/fast/` has a `fast.*` switch back to the library piece. On the case where
the piece acts (pistonball for the screen copy, the cue_recall GRU file for the recurrent cell,
HalfCheetah 2x3 for the MaMuJoCo gather), this runs training with ours and with the library's in turn, pair after pair
(ours first in odd pairs, the library's first in even ones, so a drifting machine favours neither),
and reports the medians of the pairs' ratios, library over ours, of the CPU seconds each run took
(its process and its workers; above 1: the library's piece costs more) and of training steps/s
(below 1: the library's is slower). The CPU ratio is the one to trust on a shared machine: other
work slows a run's wall clock more than its CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.speed import NAVIGATION_YAML, ROOT, SPREAD_YAML, training_run

PISTONBALL_YAML = ROOT / "experiments" / "butterfly" / "pistonball_v6.yaml"
CUE_YAML = ROOT / "experiments" / "envs" / "cue_recall.yaml"
HALFCHEETAH_YAML = ROOT / "experiments" / "mamujoco" / "halfcheetah_2x3.yaml"


@dataclass(frozen=True)
class Piece:
    """A hand-written piece and the override that replaces it by the library's."""

    name: str
    library: str
    """The `fast.*` override that switches to the library piece."""
    cases: tuple[str, ...]
    """The benchmark cases where the piece runs at all."""


CASES = ["spread", "vmas", "pistonball", "cue", "halfcheetah"]

PIECES = (
    Piece("screen copy vs the env's own", "fast.screen_copy=false", ("pistonball",)),
    Piece("recurrent cell vs torch's GRUCell", "fast.recurrent_cell=false", ("cue",)),
    Piece("mamujoco gather vs the library's step", "fast.mamujoco_gather=false", ("halfcheetah",)),
)


def case_run(case: str, steps: int, updates: int) -> tuple[Path, list[str]]:
    """The experiment file and overrides of a benchmark case."""
    if case == "spread":
        return SPREAD_YAML, [f"total_steps={steps}"]
    if case == "cue":  # the GRU file, 40 updates of 16 copies x 20 steps
        return CUE_YAML, ["total_steps=12800"]
    if case == "halfcheetah":  # one rollout worker, policy lag 1
        return HALFCHEETAH_YAML, [
            "total_steps=40000",
            "rollout.vector=workers",
            "rollout.num_workers=1",
            "rollout.policy_lag=1",
        ]
    if case == "pistonball":  # 3 updates of 4 copies; one learner thread, as for VMAS
        return PISTONBALL_YAML, ["total_steps=1500", "host.torch_threads=1"]
    # one learner thread: CPU seconds then measure work, not threads spinning while they wait
    return NAVIGATION_YAML, [
        "rollout.num_envs=1024",
        f"total_steps={1024 * 100 * updates}",
        "host.device=cpu",
        "host.torch_threads=1",
    ]


def main(argv: list[str] | None = None) -> int:
    """Pair runs with ours and with the library's piece; print each pair, then the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="pairs of runs per piece and case")
    parser.add_argument("--steps", type=int, default=48_000, help="env steps of each simple_spread run")
    parser.add_argument("--updates", type=int, default=4, help="updates of each VMAS run")
    parser.add_argument("--only", nargs="*", help="pieces whose name contains one of these words")
    parser.add_argument(
        "--cases", nargs="*", default=CASES, choices=CASES, help="cases to run (each piece where it acts)"
    )
    options = parser.parse_args(argv)
    rows = []
    for piece in PIECES:
        if options.only and not any(word in piece.name for word in options.only):
            continue
        for case in (c for c in options.cases if c in piece.cases):
            experiment, overrides = case_run(case, options.steps, options.updates)
            cpu_ratios, sps_ratios = [], []
            for pair in range(options.pairs):
                order = ("ours", "library") if pair % 2 == 0 else ("library", "ours")
                runs = {}
                for which in order:
                    extra = [piece.library] if which == "library" else []
                    runs[which] = training_run(experiment, [*overrides, *extra])
                cpu_ratios.append(runs["library"]["cpu_s"] / runs["ours"]["cpu_s"])
                sps_ratios.append(runs["library"]["sps"] / runs["ours"]["sps"])
                print(
                    f"[{pair + 1}/{options.pairs}] {piece.name}, {case}: CPU s ours {runs['ours']['cpu_s']:.1f}, "
                    f"library {runs['library']['cpu_s']:.1f} (ratio {cpu_ratios[-1]:.3f}); steps/s ours "
                    f"{runs['ours']['sps']:.0f}, library {runs['library']['sps']:.0f} (ratio {sps_ratios[-1]:.3f})",
                    flush=True,
                )
            rows.append((piece.name, case, cpu_ratios, sps_ratios))
    print()
    print(
        f"{'piece':38s} {'case':7s} {'CPU lib/ours':>12s} {'(range)':>13s} {'sps lib/ours':>12s} {'(range)':>13s}"
    )
    for name, case, cpu_ratios, sps_ratios in rows:
        print(
            f"{name:38s} {case:7s} {statistics.median(cpu_ratios):12.3f} "
            f"{min(cpu_ratios):.3f}-{max(cpu_ratios):.3f} {statistics.median(sps_ratios):12.3f} "
            f"{min(sps_ratios):.3f}-{max(sps_ratios):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
