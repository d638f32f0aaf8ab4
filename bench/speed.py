"""`make bench`: env steps per second of full training against the raw env, measured in one run.

For each case the raw env is stepped alone (random actions drawn beforehand, one process) just
before and just after a training run, which runs as a separate process; this repeats several times.
The script prints medians, the ratio of each training run to the raw rate around it (median and
range), the training's timing split (env stepping, acting, learning) and its peak RSS. Last, the
learner cases (`bench/learner.py`): one PPO update's time per minibatch step against its matrix
products' time, in this process.

    python -m bench.speed [--repeats N] [--steps N] [--only NAME ...] [--device cpu|cuda]

The peer cases (`bench/pairs.py`) run marl_ppo and another framework at the same settings
in turn and print the ratio of their env steps/s; each peer runs in a venv of its own (`peers.py`).
The JaxMARL cases (`bench/jaxmarl_pairs.py`) run JaxMARL's own training scripts from a checkout
named by `--jaxmarl-repo` (skipped without one) against marl_ppo at their settings.

On a machine with a GPU, `python -m bench.speed --only vmas --device cuda` is the GPU check: the
VMAS simulator, the rollout buffer and the learner all on the GPU, with 8,192 and 32,768 copies too.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench import jaxmarl_pairs, learner
from bench.jaxmarl_pairs import JaxmarlCase, JaxmarlSource, jaxmarl_source
from bench.pairs import PeerCase, median, peer_cases, peer_report, run_pair
from bench.peers import PeerUnavailable
from marl_ppo.run.rundir import read_summary

ROOT = Path(__file__).resolve().parents[1]
SPREAD_YAML = ROOT / "experiments" / "mpe" / "simple_spread.yaml"
NAVIGATION_YAML = ROOT / "experiments" / "vmas" / "navigation.yaml"
SMAX_YAML = ROOT / "experiments" / "jaxmarl" / "smax_2s3z.yaml"
HALFCHEETAH_YAML = ROOT / "experiments" / "mamujoco" / "halfcheetah_2x3.yaml"
SPREAD_KWARGS = {"N": 3, "max_cycles": 25, "continuous_actions": False}
"""The default experiment's env.kwargs, for the raw-env baseline."""


def raw_pettingzoo_sps(env_id: str, kwargs: dict[str, Any], seconds: float = 4.0, seed: int = 0) -> float:
    """Env steps/s of one env copy in this process, stepped as its factory ships it, with random actions
    drawn beforehand."""
    from marl_ppo.envs.registry import make_env

    env = make_env(env_id, **kwargs)
    env.reset(seed=seed)
    agents = list(env.possible_agents)
    for agent in agents:
        env.action_space(agent).seed(seed)
    pool = [{a: env.action_space(a).sample() for a in agents} for _ in range(1000)]
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for actions in pool:
            env.step({a: actions[a] for a in env.agents})
            steps += 1
            if not env.agents:
                env.reset()
    return steps / (time.perf_counter() - started)


def raw_vmas_sps(
    scenario: str, num_envs: int, kwargs: dict[str, Any], seconds: float = 4.0, device: str = "cpu"
) -> float:
    """Env steps/s (vector steps x copies) of a batched VMAS simulator with pre-drawn random actions."""
    import torch

    from marl_ppo.envs.factory import usable_cores
    from marl_ppo.envs.families import make_vmas

    torch.set_num_threads(usable_cores())  # as training does with a batched simulator (torch_threads: auto)
    env = make_vmas(scenario, num_envs=num_envs, device=device, seed=0, **kwargs)
    env.reset()
    names = [agent.name for agent in env.agents]
    pool = [{n: torch.rand(num_envs, 2, device=device) * 2 - 1 for n in names} for _ in range(50)]
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for actions in pool:
            _, _, terminated, truncated, _ = env.step(actions)
            finished = torch.nonzero(terminated | truncated).flatten().tolist()
            if len(finished) == num_envs:
                env.reset()
            else:
                for index in finished:
                    env.reset_at(index)
            steps += num_envs
    return steps / (time.perf_counter() - started)


