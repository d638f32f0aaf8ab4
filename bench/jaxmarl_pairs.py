"""`python -m bench.jaxmarl_pairs`: JaxMARL's own training scripts against marl_ppo at their settings.

JaxMARL's baselines compile the whole training (rollout and update) into one JAX program. These
cases run two of them from a JaxMARL checkout the user names, with a Python the user names (one
that has `jaxmarl[algs]`: the scripts need hydra-core, omegaconf, distrax, optax and wandb), through
`peer_jaxmarl_train.py`, which imports the script's `make_train` and times its compile and its run
apart. The scripts are never copied here nor a dependency of marl_ppo; without a checkout the cases
print one line saying how to enable them and are skipped.

- `jaxmarl_ippo_mpe`: `baselines/IPPO/ippo_ff_mpe.py` with its config (MPE simple_spread, 16 copies
  x 128 steps, 4 epochs x 4 minibatches, 64-wide tanh MLP) against marl_ppo's
  `jaxmarl/mpe_simple_spread_v3` at the same settings, network and logging on the compiled rollout
  and the JAX learner (`fast.learner=jax`).
- `jaxmarl_mappo_smax`: `baselines/MAPPO/mappo_rnn_smax.py` with its config (SMAX 2s3z, 128 copies x
  128 steps, 4 epochs x 4 minibatches, a 128-wide layer and a GRU of 128) against marl_ppo's SMAX
  2s3z experiment at 128 copies x 128 steps, feed-forward (128x128 MLP): not the same network.
- `jaxmarl_mappo_smax_gru`: the same script against marl_ppo's SMAX 2s3z with the script's network
  family: a 128-wide layer, a GRU of 128 and a linear head for actor and critic (the script has one
  more 128-wide layer after its GRU), trained on whole 128-step sequences as the script trains, on the
  compiled rollout.

Each repeat runs both sides once as processes of their own, marl_ppo first in odd repeats (the
first, the third). Both count parallel env steps (every agent acts once). JaxMARL's side: env
steps of the run over the compiled call's time, the compile timed apart. marl_ppo's side: env
steps after its first update over the time from that update's end to the last's (the first update
compiles the rollout's scan, or loads it from JAX's persistent cache), and the learner's share of
that time.

`--learner torch|jax` trains marl_ppo's side of every case with that `fast.learner` (by default the
MPE case's is jax, the update compiled too; the SMAX cases', whose GRU the JAX learner does not
cover, torch).

    python -m bench.jaxmarl_pairs --jaxmarl-repo PATH --jaxmarl-python PY [--pairs N] [--only NAME ...]
        [--learner torch|jax]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.peers import RESULT_PREFIX, PeerResult, PeerUnavailable, parse_result

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WRAPPER = HERE / "peer_jaxmarl_train.py"
REPO_VARIABLE = "MARL_PPO_JAXMARL_REPO"
PYTHON_VARIABLE = "MARL_PPO_JAXMARL_PYTHON"
ENABLE = (
    f"no JaxMARL checkout named: pass --jaxmarl-repo PATH (or set {REPO_VARIABLE}) and "
    f"--jaxmarl-python PY (or {PYTHON_VARIABLE}), a Python with 'jaxmarl[algs]'; see docs/benchmarks.md"
)
"""The one line a skipped case prints."""


@dataclass(frozen=True)
class JaxmarlSource:
    """Where JaxMARL's scripts are read from and the Python that runs them."""

    repo: Path
    python: str


def jaxmarl_source(repo: str | None, python: str | None) -> JaxmarlSource:
    """The checkout and Python named by the options, else by the environment; `PeerUnavailable` with
    the line that says how to name them when there is no checkout."""
    repo = repo or os.environ.get(REPO_VARIABLE)
    if not repo:
        raise PeerUnavailable(ENABLE)
    if not (Path(repo) / "baselines").is_dir():
        raise PeerUnavailable(f"{repo} is not a JaxMARL checkout (no baselines/ folder); {ENABLE}")
    return JaxmarlSource(Path(repo), python or os.environ.get(PYTHON_VARIABLE) or sys.executable)


