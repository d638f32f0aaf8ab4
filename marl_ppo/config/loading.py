"""Reading an experiment: YAML files (with YAML 1.2's numbers), `key=value` overrides, their merge,
and the validation of the result into an `ExperimentConfig`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from marl_ppo.config.base import ConfigError
from marl_ppo.config.experiment import ExperimentConfig, migrate_stored
from marl_ppo.config.keys import describe_error


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that also reads `1e6` and `2.5e-4` as numbers, as YAML 1.2 does.

    (YAML 1.1 reads them as strings: it wants a dot and a signed exponent, `1.0e+6`.)
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _load_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: plain data only


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn `a.b=value` strings into a nested dict; values are parsed as YAML scalars/lists
    (`1e6` is a number, as in the experiment files)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{item}' is not key=value; write e.g. seed=3 or ppo.pi_lr=1e-3")
        try:
            value = _load_yaml_text(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override '{item}' conflicts with an earlier override of '{part}'")
            node = child
        node[parts[-1]] = value
    return tree


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; `update` wins. `env.kwargs` merges key by key like any dict."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read an experiment YAML file into a dict (an empty file is an empty dict)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file '{path}' does not exist; pass a path to a YAML file")
    try:
        data = _load_yaml_text(path.read_text()) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"experiment file '{path}' is not UTF-8 text; pass a YAML file") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"experiment file '{path}' is not valid YAML{where}; fix its syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(f"experiment file '{path}' must hold a mapping of keys, not {type(data).__name__}")
    return data


def build_config(data: Mapping[str, Any]) -> ExperimentConfig:
    """Validate a nested dict into an ExperimentConfig, or raise a one-line ConfigError."""
    try:
        return TypeAdapter(ExperimentConfig).validate_python(dict(data))
    except ValidationError as err:
        raise ConfigError(describe_error(err.errors()[0])) from None


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """Experiment file (optional) plus `key=value` overrides -> validated ExperimentConfig (a run's
    plan settles what it leaves to the env, `rollout.num_envs: null`)."""
    data = load_yaml(path) if path is not None else {}
    return build_config(merge(data, parse_overrides(overrides)))


def load_stored_config(path: str | Path, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """A config a run stored (its config.yaml) plus `key=value` overrides -> validated ExperimentConfig:
    the file's moved keys are migrated to their place (`migrate_stored`), the overrides' are refused."""
    return build_config(merge(migrate_stored(load_yaml(path)), parse_overrides(overrides)))
