"""Hyperparameter search over a config's own keys, seed-aware, with Optuna."""
