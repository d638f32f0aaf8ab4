"""Benchmarks, run from the repository root and not installed with marl_ppo: `python -m bench` (speed, as
ratios to the raw env), `python -m bench.memory` and `python -m bench.fingerprint`."""
