"""Benchmarks: `python -m marl_ppo.bench` (speed, as ratios to the raw env) and `marl_ppo.bench.memory`."""
