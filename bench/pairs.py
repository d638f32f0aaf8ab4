"""`make bench`'s peer cases: marl_ppo and another framework at the same settings, run in turn.

Each repeat runs both once, one after the other (marl_ppo first in odd repeats, the peer first in
even ones), and takes marl_ppo's env steps/s over the peer's: on a shared machine only neighbouring
runs compare. Both sides count parallel env steps (all agents act once) and leave out their setup:
marl_ppo's `summary.json` times the training loop, the peers' scripts time `learn` or `run`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.peers import BENCHMARL, SB3, Peer, PeerResult, PeerUnavailable, ensure_peer, run_peer

Train = Callable[[Path | None, list[str]], dict[str, Any]]
"""Runs marl_ppo's training on an experiment file (or none) with overrides; returns its summary.json."""

ROOT = Path(__file__).resolve().parents[1]
SPREAD_YAML = ROOT / "experiments" / "mpe" / "simple_spread.yaml"

PISTONBALL_TUTORIAL = [
    "env.id=butterfly/pistonball_v6",
    "env.kwargs.max_cycles=25",
    "env.greyscale=true",
    "env.resize=[84,84]",
    "env.frame_stack=3",
    "model.encoder=cnn",
    "model.cnn_channels=[32,64,64]",
    "model.cnn_features=512",
    "model.cnn_padding=valid",
    "model.shared_cnn=true",
    "critic=obs",
    "share_actor=true",
    "num_envs=4",
    "rollout_steps=256",
    "gamma=0.95",
    "gae_lambda=0.99",
    "ppo.train_pi_iters=5",
    "ppo.train_vf_iters=5",
    "ppo.num_minibatches=80",
    "ppo.target_kl=null",
    "ppo.pi_lr=0.00062211",
    "ppo.vf_lr=0.00062211",
    "ppo.clip_ratio=0.3",
    "ppo.entropy_coef=0.0905168",
    "ppo.max_grad_norm=0.9",
]
"""PettingZoo's SB3 pistonball tutorial written as marl_ppo's config (docs/environments.md)."""

SPREAD_BENCHMARL = [
    "num_envs=32",
    "rollout_steps=25",
    "vector=sync",
    "policy_lag=0",
    "torch_threads=1",
    "ppo.train_pi_iters=10",
    "ppo.train_vf_iters=10",
    "ppo.num_minibatches=4",
    "ppo.pi_lr=1e-3",
    "ppo.vf_lr=1e-3",
    "ppo.lr_schedule=constant",
    "gamma=0.95",
    "critic=team",
]
"""The default experiment at BenchMARL's on-policy settings: 800 env steps a batch from 32 copies,
10 epochs of 4 minibatches of 200, lr 1e-3, gamma 0.95, one thread, and BenchMARL's MAPPO critic
(`share_param_critic`, its default): one network on the global state, one value per env step for
every agent, which is `critic: team`'s network (its targets differ: BenchMARL regresses the one
value to each agent's return, `team` to the return of the agents' mean reward)."""


@dataclass
class PeerCase:
    """One line of the peer table: a marl_ppo training and a peer's script at the same settings."""

    name: str
    peer: Peer
    peer_args: list[str]
    experiment: Path | None
    overrides: list[str]
    agents: int
    ours: list[dict[str, Any]] = field(default_factory=list)
    """marl_ppo's summary.json per repeat."""
    theirs: list[PeerResult] = field(default_factory=list)
    unavailable: str | None = None
    """Why the peer did not run, once it failed; the case then stops."""

    def ratios(self) -> list[float]:
        """marl_ppo's env steps/s over the peer's, pair by pair."""
        return [ours["sps"] / theirs.sps for ours, theirs in zip(self.ours, self.theirs, strict=True)]


