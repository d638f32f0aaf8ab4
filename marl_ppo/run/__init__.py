"""One training run: the loop, the builders that turn a config into its parts, checkpoints, resume,
signals, seeding, host tuning and the env conformance check (the logger is in marl_ppo.logs)."""
