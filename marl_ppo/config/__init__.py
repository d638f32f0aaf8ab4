"""Experiment configuration: the one home of every default, documented at the field.

An experiment is a YAML file of nested keys plus ``key=value`` overrides on the command line
(``ppo.pi_lr=1e-3``). Both are merged into plain dicts and validated once into frozen
dataclasses; any unknown key, wrong type or out-of-range value raises ``ConfigError`` with a
single line that names the key and the fix.

`records` holds the dataclasses, `loading` reads files and overrides into them, `keys` documents
every dotted key and words the errors.
"""

from marl_ppo.config.keys import KeyHelp, close_keys, config_keys, key_help, yaml_value
from marl_ppo.config.loading import build_config, load_config, load_yaml, merge, parse_overrides
from marl_ppo.config.records import (
    ConfigError,
    EnvConfig,
    ExpectedConfig,
    ExperimentConfig,
    FastConfig,
    LogConfig,
    MlflowConfig,
    ModelConfig,
    PositiveFloat,
    PositiveInt,
    PPOConfig,
    RayConfig,
    WandbConfig,
    config_to_dict,
)

__all__ = [
    "ConfigError",
    "EnvConfig",
    "ExpectedConfig",
    "ExperimentConfig",
    "FastConfig",
    "KeyHelp",
    "LogConfig",
    "MlflowConfig",
    "ModelConfig",
    "PPOConfig",
    "PositiveFloat",
    "PositiveInt",
    "RayConfig",
    "WandbConfig",
    "build_config",
    "close_keys",
    "config_keys",
    "config_to_dict",
    "key_help",
    "load_config",
    "load_yaml",
    "merge",
    "parse_overrides",
    "yaml_value",
]
