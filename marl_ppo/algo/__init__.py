"""The learning maths: GAE, per-group batches, PPO losses, value normalization and the trainer.

Pure functions over tensors where possible; nothing here knows about envs, processes or files.
"""