def raw_jax_sps(name: str, num_envs: int, seconds: float = 4.0) -> float:
    """Env steps/s (vector steps x copies) of a JaxMARL env as its own API steps it: `jit(vmap(step))`
    (JaxMARL's auto-reset included) from a Python loop, random actions drawn beforehand."""
    import torch

    from marl_ppo.envs.jax.families import jaxmarl_families
    from marl_ppo.envs.jax.runtime import jax_modules

    jax, _ = jax_modules()
    torch.set_num_threads(1)  # as training does beside JAX (the family registers own_threads)
    env = jaxmarl_families()[name].make()
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    _, state = jax.jit(jax.vmap(env.reset))(keys)
    step = jax.jit(jax.vmap(env.step))
    draws = jax.random.split(jax.random.PRNGKey(1), 50)
    pool = [
        {a: jax.random.randint(k, (num_envs,), 0, env.action_space(a).n) for a in env.agents} for k in draws
    ]
    for actions in pool[:2]:  # compiled before the clock starts (the second call sees step's own outputs)
        _, state, _, _, _ = step(keys, state, actions)
    jax.block_until_ready(state)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for actions in pool:
            _, state, _, _, _ = step(keys, state, actions)
            steps += num_envs
        jax.block_until_ready(state)
    return steps / (time.perf_counter() - started)


def training_run(experiment: Path | None, overrides: list[str]) -> dict[str, Any]:
    """One training run in its own process; returns its summary.json."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "marl_ppo", "train"]
        command += [str(experiment)] if experiment else []
        command += [*overrides, "log.progress=false", "--run-dir", str(run_dir)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(
                f"training run {' '.join(command[3:])} failed (exit {done.returncode}): {last}"
            )
        summary = read_summary(run_dir)
        if summary is None:
            raise RuntimeError(f"training run {' '.join(command[3:])} exited 0 without writing its summary")
        return summary


@dataclass
class Case:
    """One line of the benchmark: a raw-env baseline and the training run measured against it."""

    name: str
    raw: Callable[[], float]
    experiment: Path | None
    overrides: list[str]
    agents: int
    results: list[dict[str, Any]] = field(default_factory=list)
    raw_sps: list[tuple[float, float]] = field(default_factory=list)
    """The raw rate measured just before and just after each training run."""

    def ratios(self) -> list[float]:
        """Each training run's rate over the mean of the raw rates measured around it."""
        return [
            r["sps"] / ((before + after) / 2)
            for r, (before, after) in zip(self.results, self.raw_sps, strict=True)
        ]


