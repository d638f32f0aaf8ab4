"""`python -m bench.compiled_rollout`: a JaxMARL env's rollout compiled as one `lax.scan` against the
collector's per-step path, one rollout at a time or whole training runs, in one process.

At JaxMARL's IPPO-FF settings on its MPE simple_spread (`ISSUE_SETTINGS`: 16 copies x 128 steps, a
64-wide tanh MLP, a shared actor, an observation critic), on one torch thread, the two paths alternate
and the first compiled call (the compile, or its load from JAX's persistent cache) is timed apart;
medians and ranges over the repeats.

- Rollouts (the default; `--case smax` for SMAX 2s3z's experiment settings): `Collector.collect` (a Python loop of the policy's torch forward,
  `JaxVectorEnv.step` and the buffer's writes) against `CompiledSource.collect` (the weights read into
  JAX, the scan, the records written into the buffer, the episodes accounted), each on env copies
  of its own from the same seed.
- `--train`: whole training runs (`train`) with `rollout.compiled` true and false in turn,
  `--pairs` times, of the MPE settings with 4 epochs of 4 minibatches as JaxMARL's script runs them
  (`--case mpe`) or of SMAX 2s3z's experiment file (`--case smax`: 64 copies, a 128-wide MLP, a
  state critic; no evaluations); each run's env steps per second count from the end of its first
  update (which compiles, or loads from the cache) to its last.
- `--train --learners`: the same training runs, every one on the compiled rollout, with
  `fast.learner` torch and jax in turn (the JAX learner's first update compiles its program too).

    python -m bench.compiled_rollout [--case mpe|smax] [--repeats N]
    python -m bench.compiled_rollout --train [--learners] [--case mpe|smax] [--pairs N] [--updates N]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from marl_ppo.config import ExperimentConfig, load_config
from marl_ppo.envs.factory import build_vector_env, probe_layout
from marl_ppo.envs.jax.runtime import jax_modules
from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.copies import settle_copies
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.compiled import CompiledSource
from marl_ppo.run.loop import train

ISSUE_SETTINGS = [
    # JaxMARL's IPPO-FF settings on its MPE simple_spread: 16 copies x 128 steps, a 64-wide tanh MLP
    "env.id=jaxmarl/mpe_simple_spread_v3",
    "rollout.num_envs=16",
    "rollout.rollout_steps=128",
    "ppo.critic=obs",
    "model.share_actor=true",
    "model.hidden_sizes=[64,64]",
]
TRAINING: dict[str, tuple[Path | None, list[str]]] = {
    # the issue's settings: JaxMARL's IPPO-FF script runs 4 epochs of 4 minibatches
    "mpe": (None, [*ISSUE_SETTINGS, "ppo.train_pi_iters=4", "ppo.num_minibatches=4"]),
    # the experiment file's settings (64 copies x 128 steps, 4 epochs), without its evaluations
    "smax": (Path(__file__).resolve().parents[1] / "experiments/jaxmarl/smax_2s3z.yaml", ["eval.every=null"]),
}
"""The training cases of `--train`: an experiment file (or none) and overrides."""


def _spread(label: str, times: list[float], unit: str) -> str:
    unit = f" {unit}" if unit else ""
    return f"{label}: {statistics.median(times):,.1f}{unit} ({min(times):,.1f}-{max(times):,.1f})"


def rollouts(case: str, repeats: int) -> None:
    """Time one rollout each way in turn, `repeats` times; print each path's line and their ratio."""
    torch.set_num_threads(1)  # the learner's one thread beside JAX
    config = _case_config(case, True, 1)
    layout = probe_layout(config)
    per_step_env, compiled_env = build_vector_env(config, layout), build_vector_env(config, layout)
    assert isinstance(compiled_env, JaxVectorEnv)
    model = TeamModel(per_step_env.spec, config)
    steps, copies, cpu = config.rollout.rollout_steps, config.rollout.copies, torch.device("cpu")
    collector = Collector(per_step_env, model, cpu)
    compiled = CompiledSource(compiled_env, model, cpu, steps=steps, seed=0)
    collector.start(0)
    compiled.start(0)
    buffers = RolloutBuffer(per_step_env.spec, steps, copies), RolloutBuffer(per_step_env.spec, steps, copies)
    start = time.perf_counter()
    compiled.collect(buffers[1])
    compile_s = time.perf_counter() - start
    per_step: list[float] = []
    scanned: list[float] = []
    for _ in range(repeats):
        for source, buffer, times in ((collector, buffers[0], per_step), (compiled, buffers[1], scanned)):
            buffer.reset()
            start = time.perf_counter()
            source.collect(buffer)
            times.append(time.perf_counter() - start)
    env_steps = steps * copies
    for label, times in (("per-step collector", per_step), ("compiled source", scanned)):
        rates = [env_steps / t for t in times]
        print(
            f"{_spread(f'{label:>18}', [t * 1e3 for t in times], 'ms per rollout')}, "
            f"{statistics.median(rates):,.0f} env steps/s"
        )
    ratios = [a / b for a, b in zip(per_step, scanned, strict=True)]
    print(f"{_spread('ratio', ratios, '')}; first compiled call (compile or cache load) {compile_s:.2f} s")


