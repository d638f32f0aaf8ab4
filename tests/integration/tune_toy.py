"""A deterministic stand-in for training, for tests of the tuner: `python tune_toy.py train RUN_DIR key=value ...`
writes evaluations whose returns are a known function of `ppo.clip_ratio`, the seed and the
evaluation's index; `python tune_toy.py drive DIR TRIALS PRUNER` runs a study of it in DIR.

Like a training, a toy run started again on its directory continues after its last evaluation, and
writes its summary.json last.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

EVALUATIONS = int(os.environ.get("TUNE_TOY_EVALUATIONS", "4"))
DELAY_S = float(os.environ.get("TUNE_TOY_DELAY", "0.05"))
"""Seconds before each evaluation."""
HOLD_BELOW = float(os.environ.get("TUNE_TOY_HOLD_BELOW", "0"))
"""A run whose `ppo.clip_ratio` is below this waits a minute before each evaluation after its second:
one the tuner should stop then is still running when it does, however loaded the machine."""


def toy_return(clip_ratio: float, seed: int, index: int) -> float:
    """The toy's evaluation return: best at clip_ratio 0.2, higher for later seeds and evaluations."""
    return 10.0 - 100.0 * (clip_ratio - 0.2) ** 2 + 0.5 * seed + 0.1 * index


def train(run_dir: Path, overrides: list[str]) -> None:
    values = dict(item.split("=", 1) for item in overrides)
    clip_ratio, seed = float(values["ppo.clip_ratio"]), int(values["seed"])
    scale = float(values.get("ppo.gamma", "1"))  # a second knob: multiplies every return
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "evaluations.jsonl"
    done = len(path.read_text().splitlines()) if path.is_file() else 0
    for index in range(done, EVALUATIONS):
        time.sleep(60.0 if index >= 2 and clip_ratio < HOLD_BELOW else DELAY_S)
        value = scale * toy_return(clip_ratio, seed, index)
        with path.open("a") as handle:
            handle.write(
                json.dumps({"step": 10 * (index + 1), "team_return_mean": value, "team_return": [value]})
                + "\n"
            )
    (run_dir / "summary.json").write_text(json.dumps({"team_return_mean": 0.0, "wall_s": 0.0}))


def command(run):  # noqa: ANN001, ANN201 - a launcher's Command
    """The toy's process for a tuner's run."""
    return [sys.executable, __file__, "train", str(run.run_dir), *run.overrides], "a"


def setup(
    directory: Path,
    trials: int,
    pruner: str = "none",
    seeds: int = 2,
    jobs: int = 2,
    space: str | None = None,
):  # noqa: ANN201
    """A study of the toy: the tiny matrix experiment with evaluations, clip_ratio searched in [0.1, 0.3]."""
    import yaml

    from marl_ppo.tune.space import read_space
    from marl_ppo.tune.study import TuneSetup
    from tests.helpers import TINY_MATRIX

    directory.mkdir(parents=True, exist_ok=True)
    experiment = directory / "toy.yaml"
    experiment.write_text(yaml.safe_dump({**TINY_MATRIX, "eval": {"every": 8}}))
    space_file = directory / "space.yaml"
    space_file.write_text(space or "ppo.clip_ratio: {low: 0.1, high: 0.3}\n")
    return TuneSetup(
        experiment=experiment,
        space=read_space(space_file, experiment),
        directory=directory / "tune",
        trials=trials,
        seeds=seeds,
        jobs=jobs,
        pruner=pruner,
    )


def drive(directory: Path, trials: int, pruner: str) -> None:
    from marl_ppo.tune.launch import ProcessLauncher
    from marl_ppo.tune.study import run_study

    toy = setup(directory, trials, pruner)
    run_study(toy, ProcessLauncher(toy.experiment, command), echo=lambda line: print(line, flush=True))


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(Path(sys.argv[2]), sys.argv[3:])
    else:
        drive(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
