"""The env copies a config leaves to its env (`rollout.num_envs: null`), settled from the env's
registration. Light: it imports the config and the registry only, so the command line can show a
settled config without loading torch."""

from __future__ import annotations

from marl_ppo.config import ExperimentConfig, build_config, config_to_dict
from marl_ppo.envs.registry import default_copies

DEFAULT_COPIES = 16
"""`rollout.num_envs` of a config that leaves it to an env registered without a number of its own."""


def settle_copies(config: ExperimentConfig) -> ExperimentConfig:
    """`config` with `rollout.num_envs: null` replaced by the copies its env's registration asks for (a
    batched simulator: `vmas/*` 1,024, `jaxmarl/*` 64), else `DEFAULT_COPIES`; validated again (the
    minibatch checks need the number). A config that sets the number is returned as it is."""
    if config.rollout.num_envs is not None:
        return config
    data = config_to_dict(config)
    data["rollout"]["num_envs"] = default_copies(config.env.id) or DEFAULT_COPIES
    return build_config(data)
