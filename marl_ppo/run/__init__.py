"""One training run: the loop, the builders that turn a run's plan into its parts, checkpoints,
resume, signals, seeding, the memory check and the env conformance check (the plan is in
marl_ppo.plan, the logger in marl_ppo.logs)."""