@dataclass
class JaxmarlCase:
    """One JaxMARL script at its config against marl_ppo at the same settings."""

    name: str
    script: str
    config: str
    """The script and its config file, inside the checkout."""
    experiment: Path | None
    overrides: list[str]
    agents: int
    updates: int
    """Updates of a run, both sides; marl_ppo's rate counts all but its first."""
    learner: str = "torch"
    """marl_ppo's `fast.learner`."""
    ours: list[PeerResult] = field(default_factory=list)
    """marl_ppo's runs: env steps after the first update, their seconds, the first update's seconds."""
    learn_shares: list[float] = field(default_factory=list)
    theirs: list[PeerResult] = field(default_factory=list)
    unavailable: str | None = None

    def ratios(self) -> list[float]:
        """marl_ppo's env steps/s over JaxMARL's, pair by pair."""
        return [ours.sps / theirs.sps for ours, theirs in zip(self.ours, self.theirs, strict=True)]


MPE_SETTINGS = [
    "env.id=jaxmarl/mpe_simple_spread_v3",
    "rollout.num_envs=16",
    "rollout.rollout_steps=128",
    "ppo.critic=obs",
    "model.share_actor=true",
    "model.hidden_sizes=[64,64]",
    "ppo.train_pi_iters=4",
    "ppo.train_vf_iters=4",
    "ppo.num_minibatches=4",
    "ppo.target_kl=null",
    "model.input_layer_norm=false",
    "ppo.update_stats=minibatches",
    "log.episodes=update",
]
"""ippo_ff_mpe.yaml's settings as marl_ppo's overrides: its critic sees each agent's observation, and
actor and critic take 4 epochs of 4 minibatches with no early stop (one loss, as the script's). The
script's networks read the observation as it is (no input LayerNorm), and it logs the update's means:
the losses, KL, entropy and clip fraction of its minibatch steps (`ppo.update_stats: minibatches`)
and the episodes' returns (`log.episodes: update`)."""

SMAX_SETTINGS = [
    "rollout.num_envs=128",
    "rollout.rollout_steps=128",
    "ppo.train_pi_iters=4",
    "ppo.train_vf_iters=4",
    "ppo.num_minibatches=4",
    "ppo.target_kl=null",
    "eval.every=null",
]
"""mappo_homogenous_rnn_smax.yaml's batch and epochs over the SMAX 2s3z experiment (state critic)."""

SMAX_GRU_SETTINGS = [
    *SMAX_SETTINGS,
    "model.hidden_sizes=[128]",
    "model.recurrent=gru",
    "model.recurrent_size=128",
    "ppo.chunk_length=null",
]
"""The same with the script's network family: FC_DIM_SIZE 128, GRU_HIDDEN_DIM 128, whole sequences."""


def cases(mpe_updates: int = 100, smax_updates: int = 3) -> list[JaxmarlCase]:
    """The cases; `*_updates` sizes their runs."""
    return [
        JaxmarlCase(
            "jaxmarl_ippo_mpe",
            "baselines/IPPO/ippo_ff_mpe.py",
            "baselines/IPPO/config/ippo_ff_mpe.yaml",
            None,
            MPE_SETTINGS,
            3,
            mpe_updates,
            learner="jax",
        ),
        JaxmarlCase(
            "jaxmarl_mappo_smax",
            "baselines/MAPPO/mappo_rnn_smax.py",
            "baselines/MAPPO/config/mappo_homogenous_rnn_smax.yaml",
            ROOT / "experiments" / "jaxmarl" / "smax_2s3z.yaml",
            SMAX_SETTINGS,
            5,
            smax_updates,
        ),
        JaxmarlCase(
            "jaxmarl_mappo_smax_gru",
            "baselines/MAPPO/mappo_rnn_smax.py",
            "baselines/MAPPO/config/mappo_homogenous_rnn_smax.yaml",
            ROOT / "experiments" / "jaxmarl" / "smax_2s3z.yaml",
            SMAX_GRU_SETTINGS,
            5,
            smax_updates,
        ),
    ]


def _by_name(name: str, updates: int) -> JaxmarlCase:
    found = {case.name: case for case in cases()}
    if name not in found:
        raise SystemExit(f"unknown case {name!r}: expected one of {', '.join(found)}")
    return dataclasses.replace(found[name], updates=updates)


