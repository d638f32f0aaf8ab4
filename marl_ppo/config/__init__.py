"""Experiment configuration: the one home of every default, documented at the field.

An experiment is a YAML file of nested keys plus ``key=value`` overrides on the command line
(``ppo.pi_lr=1e-3``). Both are merged into plain dicts and validated once into frozen
dataclasses; any unknown key, wrong type or out-of-range value raises ``ConfigError`` with a
single line that names the key and the fix.

A module per section holds its dataclass (`env`, `rollout` with `ray`, `ppo`, `model`, `evaluation`,
`host`, `log`, `fast`); `experiment` holds the whole and the keys that moved into sections, `base` what
they share; `loading` reads files and overrides into them, `keys` documents every dotted key and words
the errors.
"""

from marl_ppo.config.base import ConfigError, PositiveFloat, PositiveInt
from marl_ppo.config.env import EnvConfig
from marl_ppo.config.evaluation import EvalConfig
from marl_ppo.config.experiment import (
    MOVED_KEYS,
    ExpectedConfig,
    ExperimentConfig,
    config_to_dict,
    migrate_stored,
    refuse_moved,
)
from marl_ppo.config.fast import FastConfig
from marl_ppo.config.host import HostConfig
from marl_ppo.config.keys import KeyHelp, close_keys, config_keys, key_help, yaml_value
from marl_ppo.config.league import LeagueConfig
from marl_ppo.config.loading import (
    build_config,
    load_config,
    load_stored_config,
    load_yaml,
    merge,
    parse_overrides,
)
from marl_ppo.config.log import LogConfig, MlflowConfig, WandbConfig
from marl_ppo.config.model import ModelConfig
from marl_ppo.config.ppo import PPOConfig, SettledPPO
from marl_ppo.config.rollout import RayConfig, RolloutConfig

__all__ = [
    "MOVED_KEYS",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "ExpectedConfig",
    "ExperimentConfig",
    "FastConfig",
    "HostConfig",
    "KeyHelp",
    "LogConfig",
    "MlflowConfig",
    "ModelConfig",
    "PPOConfig",
    "SettledPPO",
    "PositiveFloat",
    "PositiveInt",
    "LeagueConfig",
    "RayConfig",
    "RolloutConfig",
    "WandbConfig",
    "build_config",
    "close_keys",
    "config_keys",
    "config_to_dict",
    "key_help",
    "load_config",
    "load_stored_config",
    "load_yaml",
    "merge",
    "migrate_stored",
    "parse_overrides",
    "refuse_moved",
    "yaml_value",
]
