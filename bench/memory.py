"""`make bench-memory`: memory over a long run, to show it stays flat (no growth per update).

Trains a small simple_spread experiment for `--updates` updates (2,000 by default, a few minutes)
and prints the resident memory (RSS) of the trainer, and of its env workers, at update 100, every
`--every` updates, and at the end, with the trainer's peak RSS and the growth per update after 100.

    python -m bench.memory [--updates N] [--every N] [--vector sync|subprocess]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from marl_ppo.config import load_config
from marl_ppo.plan.host import peak_rss_mb, rss_mb
from marl_ppo.run.loop import train

SPREAD_YAML = Path(__file__).resolve().parents[1] / "experiments" / "mpe" / "simple_spread.yaml"
SMALL = [
    "rollout.num_envs=4",
    "rollout.rollout_steps=25",
    "ppo.train_pi_iters=2",
    "ppo.train_vf_iters=2",
    "ppo.num_minibatches=2",
    "model.hidden_sizes=[32,32]",
    "log.progress=false",
]


@dataclass(frozen=True)
class MemorySample:
    """RSS in MiB after one update: the trainer now and at its peak, and each env worker now."""

    update: int
    rss_mb: float
    peak_rss_mb: float
    workers_mb: tuple[float, ...]

    def render(self) -> str:
        """One line of the report."""
        workers = " ".join(f"{w:7.1f}" for w in self.workers_mb) or "-"
        return f"{self.update:7d} {self.rss_mb:9.1f} {self.peak_rss_mb:9.1f}   {workers}"


def child_pids(pid: int | None = None) -> list[int]:
    """Live child processes of `pid` (this process by default), read from /proc (Linux)."""
    parent = os.getpid() if pid is None else pid
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{entry}/stat") as handle:
                state, ppid = handle.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == parent and state != "Z":
            found.append(int(entry))
    return sorted(found)


def measure(updates: int, every: int, vector: str, run_dir: Path) -> list[MemorySample]:
    """Train `updates` updates of the small experiment, sampling memory at 100, every `every`, and the end."""
    config = load_config(SPREAD_YAML, [*SMALL, f"rollout.vector={vector}", f"total_steps={updates * 4 * 25}"])
    samples: list[MemorySample] = []

    def sample(update: int) -> None:
        if update == 100 or update % every == 0 or update == updates:
            workers = tuple(rss_mb(pid) for pid in child_pids())
            samples.append(MemorySample(update, rss_mb(), peak_rss_mb(), workers))
            print(samples[-1].render(), flush=True)

    print(" update    rss MiB  peak MiB   workers' rss MiB", flush=True)
    train(config, run_dir, on_update=sample)
    return samples


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the memory at update 100 and at the end."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2000, help="updates to train (at least 100)")
    parser.add_argument("--every", type=int, default=250, help="also sample every this many updates")
    parser.add_argument("--vector", choices=["sync", "subprocess"], default="subprocess")
    options = parser.parse_args(argv)
    if options.updates < 100:
        parser.error(f"--updates {options.updates} is below 100; the first sample is at update 100")
    with tempfile.TemporaryDirectory(prefix="marl_ppo_bench_memory_") as run_dir:
        samples = measure(options.updates, options.every, options.vector, Path(run_dir))
    first, last = next(s for s in samples if s.update == 100), samples[-1]
    growth_kib = (last.rss_mb - first.rss_mb) * 1024 / max(1, last.update - first.update)
    print(
        f"update {first.update}: rss {first.rss_mb:.1f} MiB, peak {first.peak_rss_mb:.1f} MiB; "
        f"update {last.update}: rss {last.rss_mb:.1f} MiB, peak {last.peak_rss_mb:.1f} MiB; "
        f"growth after update {first.update}: {growth_kib:.2f} KiB per update"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