def batch_of(case: JaxmarlCase) -> int:
    """Env steps per update: the copies times the rollout's steps the overrides set."""
    values = dict(override.split("=", 1) for override in case.overrides)
    return int(values["rollout.num_envs"]) * int(values["rollout.rollout_steps"])


def our_record(env_steps: int, seconds: float, agents: int, first: float, learn_share: float) -> str:
    """marl_ppo's side's result line: the env steps after its first update and their seconds."""
    record = {
        "env_steps": env_steps,
        "seconds": seconds,
        "agents": agents,
        "compile_seconds": first,
        "learn_share": learn_share,
    }
    return RESULT_PREFIX + json.dumps(record)


def train_ours(name: str, updates: int, learner: str = "torch") -> str:
    """Train marl_ppo on the case's settings in this process; its result line."""
    from bench.compiled_rollout import timed_run
    from marl_ppo.config import load_config
    from marl_ppo.envs.jax.runtime import jax_modules
    from marl_ppo.plan.copies import settle_copies

    case = _by_name(name, updates)
    if updates < 2:
        raise SystemExit(f"--updates {updates}: marl_ppo's side needs at least 2 (its rate skips the first)")
    jax_modules()  # JAX and JaxMARL imported before the clock starts, as the peer's wrapper does
    overrides = [*case.overrides, f"total_steps={updates * batch_of(case)}", "log.progress=false"]
    overrides.append(f"fast.learner={learner}")
    config = settle_copies(load_config(case.experiment, overrides))
    with tempfile.TemporaryDirectory() as folder:
        sps, first, run_share = timed_run(config, Path(folder) / "run")
    env_steps = (updates - 1) * batch_of(case)
    seconds = env_steps / sps
    return our_record(env_steps, seconds, case.agents, first, after_first(run_share, first, seconds, updates))


def after_first(run_share: float, first: float, seconds: float, updates: int) -> float:
    """The learner's share of the time after the first update, from its share of the whole run (the
    first update's compile included): every update's learning counted as the same (torch compiles
    nothing)."""
    learn_s = run_share * (first + seconds)
    return learn_s * (updates - 1) / updates / seconds


def _run(command: list[str], what: str, env: dict[str, str] | None = None) -> str:
    """The stdout of `command`; `PeerUnavailable` naming its last error line when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PeerUnavailable(f"{what} failed (exit {done.returncode}): {last}")
    return done.stdout


def run_ours(case: JaxmarlCase) -> tuple[PeerResult, float]:
    """marl_ppo's side in a process of its own: its result and the learner's share after its first update."""
    command = [
        sys.executable,
        "-m",
        "bench.jaxmarl_pairs",
        "--ours",
        case.name,
        "--updates",
        str(case.updates),
        "--learner",
        case.learner,
    ]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    output = _run(command, f"marl_ppo's side of {case.name}", {"PYTHONPATH": path})
    return parse_result(output), learn_share(output)


def learn_share(output: str) -> float:
    """The learner's share after the first update, from marl_ppo's side's result line."""
    line = [text for text in output.splitlines() if text.startswith(RESULT_PREFIX)][-1]
    return float(json.loads(line[len(RESULT_PREFIX) :])["learn_share"])


def run_theirs(case: JaxmarlCase, source: JaxmarlSource) -> PeerResult:
    """JaxMARL's script through the wrapper, with the user's Python, wandb off."""
    command = [source.python, str(WRAPPER), "--repo", str(source.repo), "--script", case.script]
    command += ["--config", case.config, "--total-timesteps", str(case.updates * batch_of(case))]
    output = _run(command, f"JaxMARL's {case.script}", {"WANDB_MODE": "disabled"})
    try:
        return parse_result(output)
    except (ValueError, KeyError) as error:
        raise PeerUnavailable(f"JaxMARL's {case.script} printed no result ({error})") from None


