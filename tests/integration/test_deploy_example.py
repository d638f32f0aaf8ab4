"""docs/deploy_onnx.py, the deployment page's example: an exported policy played with onnxruntime and
NumPy alone (torch never imported) gives `marl-ppo eval --deterministic`'s episode returns."""

import json
import subprocess
import sys

import pytest

from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.eval.evaluate import EVAL_SEED_OFFSET
from marl_ppo.run.loop import train
from tests.helpers import ROOT

pytest.importorskip("onnxruntime")

EXAMPLE = ROOT / "docs/deploy_onnx.py"


def test_the_onnxruntime_example_plays_evals_episodes_without_torch(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    train(
        load_config(ROOT / "experiments/mpe/simple_spread.yaml", [*tiny_overrides, "rollout.vector=sync"]),
        run_dir,
    )
    # one env copy plays both episodes, as the example does: reset with the seed, then auto-reset
    flags = ["--deterministic", "--episodes", "2", "--out", str(tmp_path), "rollout.num_envs=1"]
    assert main(["eval", str(run_dir), *flags]) == 0
    expected = json.loads((tmp_path / "eval.json").read_text())["per_episode"]["team_return"]
    assert main(["export", str(run_dir), "--out", str(tmp_path / "onnx")]) == 0

    code = (
        "import runpy, sys, json;"
        f"example = runpy.run_path({str(EXAMPLE)!r});"
        f"returns = example['play'](__import__('pathlib').Path({str(tmp_path / 'onnx')!r}), {EVAL_SEED_OFFSET}, 2);"
        "print(json.dumps({'returns': returns, 'torch': 'torch' in sys.modules, 'marl_ppo': 'marl_ppo' in sys.modules}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    played = json.loads(out.stdout.strip().splitlines()[-1])
    assert played["torch"] is False and played["marl_ppo"] is False
    assert played["returns"] == pytest.approx(expected, rel=1e-12)  # the same sums in another order