def peer_cases(pistonball_steps: int, spread_steps: int) -> list[PeerCase]:
    """The peer cases: pistonball at SB3's tutorial settings (float32 layers and `model.precision: auto`),
    simple_spread at BenchMARL's with two widths."""
    spread = [
        PeerCase(
            f"spread_benchmarl_{width}",
            BENCHMARL,
            ["--frames", str(spread_steps), "--hidden", str(width), str(width)],
            SPREAD_YAML,
            [*SPREAD_BENCHMARL, f"model.hidden_sizes=[{width},{width}]", f"total_steps={spread_steps}"],
            3,
        )
        for width in (64, 256)
    ]
    pistonball = [
        PeerCase(
            f"pistonball_tutorial{suffix}",
            SB3,
            ["--env-steps", str(pistonball_steps)],
            None,
            [*PISTONBALL_TUTORIAL, f"model.precision={precision}", f"total_steps={pistonball_steps}"],
            20,
        )
        # float32 as SB3 computes; `auto`: bfloat16 layers where the CPU has bfloat16 instructions
        for suffix, precision in (("", "fp32"), ("_auto", "auto"))
    ]
    return [*pistonball, *spread]


PEER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""The BenchMARL cases' one thread, for the peer's process (marl_ppo's runs set torch_threads=1)."""


def run_pair(case: PeerCase, repeat: int, train: Train) -> str:
    """Run marl_ppo (`train(experiment, overrides)`) and the peer once each, in the repeat's order."""
    if case.unavailable is not None:
        return f"{case.name}: skipped, {case.unavailable}"
    env = PEER_ENV if case.peer is BENCHMARL else {}
    ours_first = repeat % 2 == 0
    try:
        ensure_peer(case.peer)  # before marl_ppo's run, which a missing peer would waste
        if ours_first:
            ours = train(case.experiment, case.overrides)
        theirs = run_peer(case.peer, case.peer_args, env)
        if not ours_first:
            ours = train(case.experiment, case.overrides)
    except PeerUnavailable as error:
        case.unavailable = str(error)
        return f"{case.name}: skipped, {error}"
    case.ours.append(ours)
    case.theirs.append(theirs)
    return (
        f"{case.name}: marl_ppo {ours['sps']:.2f} env steps/s, {case.peer.name} "
        f"{theirs.sps:.2f} ({theirs.agent_sps:.1f} agent-steps/s), ratio {case.ratios()[-1]:.2f}"
        f" ({'marl_ppo' if ours_first else case.peer.name} ran first){_returns(ours, theirs)}"
    )


def _returns(ours: dict[str, Any], theirs: PeerResult) -> str:
    """Both sides' team return over their last episodes, where the peer reports one."""
    if theirs.team_return is None:
        return ""
    return f"; team return marl_ppo {ours['team_return_mean']:.1f}, {theirs.team_return:.1f}"


def median(values: list[float]) -> float:
    """The median, or nan for no values (a case that never ran)."""
    return statistics.median(values) if values else float("nan")


def peer_report(done: list[PeerCase]) -> str:
    """The table of the peer cases: each side's median env steps/s and the median of the pairs' ratios."""
    header = (
        f"{'case':24s} {'peer':>9s} {'marl_ppo sps':>12s} {'peer sps':>9s} {'agent-steps/s':>21s} "
        f"{'ratio':>6s} {'(range)':>11s} {'pairs':>5s}"
    )
    lines = [header]
    for case in done:
        if case.unavailable is not None and not case.ours:
            lines.append(f"{case.name:24s} {case.peer.name:>9s} skipped: {case.unavailable}")
            continue
        ours = median([summary["sps"] for summary in case.ours])
        theirs = median([result.sps for result in case.theirs])
        ratios = case.ratios()
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else ""
        agent_steps = f"{ours * case.agents:.0f} / {theirs * case.agents:.0f}"
        lines.append(
            f"{case.name:24s} {case.peer.name:>9s} {ours:12.2f} {theirs:9.2f} {agent_steps:>21s} "
            f"{median(ratios):6.2f} {spread:>11s} {len(ratios):5d}"
        )
    return "\n".join(lines)