def cases(steps: int, device: str = "cpu") -> list[Case]:
    """The benchmark's cases; `steps` sizes the simple_spread training runs.

    The MAgent2 battles (4, 28 and 288 agents) show how the cost per agent-step scales with the team.
    `device` is where the VMAS simulator and the learner run (`cuda` on a machine with a GPU).
    """
    raw_spread = functools.partial(raw_pettingzoo_sps, "mpe2/simple_spread_v3", SPREAD_KWARGS)
    spread_runs = {  # name: how the 32 env copies are stepped and who acts
        "spread sync": ["rollout.vector=sync"],
        "spread 2 env procs": ["rollout.vector=subprocess", "rollout.num_workers=2"],
        "spread 1 worker": ["rollout.vector=workers", "rollout.num_workers=1", "rollout.policy_lag=0"],
        "spread 2 workers": ["rollout.vector=workers", "rollout.num_workers=2", "rollout.policy_lag=0"],
        "spread 2 workers lag": ["rollout.vector=workers", "rollout.num_workers=2", "rollout.policy_lag=1"],
        # recurrent actors and critic (GRU): one cell step per env step, chunks of 10 steps to learn on
        "spread gru sync": ["rollout.vector=sync", "model.recurrent=gru"],
        "spread gru 2 workers": [
            "rollout.vector=workers",
            "rollout.num_workers=2",
            "rollout.policy_lag=0",
            "model.recurrent=gru",
        ],
        # the same two workers as Ray actors of a Ray instance the run starts (its start-up not timed)
        "spread 2 ray workers": ["rollout.vector=ray", "rollout.num_workers=2", "rollout.policy_lag=0"],
    }
    return [
        *(
            Case(name, raw_spread, SPREAD_YAML, [*overrides, f"total_steps={steps}"], 3)
            for name, overrides in spread_runs.items()
        ),
        *(
            Case(
                name,
                functools.partial(raw_vmas_sps, "navigation", num_envs, {"max_steps": 100}, device=device),
                NAVIGATION_YAML,
                [
                    f"rollout.num_envs={num_envs}",
                    f"total_steps={num_envs * 100 * updates}",
                    f"host.device={device}",
                    *ppo,
                ],
                4,
            )
            for name, num_envs, updates, ppo in (
                ("vmas nav 64", 64, 30, []),
                ("vmas nav 1024", 1024, 8, []),  # the experiment: 4 epochs of 4 minibatches
                # the learner's share sets the ratio: the same with 2 epochs, and with PPO's usual 10
                ("vmas nav 1024 2 ep", 1024, 8, ["ppo.train_pi_iters=2", "ppo.train_vf_iters=2"]),
                ("vmas nav 1024 10 ep", 1024, 4, ["ppo.train_pi_iters=10", "ppo.train_vf_iters=10"]),
                # the experiment's layers are bfloat16 where the hardware has it (model.precision: auto)
                ("vmas nav 1024 fp32", 1024, 8, ["model.precision=fp32"]),
                # on a GPU the simulator pays off with many more copies (3 updates: minutes of a lent machine)
                *(
                    (f"vmas nav {num_envs}", num_envs, 3, [])
                    for num_envs in ((8192, 32768) if device != "cpu" else ())
                ),
            )
        ),
        *(
            Case(
                f"battle {agents} agents",
                functools.partial(raw_pettingzoo_sps, "magent2/battle_v4", {"map_size": size}),
                None,
                [
                    "env.id=magent2/battle_v4",
                    f"env.kwargs={{map_size: {size}}}",
                    "rollout.vector=sync",
                    "rollout.num_envs=2",
                    "rollout.rollout_steps=50",
                    f"total_steps={total}",
                    "model.share_actor=true",
                    "ppo.critic=obs",
                ],
                agents,
            )
            for size, agents, total in ((12, 4, 4000), (23, 28, 800), (62, 288, 400))
        ),
        # the JAX family against JaxMARL's own jit(vmap(step)) loop with as many copies; the learner's
        # share sets the ratio, so the experiment's 4 epochs and 2
        *(
            Case(
                name,
                functools.partial(raw_jax_sps, "smax_2s3z", num_envs),
                SMAX_YAML,
                [
                    f"rollout.num_envs={num_envs}",
                    f"total_steps={num_envs * 128 * 4}",
                    "eval.every=null",
                    *ppo,
                ],
                5,
            )
            for name, num_envs, ppo in (
                ("jax smax 2s3z 64", 64, []),
                ("jax smax 2s3z 64 2 ep", 64, ["ppo.train_pi_iters=2", "ppo.train_vf_iters=2"]),
            )
        ),
        # multi-agent MuJoCo as its experiment runs it (20 copies, rollout workers chosen by `vector:
        # auto`), and with collection overlapping the update (policy lag 1), in one worker, and with
        # `model.precision: auto`; 30 updates, so that a lagged run's one-off first rollout and last
        # update (no update, no rollout beside them) weigh in it as little as the raw env's start does
        *(
            Case(
                name,
                functools.partial(raw_pettingzoo_sps, "mamujoco/HalfCheetah-2x3", {"agent_obsk": 0}),
                HALFCHEETAH_YAML,
                ["total_steps=120000", *overrides],
                2,
            )
            for name, overrides in (
                ("mamujoco cheetah", []),
                ("mamujoco cheetah lag", ["rollout.vector=workers", "rollout.policy_lag=1"]),
                (
                    "mamujoco cheetah lag 1 worker",
                    ["rollout.vector=workers", "rollout.policy_lag=1", "rollout.num_workers=1"],
                ),
                # bfloat16 layers where the CPU has bfloat16 instructions (float32 elsewhere)
                (
                    "mamujoco cheetah lag 1 worker auto",
                    [
                        "rollout.vector=workers",
                        "rollout.policy_lag=1",
                        "rollout.num_workers=1",
                        "model.precision=auto",
                    ],
                ),
            )
        ),
        # image observations through the CNN encoder, frames stored as uint8 (a cheap env: the
        # encoder's and the frames' cost per agent-step)
        Case(
            "pixels 2 agents",
            functools.partial(raw_pettingzoo_sps, "envs/pixel_signal_v0", {}),
            None,
            [
                "env.id=envs/pixel_signal_v0",
                "model.encoder=cnn",
                "rollout.vector=sync",
                "rollout.num_envs=16",
                "rollout.rollout_steps=16",
                "total_steps=4096",
            ],
            2,
        ),
    ]


def report(done: list[Case]) -> str:
    """The table of medians."""
    header = (
        f"{'case':20s} {'raw sps':>9s} {'train sps':>9s} {'ratio':>6s} {'(range)':>11s} {'us/agent-step':>13s} "
        f"{'env %':>6s} {'act %':>6s} {'learn %':>7s} {'peak MiB':>8s}"
    )
    lines = [header]
    for case in done:
        raw = median([value for pair in case.raw_sps for value in pair])
        sps = median([r["sps"] for r in case.results])
        ratios = case.ratios()
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else ""
        shares = {}
        for key in ("env_s", "act_s", "learn_s"):
            shares[key] = median(
                [r[key] / max(r["env_s"] + r["act_s"] + r["learn_s"], 1e-9) for r in case.results]
            )
        per_agent_step = 1e6 / (sps * case.agents) if sps else float("nan")
        lines.append(
            f"{case.name:20s} {raw:9.0f} {sps:9.0f} {median(ratios):6.2f} {spread:>11s} {per_agent_step:13.1f} "
            f"{100 * shares['env_s']:6.1f} {100 * shares['act_s']:6.1f} {100 * shares['learn_s']:7.1f} "
            f"{median([r['peak_rss_mb'] for r in case.results]):8.0f}"
        )
    return "\n".join(lines)


