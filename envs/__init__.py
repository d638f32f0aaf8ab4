"""The project's own environments, registered through marl_ppo's public API only.

Small, exact environments for tests and as examples of bringing your own env.
"""

from marl_ppo import register_env


def register() -> None:
    """Register every env in this package (called through the `marl_ppo.envs` entry point)."""
    register_env("envs/never_ending_v0", "marl_ppo_examples.never_ending:parallel_env")
    register_env("envs/early_leaver_v0", "marl_ppo_examples.early_leaver:parallel_env")
    register_env("envs/mixed_actions_v0", "marl_ppo_examples.mixed_actions:parallel_env")
    register_env("envs/masked_guess_v0", "marl_ppo_examples.masked_guess:parallel_env")
    register_env("envs/matrix_game_v0", "marl_ppo_examples.matrix_game:parallel_env")
    register_env("envs/cue_recall_v0", "marl_ppo_examples.cue_recall:parallel_env")
    register_env("envs/pixel_signal_v0", "marl_ppo_examples.pixel_signal:parallel_env")
    register_env("envs/pixel_compass_v0", "marl_ppo_examples.pixel_compass:parallel_env")
    register_env("envs/spread_nearest_v0", "marl_ppo_examples.spread_nearest:parallel_env")
