"""The search space file: which config keys a study tunes, over which values, checked before any trial.

A space file is a YAML mapping from dotted config keys to one of:

- a range, `{low: 1.0e-4, high: 3.0e-3}`, with `log: true` for a log-uniform draw and `step: S` for a
  grid of `low, low + S, ...`; a key whose type is a whole number is drawn as an integer;
- choices, `{choices: [64, 128, 256]}`, any values the key accepts (lists among them).

Every key must be a config key; `seed`, `total_steps` and the `eval` section are refused, since they
change what a trial's score measures. Both ends of a range and every choice are validated by the
config's own rules on the experiment file before any trial starts, so a bad value is one line now
rather than a failed trial later.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from marl_ppo.config import ConfigError, ExperimentConfig, load_config
from marl_ppo.config.keys import close_keys, config_keys, yaml_value
from marl_ppo.config.loading import load_yaml
from marl_ppo.faults import UserError

REFUSED_KEYS = ("seed", "total_steps", "eval.")
"""Keys a search may not vary: the seeds are the study's, and the budget and evaluation define the score."""


class TuneError(UserError, ValueError):
    """A user-facing tuning problem; its message is one line naming the value and the fix."""


@dataclass(frozen=True)
class Range:
    """A number drawn between `low` and `high` (both included), uniformly or log-uniformly."""

    low: float
    high: float
    log: bool
    step: float | None
    integer: bool


@dataclass(frozen=True)
class Choices:
    """One of the listed values."""

    values: tuple[Any, ...]


Dimension = Range | Choices


@dataclass(frozen=True)
class SearchSpace:
    """The tuned keys, in the file's order, each with its range or choices."""

    dimensions: dict[str, Dimension]

    def as_dict(self) -> dict[str, Any]:
        """The space as plain data (how the study records it, to refuse resuming with another)."""
        plain: dict[str, Any] = {}
        for key, dim in self.dimensions.items():
            if isinstance(dim, Choices):
                plain[key] = {"choices": list(dim.values)}
            else:
                plain[key] = {"low": dim.low, "high": dim.high, "log": dim.log, "step": dim.step}
                plain[key]["integer"] = dim.integer
        return plain


def overrides_of(params: Mapping[str, Any]) -> list[str]:
    """A trial's parameters as `key=value` overrides, in YAML's spelling (`[64, 64]`, `true`, `0.0003`)."""
    return [f"{key}={yaml_value(value)}" for key, value in params.items()]


def read_space(path: Path, experiment: Path, fixed: Sequence[str] = ()) -> SearchSpace:
    """Read a space file and check every key, range and choice against the experiment's config."""
    try:
        data = load_yaml(path)
    except ConfigError as err:
        raise TuneError(str(err).replace("experiment file", "space file")) from None
    if not data:
        raise TuneError(
            f"space file '{path}' names no keys; write e.g. ppo.pi_lr: {{low: 1.0e-4, high: 1.0e-3, log: true}}"
        )
    known = config_keys()
    dimensions = {}
    for key, spec in data.items():
        where = f"space file '{path}', key '{key}'"
        _check_key(str(key), known, where)
        dimensions[str(key)] = _dimension(str(key), spec, where)
        for value in _corners(dimensions[str(key)]):
            try:
                load_config(experiment, [*fixed, f"{key}={yaml_value(value)}"])
            except ConfigError as err:
                raise TuneError(f"{where}: the value {yaml_value(value)} is refused: {err}") from None
    return SearchSpace(dimensions)


def _check_key(key: str, known: Mapping[str, str], where: str) -> None:
    if key in REFUSED_KEYS or key.startswith(REFUSED_KEYS[-1]) or key == "eval":
        raise TuneError(
            f"{where}: {key} cannot be tuned, it changes what a trial's score measures; remove it"
        )
    if key not in known:
        close = close_keys(key, known)
        hint = f"did you mean {' or '.join(close)}?" if close else "see `marl-ppo train --help-config`"
        raise TuneError(f"{where}: not a config key; {hint}")
    if _annotation(key) is None:
        raise TuneError(f"{where}: a section, not a key; name one of its keys (e.g. {key}.<name>)")


def _dimension(key: str, spec: Any, where: str) -> Dimension:
    if not isinstance(spec, dict):
        raise TuneError(f"{where}: write a range {{low: A, high: B}} or {{choices: [A, B]}}, got {spec!r}")
    if "choices" in spec:
        extra = sorted(set(spec) - {"choices"})
        values = spec["choices"]
        if extra:
            raise TuneError(f"{where}: choices take no {', '.join(extra)}; remove them")
        if not isinstance(values, list) or not values:
            raise TuneError(f"{where}: choices must be a non-empty list, got {values!r}")
        if len({yaml_value(v) for v in values}) != len(values):
            raise TuneError(f"{where}: choices list a value twice; list each once")
        return Choices(tuple(values))
    unknown = sorted(set(spec) - {"low", "high", "log", "step"})
    if unknown or "low" not in spec or "high" not in spec:
        raise TuneError(
            f"{where}: a range is {{low: A, high: B}} with optional log: true or step: S"
            + (f"; '{unknown[0]}' is not one of them" if unknown else "; low and high are both needed")
        )
    kinds = _base_types(_annotation(key))
    if not kinds & {int, float}:
        raise TuneError(f"{where}: a range needs a number key; list the values as {{choices: [...]}}")
    integer = float not in kinds
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    numbers = (low, high) if step is None else (low, high, step)
    for value in numbers:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TuneError(f"{where}: range bounds and step must be numbers, got {value!r}")
        if integer and not isinstance(value, int):
            raise TuneError(
                f"{where}: the key takes whole numbers, got {value!r}; write whole bounds and step"
            )
    if not isinstance(log, bool):
        raise TuneError(f"{where}: log must be true or false, got {log!r}")
    if not low < high:
        raise TuneError(f"{where}: low {low} must be below high {high}")
    if log and low <= 0:
        raise TuneError(f"{where}: a log range needs low > 0, got {low}")
    if log and step is not None:
        raise TuneError(f"{where}: a range is either log or stepped, not both; drop one")
    if step is not None and not 0 < step <= high - low:
        raise TuneError(f"{where}: step {step} must be above 0 and at most high - low ({high - low})")
    return Range(low, high, log, step, integer)


def _corners(dim: Dimension) -> tuple[Any, ...]:
    return dim.values if isinstance(dim, Choices) else (dim.low, dim.high)


def _annotation(key: str) -> Any:
    """The type annotation of a dotted config key's field; None for a section or an unknown key."""
    section: Any = ExperimentConfig
    parts = key.split(".")
    for index, part in enumerate(parts):
        fields = getattr(section, "__pydantic_fields__", {})
        if part not in fields:
            return None
        annotation = fields[part].annotation
        inner = [a for a in _flatten(annotation) if hasattr(a, "__pydantic_fields__")]
        if index == len(parts) - 1:
            return None if inner else annotation
        if not inner:
            return None
        section = inner[0]
    return None


def _flatten(annotation: Any) -> list[Any]:
    """The alternatives of a type: Annotated unwrapped, unions split."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _flatten(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [a for arg in get_args(annotation) for a in _flatten(arg)]
    return [annotation]


def _base_types(annotation: Any) -> set[type]:
    """The plain types a field accepts: `Annotated[int, ...] | Literal['auto']` -> {int, str}."""
    found: set[type] = set()
    for alternative in _flatten(annotation):
        if get_origin(alternative) is Literal:
            found |= {type(value) for value in get_args(alternative)}
        elif isinstance(alternative, type):
            found.add(alternative)
    return found
