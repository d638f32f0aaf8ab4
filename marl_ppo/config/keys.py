"""The config's dotted keys: their documentation and defaults for `--help-config`, close matches
for a mistyped key, the one-line message for a validation error, and the config as `train` shows it
(`--print-config`, and the notice of a run without an experiment file)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import textwrap
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo

from marl_ppo.config.experiment import ExperimentConfig, _plain, config_to_dict
from marl_ppo.console import shown_path


def config_keys(cls: type = ExperimentConfig, prefix: str = "") -> dict[str, str]:
    """Every dotted key of the config with its documentation, for help and close matches."""
    return {key: entry.doc for key, entry in key_help(cls, prefix).items()}


@dataclasses.dataclass(frozen=True)
class KeyHelp:
    """What `--help-config` shows for one dotted key."""

    doc: str
    default: str | None
    """The default as YAML (`0.99`, `null`, `[64, 64]`); None for a section (`ppo`, `log`, ...)."""
    allowed: str | None
    """The values the key accepts (`number in (0, 1]`, `constant, linear`); None for a section."""


def key_help(cls: type = ExperimentConfig, prefix: str = "") -> dict[str, KeyHelp]:
    """Every dotted key with its documentation, default and allowed values, sections before their keys."""
    if not is_pydantic_dataclass(cls):
        raise TypeError(f"key_help reads a config section (a pydantic dataclass), got {cls!r}")
    keys: dict[str, KeyHelp] = {}
    for name, field in cls.__pydantic_fields__.items():
        key, doc = prefix + name, field.description or ""
        section = _section_type(field.annotation)
        if section is not None:
            keys[key] = KeyHelp(doc, None, None)
            keys.update(key_help(section, key + "."))
            continue
        if field.is_required():  # a key of an optional section (`expected.steps`): no default
            allowed = _allowed(field.annotation, field.metadata)
            keys[key] = KeyHelp(f"{doc} Required in the section; allowed: {allowed}.", None, None)
            continue
        default = field.get_default(call_default_factory=True)
        keys[key] = KeyHelp(doc, yaml_value(default), _allowed(field.annotation, field.metadata))
    return keys


def _section_type(annotation: Any) -> type | None:
    """The dataclass of a section of keys (`ppo`, or an optional one such as `expected`), else None."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation
    inner = [a for a in get_args(annotation) if a is not type(None)]
    if (
        get_origin(annotation) in (Union, types.UnionType)
        and len(inner) == 1
        and isinstance(inner[0], type)
        and dataclasses.is_dataclass(inner[0])
    ):
        return inner[0]
    return None


def yaml_value(value: Any) -> str:
    """One value as it is written in YAML or in a key=value override."""
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=math.inf)
    return text.removesuffix("...\n").strip()


