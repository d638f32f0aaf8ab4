"""The exported marl_eval.json loads in marl-eval's own data_process_pipeline (slow: marl-eval needs an
environment of its own, `pip install --no-deps id-marl-eval==0.0.4` with numpy<2 and pandas<3)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from marl_ppo.analysis.compare import write_comparison
from tests.helpers import ROOT, fake_run

MARL_EVAL_PACKAGES = [
    "rliable",
    "seaborn",
    "colorcet",
    "matplotlib",
    "Jinja2",
    "colorama",
    "tqdm",
    "numpy<2",
    "pandas<3",
]


def _marl_eval_python(directory):
    """`MARL_EVAL_PYTHON` when set, else a fresh virtual environment with marl-eval under `directory`."""
    given = os.environ.get("MARL_EVAL_PYTHON")
    if given:
        return given
    subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
    python = str(directory / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "--no-deps", "id-marl-eval==0.0.4"], check=True
    )  # it pins a pandas without 3.11 wheels
    subprocess.run([*pip, *MARL_EVAL_PACKAGES], check=True)
    return python


@pytest.mark.slow
def test_marl_eval_reads_the_export_and_normalises_it_as_compare_does(tmp_path):
    for task, offset in (("mpe2/simple_spread_v3", -60.0), ("mpe2/simple_reference_v3", -30.0)):
        for critic, gain in (("state", 10.0), ("obs", 5.0)):
            for seed in range(3):
                finals = [offset, offset + gain / 2 + seed, offset + gain + seed]
                fake_run(
                    tmp_path / "runs" / f"{task.split('/')[1]}-{critic}-{seed}", task, critic, seed, finals
                )
    comparison = write_comparison([tmp_path / "runs"], tmp_path / "out", reps=100)
    python = _marl_eval_python(tmp_path / "marl-eval-venv")
    check = [python, str(ROOT / "tests" / "marl_eval_check.py"), str(tmp_path / "out" / "marl_eval.json")]
    loaded = json.loads(subprocess.run(check, check=True, capture_output=True, text=True).stdout)
    assert loaded["extra"]["number_of_runs"] == 3 and loaded["extra"]["number_of_steps"] == 3
    assert loaded["extra"]["algorithm_list"] == ["ppo.critic=obs", "ppo.critic=state"]
    ours = comparison.table.final_scores()
    for algorithm, matrix in loaded["final"]["mean_norm_return"].items():
        # marl-eval orders tasks as the file does (simple_reference_v3 first), as compare does here
        assert np.allclose(matrix, ours[algorithm], atol=1e-6)