def paired_ratio(done: list[Case], case: str, reference: str) -> str | None:
    """`case` over `reference` in steps/s, per repeat (the two ran one after the other): median and range."""
    found = {c.name: c for c in done}
    if case not in found or reference not in found:
        return None
    ratios = [a["sps"] / b["sps"] for a, b in zip(found[case].results, found[reference].results, strict=True)]
    return (
        f"{case} / {reference}: {median(ratios):.2f} steps/s ratio (range {min(ratios):.2f}-{max(ratios):.2f}, "
        f"{len(ratios)} pairs)"
    )


CaseT = TypeVar("CaseT", Case, PeerCase, JaxmarlCase)


def _chosen(named: list[CaseT], only: list[str] | None) -> list[CaseT]:
    """The cases whose name contains one of the words of `--only` (every case without it)."""
    return [case for case in named if not only or any(word in case.name for word in only)]


def main(argv: list[str] | None = None) -> int:
    """Run every case `--repeats` times, the raw env before and after each training run, and print
    the medians; a case's ratio is the median over its runs of training over the raw rate around it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--steps", type=int, default=48_000, help="env steps of each simple_spread training run"
    )
    parser.add_argument("--only", nargs="*", help="run only cases whose name contains one of these words")
    parser.add_argument("--device", default="cpu", help="device of the VMAS cases: cpu or cuda (GPU check)")
    parser.add_argument(
        "--pistonball-steps",
        type=int,
        default=1024,
        help="env steps of each pistonball_tutorial run, both sides",
    )
    parser.add_argument(
        "--peer-spread-steps",
        type=int,
        default=24_000,
        help="env steps of each spread_benchmarl run, both sides",
    )
    parser.add_argument("--jaxmarl-repo", help="a JaxMARL checkout, for the jaxmarl_* cases")
    parser.add_argument("--jaxmarl-python", help="the Python that runs JaxMARL's scripts (has jaxmarl[algs])")
    options = parser.parse_args(argv)
    selected = _chosen(cases(options.steps, options.device), options.only)
    pairs = _chosen(peer_cases(options.pistonball_steps, options.peer_spread_steps), options.only)
    jax_pairs = _chosen(jaxmarl_pairs.cases(), options.only)
    try:
        source: JaxmarlSource | str = jaxmarl_source(options.jaxmarl_repo, options.jaxmarl_python)
    except PeerUnavailable as error:  # the cases skip, each with this line
        source = str(error)
    for repeat in range(options.repeats):
        for case in selected:
            before = case.raw()
            case.results.append(training_run(case.experiment, case.overrides))
            case.raw_sps.append((before, case.raw()))  # raw on both sides: the machine's speed drifts
            print(
                f"[{repeat + 1}/{options.repeats}] {case.name}: raw {before:.0f} / {case.raw_sps[-1][1]:.0f} "
                f"steps/s (before / after), training {case.results[-1]['sps']:.0f} steps/s, "
                f"ratio {case.ratios()[-1]:.2f}",
                flush=True,
            )
        for pair in pairs:  # marl_ppo and a peer in turn, in another order each repeat
            print(f"[{repeat + 1}/{options.repeats}] {run_pair(pair, repeat, training_run)}", flush=True)
        for jax_pair in jax_pairs:  # JaxMARL's own scripts and marl_ppo in turn
            print(
                f"[{repeat + 1}/{options.repeats}] {jaxmarl_pairs.run_pair(jax_pair, repeat, source)}",
                flush=True,
            )
    print()
    if selected:
        print(report(selected))
    if pairs:
        print(peer_report(pairs))
    if jax_pairs:
        print(jaxmarl_pairs.report(jax_pairs))
    ray_line = paired_ratio(selected, "spread 2 ray workers", "spread 2 workers")
    if ray_line is not None:
        print(ray_line)
    updates = [name for name in learner.CASES if not options.only or any(w in name for w in options.only)]
    if updates:  # one PPO update against its matrix products, in this process (under a minute)
        print()
        print(learner.HEADER)
        for name in updates:
            print(learner.measure(name, learner.REPEATS).line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