def _load() -> str:
    """The 1-, 5- and 15-minute load averages, as `uptime` shows them."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _case_config(case: str, compiled: bool, updates: int, learner: str = "torch") -> ExperimentConfig:
    """The training case's config for `updates` updates, its rollouts compiled or per step, updated by
    `learner` (`fast.learner`)."""
    experiment, overrides = TRAINING[case]
    switches = [f"rollout.compiled={str(compiled).lower()}", f"fast.learner={learner}"]
    config = settle_copies(load_config(experiment, [*overrides, *switches, "log.progress=false"]))
    return dataclasses.replace(config, total_steps=updates * _batch(config))


def _batch(config: ExperimentConfig) -> int:
    """Env steps per update of a settled config."""
    return config.rollout.rollout_steps * config.rollout.copies


def timed_run(config: ExperimentConfig, run_dir: Path) -> tuple[float, float, float]:
    """One training run: its env steps/s after its first update, the seconds to the end of that
    update (the compile, or its load from the cache, included), and the learner's share of the run."""
    per_update = _batch(config)
    updates = config.total_steps // per_update
    marks: list[float] = []
    start = time.perf_counter()
    result = train(config, run_dir, on_update=lambda _: marks.append(time.perf_counter()))
    learn_share = result.timing["learn_s"] / (marks[-1] - start)
    return (updates - 1) * per_update / (marks[-1] - marks[0]), marks[0] - start, learn_share


SIDES: dict[bool, tuple[tuple[str, bool, str], ...]] = {
    False: (("compiled", True, "torch"), ("per-step", False, "torch")),
    True: (("jax learner", True, "jax"), ("torch learner", True, "torch")),
}
"""`--train`'s two sides, by `--learners`: a label, `rollout.compiled` and `fast.learner`."""


def training(case: str, pairs: int, updates: int, *, learners: bool = False) -> None:
    """Train `pairs` times each way in turn; print each side's env steps/s, their ratio and first
    updates. The sides: compiled rollouts against per-step ones, or with `learners` the JAX learner
    against torch's (both on compiled rollouts)."""
    jax_modules()  # JAX and JaxMARL imported before the first run's clock starts
    load = _load()
    sides = SIDES[learners]
    rates: dict[str, list[float]] = {label: [] for label, _, _ in sides}
    firsts: dict[str, list[float]] = {label: [] for label, _, _ in sides}
    learning: dict[str, list[float]] = {label: [] for label, _, _ in sides}
    with tempfile.TemporaryDirectory() as folder:
        for pair in range(pairs):
            for label, compiled, learner in sides:
                config = _case_config(case, compiled, updates, learner)
                run_dir = Path(folder) / f"{pair}_{label.replace(' ', '_')}"
                sps, first, learn_share = timed_run(config, run_dir)
                rates[label].append(sps)
                firsts[label].append(first)
                learning[label].append(100 * learn_share)
    batch = _batch(_case_config(case, True, updates))
    print(
        f"{case}: training {updates} updates of {batch} env steps, {pairs} alternated pairs; load {load} before, "
        f"{_load()} after"
    )
    for label, _, _ in sides:
        print(
            f"{_spread(f'{label:>13}', rates[label], 'env steps/s')} after the first update; "
            f"{_spread('first update', firsts[label], 's')}; {_spread('learner', learning[label], '%')}"
        )
    (one, _, _), (other, _, _) = sides
    ratios = [a / b for a, b in zip(rates[one], rates[other], strict=True)]
    print(_spread(f"ratio {one}/{other}", ratios, ""))


def main(argv: list[str] | None = None) -> None:
    """Rollouts, or with `--train` training runs, both ways in turn."""
    parser = argparse.ArgumentParser(prog="python -m bench.compiled_rollout")
    parser.add_argument("--repeats", type=int, default=7, help="rollouts each way")
    parser.add_argument("--train", action="store_true", help="time whole training runs instead")
    parser.add_argument("--pairs", type=int, default=3, help="training runs each way (--train)")
    parser.add_argument("--updates", type=int, default=8, help="updates per training run (--train)")
    parser.add_argument(
        "--learners", action="store_true", help="--train: fast.learner jax against torch, both compiled"
    )
    parser.add_argument("--case", choices=sorted(TRAINING), default="mpe", help="the settings: mpe or smax")
    args = parser.parse_args(argv)
    if args.train:
        training(args.case, args.pairs, args.updates, learners=args.learners)
    else:
        rollouts(args.case, args.repeats)


if __name__ == "__main__":
    main()