def run_pair(case: JaxmarlCase, repeat: int, source: JaxmarlSource | str) -> str:
    """Both sides once, marl_ppo first when `repeat` (from 0) is even; the pair's line, or why it skipped."""
    if isinstance(source, str):
        case.unavailable = source
    if case.unavailable is not None:
        return f"{case.name}: skipped, {case.unavailable}"
    assert not isinstance(source, str)
    ours_first = repeat % 2 == 0
    try:
        if ours_first:
            ours, share = run_ours(case)
        theirs = run_theirs(case, source)
        if not ours_first:
            ours, share = run_ours(case)
    except PeerUnavailable as error:
        case.unavailable = str(error)
        return f"{case.name}: skipped, {error}"
    case.ours.append(ours)
    case.learn_shares.append(share)
    case.theirs.append(theirs)
    return (
        f"{case.name}: marl_ppo {ours.sps:,.0f} env steps/s (first update {ours.compile_seconds:.1f} s, "
        f"learner {100 * share:.0f}%), JaxMARL {theirs.sps:,.0f} (compile {theirs.compile_seconds:.1f} s), "
        f"ratio {case.ratios()[-1]:.2f} ({'marl_ppo' if ours_first else 'JaxMARL'} ran first)"
    )


def _spread(values: list[float], digits: int = 0) -> str:
    """`median (low-high)` of the values."""
    ordered = sorted(values)
    middle = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    return f"{middle:,.{digits}f} ({ordered[0]:,.{digits}f}-{ordered[-1]:,.{digits}f})"


def report(done: list[JaxmarlCase]) -> str:
    """Each case's medians and ranges: both sides' env steps/s, the ratio, compile and learner share."""
    lines = [
        f"{'case':20s} {'marl_ppo env steps/s':>24s} {'JaxMARL env steps/s':>24s} {'ratio':>17s} "
        f"{'pairs':>5s} {'first update s':>15s} {'compile s':>15s} {'learner %':>12s}"
    ]
    for case in done:
        if not case.ours:
            lines.append(f"{case.name:20s} skipped: {case.unavailable}")
            continue
        firsts = [result.compile_seconds or 0.0 for result in case.ours]
        compiles = [result.compile_seconds or 0.0 for result in case.theirs]
        lines.append(
            f"{case.name:20s} {_spread([r.sps for r in case.ours]):>24s} "
            f"{_spread([r.sps for r in case.theirs]):>24s} {_spread(case.ratios(), 2):>17s} "
            f"{len(case.ours):5d} {_spread(firsts, 1):>15s} {_spread(compiles, 1):>15s} "
            f"{_spread([100 * s for s in case.learn_shares]):>12s}"
        )
    return "\n".join(lines)


def load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """Run the chosen cases `--pairs` times, alternated, and print their table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.jaxmarl_pairs", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--jaxmarl-repo", help=f"a JaxMARL checkout (else ${REPO_VARIABLE})")
    parser.add_argument(
        "--jaxmarl-python", help=f"the Python that runs its scripts (else ${PYTHON_VARIABLE})"
    )
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--mpe-updates", type=int, default=100, help="updates of each MPE run, both sides")
    parser.add_argument("--smax-updates", type=int, default=3, help="updates of each SMAX run, both sides")
    parser.add_argument("--only", nargs="*", help="cases whose name contains one of these words")
    parser.add_argument(
        "--learner",
        choices=("torch", "jax"),
        help="marl_ppo's fast.learner in every case (default: the MPE case's jax, the SMAX cases' torch)",
    )
    parser.add_argument("--ours", help=argparse.SUPPRESS)  # marl_ppo's side of a case, in its own process
    parser.add_argument("--updates", type=int, default=2, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.ours:
        print(train_ours(options.ours, options.updates, options.learner or "torch"), flush=True)
        return 0
    chosen = [
        dataclasses.replace(case, learner=options.learner or case.learner)
        for case in cases(options.mpe_updates, options.smax_updates)
        if not options.only or any(word in case.name for word in options.only)
    ]
    try:
        source: JaxmarlSource | str = jaxmarl_source(options.jaxmarl_repo, options.jaxmarl_python)
    except PeerUnavailable as error:
        source = str(error)
    print(f"load {load()} before", flush=True)
    for repeat in range(options.pairs):
        for case in chosen:
            print(f"[{repeat + 1}/{options.pairs}] {run_pair(case, repeat, source)}", flush=True)
    print(f"load {load()} after")
    print(report(chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