def _allowed(annotation: Any, bounds: Iterable[Any] = ()) -> str:
    """The values a field's type accepts, in words: `integer > 0`, `number in (0, 1]`, `a, b`, `... or null`."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        extra = [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return _allowed(args[0], [*bounds, *extra])
    if origin in (Union, types.UnionType):
        words = [_allowed(a) for a in args if a is not type(None)]
        return " or ".join([*words, "null"] if type(None) in args else words)
    if origin is Literal:
        return ", ".join(yaml_value(a) for a in args)
    if origin is tuple or origin is list:
        item = _allowed(args[0])
        noun, _, rest = item.partition(" ")
        return f"list of {noun}s {rest}".rstrip() if noun in ("integer", "number", "string") else "list"
    if origin is dict or annotation is dict:
        return "mapping"
    names = {bool: "true, false", int: "integer", float: "number", str: "string"}
    noun = names.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return f"{noun} {_range(bounds)}".strip()


def _range(bounds: Iterable[Any]) -> str:
    """`> 0`, `>= 0`, `in (0, 1]` from annotated-types bounds (Gt, Ge, Lt, Le)."""
    limits = {kind: getattr(b, kind) for b in bounds for kind in ("gt", "ge", "lt", "le") if hasattr(b, kind)}
    low = ("(", limits["gt"]) if "gt" in limits else ("[", limits["ge"]) if "ge" in limits else None
    high = (")", limits["lt"]) if "lt" in limits else ("]", limits["le"]) if "le" in limits else None
    if low and high:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    if high:
        return f"{'<' if high[0] == ')' else '<='} {high[1]}"
    return ""


def close_keys(key: str, known: Iterable[str]) -> list[str]:
    """Known keys a mistyped dotted key may mean, best first (at most 3).

    A key matches when each `_`-part of the typed last name starts a part of its last name, in the
    same section first, then in any (`ppo.clip` -> `ppo.clip_ratio`, `ppo.value_clip`; `clip_ratio`
    -> `ppo.clip_ratio`); otherwise the closest spellings at the same depth (`ppo.pi_lrr` -> `ppo.pi_lr`),
    and for a top-level key the closest name in any section (`gama` -> `ppo.gamma`).
    """
    known = list(known)
    section, _, name = key.rpartition(".")
    typed = [part for part in name.lower().split("_") if part]

    def parts_match(candidate: str) -> bool:
        words = candidate.rpartition(".")[2].split("_")
        return bool(typed) and all(any(w.startswith(t) for w in words) for t in typed)

    def rank(candidate: str) -> tuple[bool, float]:
        leaf = candidate.rpartition(".")[2]
        starts = leaf.startswith(typed[0])  # `clip` is rather clip_ratio than value_clip
        return (not starts, -difflib.SequenceMatcher(None, name, leaf).ratio())

    same_section = [k for k in known if k.rpartition(".")[0] == section]
    for pool in (same_section, known):
        matches = sorted((k for k in pool if k != key and parts_match(k)), key=rank)
        if matches:
            return matches[:3]
    depth = [k for k in known if k.count(".") == key.count(".")]
    close = difflib.get_close_matches(key, depth, n=1, cutoff=0.6)
    if close or section:
        return close
    leaves = {k.rpartition(".")[2]: k for k in reversed(known)}  # a top-level typo of a section's key
    return [leaves[leaf] for leaf in difflib.get_close_matches(name, leaves, n=1, cutoff=0.6)]


def describe_error(error: Mapping[str, Any]) -> str:
    loc = [str(part) for part in error["loc"] if not isinstance(part, int)]
    key = ".".join(loc) or "<root>"
    kind = error["type"]
    if kind == "unexpected_keyword_argument":
        close = [f"'{k}'" for k in close_keys(key, config_keys())]
        options = " or ".join([", ".join(close[:-1]), close[-1]] if len(close) > 1 else close)
        hint = f"did you mean {options}?" if close else "see `marl-ppo train --help-config` for the keys"
        return f"unknown config key '{key}'; {hint}"
    if kind == "int_from_float":
        doc = config_keys().get(key, "")
        hint = f" ({' '.join(doc.split())})" if doc else ""
        return (
            f"config key '{key}' takes a whole number, got {error.get('input')!r}; write it as 1000000, "
            f"1_000_000 or 1e6{hint}"
        )
    if kind == "value_error":
        return str(error["msg"]).removeprefix("Value error, ")
    got = error.get("input")
    if kind in ("tuple_type", "list_type") and isinstance(got, str):
        # the brackets or parentheses the value already has (a tuple, an unclosed list) are not doubled
        items = ",".join(part.strip() for part in got.strip().strip("[]()").split(","))
        return f"config key '{key}' takes a list, got {got!r}; write it as {key}=[{items}] (YAML's list form)"
    if kind in ("model_type", "dataclass_type", "dict_type", "model_attributes_type") and not isinstance(
        got, dict
    ):
        first = next((k for k in config_keys() if k.startswith(f"{key}.")), f"{key}.KEY")
        example = f"{key}.id={got}" if key == "env" and isinstance(got, str) else f"{first}=..."
        return (
            f"config key '{key}' is a section of keys, got {got!r}; set the keys inside it, e.g. {example} "
            f"(in a file: {key}: {{{example.partition('.')[2].replace('=', ': ')}}})"
        )
    docs = config_keys()
    hint = f" ({' '.join(docs[key].split())})" if key in docs and docs[key] else ""  # docs may span lines
    return f"config key '{key}': {error['msg'].lower()}, got {got!r}{hint}"


def config_yaml(config: ExperimentConfig) -> str:
    """The config as the run's config.yaml holds it; `auto` choices are made when the run starts."""
    text = yaml.safe_dump(config_to_dict(config), sort_keys=False)
    choices = (
        ("rollout.vector", config.rollout.vector),
        ("rollout.compiled", config.rollout.compiled),
        ("model.precision", config.model.precision),
    )
    auto = [key for key, value in choices if value == "auto"]
    if auto:
        listed = ", ".join(auto[:-1]) + f" and {auto[-1]}" if len(auto) > 1 else auto[0]
        text += f"# {listed}: auto is chosen when the run starts; its config.yaml records the choice\n"
    return text


DEFAULT_EXPERIMENT = Path("experiments/mpe/simple_spread.yaml")
"""The experiment `make run` trains, in the project's repository."""
NOTICE_KEYS = (
    "ppo.gamma",
    "rollout.rollout_steps",
    "rollout.num_envs",
    "model.share_actor",
    "ppo.lr_schedule",
)
"""Keys in which the library defaults and the default experiment differ, shown by a bare `train`."""


def defaults_notice(config: ExperimentConfig, overrides: Sequence[str]) -> str:
    """The first line of a `train` without an experiment file: the defaults it runs with, and the way to
    the default experiment."""
    values = []
    for key in NOTICE_KEYS:
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part)
        values.append(f"{key} {yaml_value(value)}")
    source = "library defaults and overrides" if overrides else "library defaults"
    repository_file = Path(__file__).resolve().parents[2] / DEFAULT_EXPERIMENT
    experiment = shown_path(str(repository_file)) if repository_file.is_file() else str(DEFAULT_EXPERIMENT)
    return f"no experiment file: {source} ({', '.join(values)}, ...); the default experiment is {experiment}"


KEY_COLUMN = 29
"""Where the text of `--help-config` starts, after the key."""


def help_config_lines(width: int = 100) -> list[str]:
    """`--help-config`: each key with its meaning, default and allowed values; the text wraps under itself."""
    width = max(KEY_COLUMN + 30, min(width, 120))
    indent = " " * KEY_COLUMN
    lines = ["Config keys, set in an experiment file (YAML) or as key=value (which wins over the file)."]
    for key, entry in key_help().items():
        if "." not in key and entry.default is None:
            lines.append("")  # a section: env, rollout, ppo, model, ...
        text = textwrap.wrap(" ".join(entry.doc.split()), width - KEY_COLUMN)
        if entry.default is not None:
            text += textwrap.wrap(f"default: {entry.default}; allowed: {entry.allowed}", width - KEY_COLUMN)
        head = f"{key:{KEY_COLUMN - 1}s} " if len(key) < KEY_COLUMN else f"{key}\n{indent}"
        lines.append(head + text[0])
        lines.extend(indent + line for line in text[1:])
    return lines
