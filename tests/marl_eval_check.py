"""Load a `marl-ppo compare` marl_eval.json with marl-eval's own pipeline; print what it made of it as JSON.

Run with the Python of an environment that has marl-eval (`pip install --no-deps id-marl-eval` plus its
dependencies): `python tests/marl_eval_check.py compare/marl_eval.json`.
"""

import json
import sys
from pathlib import Path

from marl_eval.utils.data_processing_utils import create_matrices_for_rliable, data_process_pipeline

raw = json.loads(Path(sys.argv[1]).read_text())
processed = data_process_pipeline(raw_data=raw, metrics_to_normalize=["return"])
if "extra" not in processed:  # the pipeline prints its error and returns the raw data unchanged
    sys.exit("data_process_pipeline did not accept the file")
environment = next(iter(raw))
final, curves = create_matrices_for_rliable(processed, environment, ["return"])
print(
    json.dumps(
        {
            "extra": {k: v for k, v in processed["extra"].items() if k != "evaluation_interval"},
            "final": {metric: {a: m.tolist() for a, m in by.items()} for metric, by in final.items()},
            "curves": {
                metric: {a: list(getattr(m, "shape", ())) for a, m in by.items()}
                for metric, by in curves.items()
                if isinstance(by, dict)
            },
        }
    )
)
