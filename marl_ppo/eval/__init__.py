"""Evaluation: deterministic episodes of a policy, from a run in progress or from a checkpoint, and video."""
