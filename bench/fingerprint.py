"""`python -m bench.fingerprint`: hashes of short runs' final weights and optimizer state.

A change that should not alter learning (a refactor, a faster path) prints the same hashes before and
after it on the same machine: run it on both checkouts and compare. The runs are seeded and end with
`checkpoints/final.pt`; the model's tensors and the trainer's state (optimizer moments, the minibatch
generator) are hashed in their state-dict order. Hashes depend on the machine's float arithmetic, so
compare only runs of one machine.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

CASES: dict[str, tuple[str, list[str]]] = {
    "default_8": ("experiments/mpe/simple_spread.yaml", ["seed=0", "total_steps=6400"]),
    "default_10": ("experiments/mpe/simple_spread.yaml", ["seed=0", "total_steps=8000"]),
    "cue_gru_3": ("experiments/envs/cue_recall.yaml", ["seed=0", "total_steps=960"]),
    "cue_lstm_team": (
        "experiments/envs/cue_recall.yaml",
        ["seed=0", "total_steps=960", "model.recurrent=lstm", "ppo.critic=team", "ppo.chunk_length=null"],
    ),
    "spread_ippo_sync": (
        "experiments/mpe/simple_spread.yaml",
        [
            "seed=1",
            "total_steps=1600",
            "rollout.vector=sync",
            "rollout.policy_lag=0",
            "ppo.critic=obs",
            "model.share_actor=false",
            "ppo.target_kl=0.01",
        ],
    ),
}
"""Name -> experiment file and overrides: the default experiment for 8 and for 10 updates, a GRU run of
3 updates on cue_recall, an LSTM team-critic run and an IPPO run in one process with the KL stop."""


def _digest(value: Any, into: Any) -> None:
    if isinstance(value, torch.Tensor):
        into.update(value.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            into.update(str(key).encode())
            _digest(value[key], into)
    elif isinstance(value, list | tuple):
        for item in value:
            _digest(item, into)
    else:
        into.update(repr(value).encode())


def fingerprint(experiment: str, overrides: list[str]) -> dict[str, str]:
    """Train the run and hash its final checkpoint's model and trainer state (16 hex digits each)."""
    from marl_ppo.checkpoint import load_checkpoint
    from marl_ppo.config import load_config
    from marl_ppo.run.loop import train

    run_dir = Path(tempfile.mkdtemp()) / "run"
    train(load_config(experiment, [*overrides, "log.progress=false"]), run_dir)
    payload = load_checkpoint(run_dir / "checkpoints" / "final.pt")
    hashes = {}
    for key in ("model", "trainer"):
        digest = hashlib.sha256()
        _digest(payload[key], digest)
        hashes[key] = digest.hexdigest()[:16]
    return hashes


def main(argv: list[str] | None = None) -> int:
    """Print one line per case: its name and the two hashes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"cases to run, of {', '.join(CASES)} (default: all)")
    options = parser.parse_args(argv)
    unknown = [name for name in options.cases if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    for name in options.cases or list(CASES):
        experiment, overrides = CASES[name]
        hashes = fingerprint(experiment, overrides)
        print(f"{name}: model {hashes['model']} trainer {hashes['trainer']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
