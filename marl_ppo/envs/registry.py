"""Environment registry: ids to factories, resolved lazily so registering imports nothing heavy.

`env.id` may be
- a registered id such as `mpe2/simple_spread_v3` (family/name; the `marl_ppo.envs` entry points,
  the project's own catalog among them, register them on first lookup),
- a registered prefix and the rest of the id, such as `gymnasium/<id>` for any id of Gymnasium's
  own registry,
- `package.module:callable`, or
- `path/to/file.py:callable`, or
- `path/to/file.py:family/name` (or `package.module:family/name`): a registered id that the file or
  module registers (with `register_env`) when it is loaded, which is done first. Naming the file in
  the id makes every process that builds the env (a resumed run, eval, sweeps, worker processes
  started with spawn) load it too.
The callable returns a PettingZoo env (parallel or AEC) or a Gymnasium env; `env.kwargs` are passed
to it. Batched simulators (VMAS) register with `batched=True` and build all copies at once.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl_ppo.faults import UserError

Factory = Callable[..., Any]


class EnvError(UserError, ValueError):
    """A user-facing environment problem (unknown id, missing extra, bad factory); one line."""


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment: a factory or a lazy `module:attr` entry point, plus default kwargs."""

    id: str
    entry_point: Factory | str
    kwargs: dict[str, Any] = field(default_factory=dict)
    extra: str | None = None
    """The optional dependency group that provides it (`pip install marl-ppo[extra]`)."""
    requires: tuple[str, ...] = ()
    """Top-level modules the env needs; default: the entry point's package."""
    batched: bool = False
    """The factory builds all copies at once: it takes `num_envs`, `device` and `seed` (VMAS)."""
    own_threads: bool = False
    """The batched simulator computes on a thread pool of its own (JAX's): with `host.torch_threads: auto`
    the learner then keeps to one torch thread, since two spinning pools on the same cores slow each
    other's small operations tenfold."""
    copies: int | None = None
    """The `num_envs` a config that does not set it gets (a batched simulator pays off only with many
    copies); None: the config's own default."""

    @property
    def family(self) -> str:
        """The part of the id before the slash (`mpe2` for `mpe2/simple_spread_v3`)."""
        return self.id.split("/", 1)[0] if "/" in self.id else ""

    @property
    def missing_modules(self) -> list[str]:
        """The modules it needs that cannot be imported (checked without importing them)."""
        modules = self.requires
        if not modules and isinstance(self.entry_point, str):
            modules = (self.entry_point.partition(":")[0].split(".")[0],)
        return [module for module in modules if importlib.util.find_spec(module) is None]

    @property
    def installed(self) -> bool:
        """Whether everything it needs is installed."""
        return not self.missing_modules

    def load(self) -> Factory:
        """Import (if needed) and return the factory callable."""
        if callable(self.entry_point):
            return self.entry_point
        return _import_attr(self.entry_point, extra=self.extra, env_id=self.id)


_REGISTRY: dict[str, EnvSpec] = {}


@dataclass(frozen=True)
class IdFamily:
    """Every id `prefix + name` of a family, built by `factory(name, **kwargs)` (`vmas/flocking`)."""

    prefix: str
    factory: Callable[..., Any]
    extra: str | None = None
    """The optional dependency group that provides the family."""
    requires: tuple[str, ...] = ()
    """Top-level modules the family needs."""
    batched: bool = False
    """Its factory builds all copies at once (see EnvSpec.batched)."""
    own_threads: bool = False
    """Its batched simulator computes on a thread pool of its own (see EnvSpec.own_threads)."""
    copies: int | None = None
    """Its ids' `num_envs` when a config does not set it (see EnvSpec.copies)."""
    names: Callable[[], list[str]] | None = None
    """The names the family offers, for `marl-ppo envs` and close-match hints (may import its package)."""
    closed: bool = True
    """Only the offered names build (an unknown one is refused with the closest); false: the factory
    judges every name itself."""

    def spec(self, env_id: str) -> EnvSpec:
        """The spec of one id of the family (its name checked against the offered ones when closed)."""
        name = env_id[len(self.prefix) :]
        spec = EnvSpec(
            env_id,
            functools.partial(self.factory, name),
            {},
            self.extra,
            self.requires,
            self.batched,
            self.own_threads,
            self.copies,
        )
        if self.closed and self.names is not None and spec.installed:
            offered = self.names()
            if name not in offered:
                close = difflib.get_close_matches(name, offered, n=3, cutoff=0.5)
                hint = ", ".join(f"'{self.prefix}{c}'" for c in close) if close else "none close"
                raise EnvError(
                    f"unknown env id '{env_id}': the {self.prefix.rstrip('/')} family has no '{name}' "
                    f"(closest: {hint}); `marl-ppo envs` lists every id"
                )
        return spec

    @property
    def installed(self) -> bool:
        """Whether every module the family needs can be imported (checked without importing them)."""
        return all(importlib.util.find_spec(module) is not None for module in self.requires)

    def offered_ids(self) -> list[str]:
        """Every id the family offers (empty when it lists none or is not installed)."""
        if self.names is None or not self.installed:
            return []
        return [self.prefix + name for name in self.names()]


_PREFIXES: dict[str, IdFamily] = {}
"""Id prefixes whose rest names the env: `factory(rest, **kwargs)` builds it (`gymnasium/CartPole-v1`)."""
_ENTRY_POINTS_LOADED = False
ENTRY_POINT_GROUP = "marl_ppo.envs"


def _load_entry_points() -> None:
    """Call every `marl_ppo.envs` entry point once (third-party packages register their envs there)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            hook = entry.load()
        except Exception as err:  # a broken plugin must not break every other env
            print(f"warning: env plugin '{entry.value}' failed to load: {err}", file=sys.stderr)
            continue
        hook()


def register_env(
    env_id: str,
    factory: Factory | str | None = None,
    *,
    extra: str | None = None,
    requires: tuple[str, ...] = (),
    batched: bool = False,
    own_threads: bool = False,
    copies: int | None = None,
    **default_kwargs: Any,
) -> Any:
    """Register `factory` under `env_id`; without a factory, returns a decorator that registers its target.

    `batched=True`: the factory builds every copy at once (it takes `num_envs`, `device` and `seed`);
    `copies`: the `num_envs` a config that does not set it gets (for a batched simulator, the number
    at which it pays off)."""
    if not env_id or env_id != env_id.strip() or " " in env_id:
        raise EnvError(f"invalid env id {env_id!r}; use a name like 'myfamily/my_env_v0'")

    def add(target: Factory | str) -> Factory | str:
        _REGISTRY[env_id] = EnvSpec(
            env_id, target, dict(default_kwargs), extra, tuple(requires), batched, own_threads, copies
        )
        return target

    if factory is None:
        return add
    add(factory)
    return factory


def register_prefix(
    prefix: str,
    factory: Callable[..., Any],
    *,
    extra: str | None = None,
    requires: tuple[str, ...] = (),
    batched: bool = False,
    own_threads: bool = False,
    copies: int | None = None,
    names: Callable[[], list[str]] | None = None,
    closed: bool = True,
) -> None:
    """Make every id `prefix + rest` an env built by `factory(rest, **kwargs)` (registered ids win);
    `names` lists what the family offers (see IdFamily)."""
    if not prefix.endswith("/"):
        raise EnvError(f"invalid id prefix {prefix!r}; a prefix ends with '/', like 'gymnasium/'")
    _PREFIXES[prefix] = IdFamily(
        prefix, factory, extra, tuple(requires), batched, own_threads, copies, names, closed
    )


def id_families() -> list[IdFamily]:
    """The registered id prefixes, longest first (`pettingzoo/classic/` before `pettingzoo/`)."""
    _load_entry_points()
    return sorted(_PREFIXES.values(), key=lambda family: -len(family.prefix))


def registered_specs() -> list[EnvSpec]:
    """All registered specs, sorted by id."""
    _load_entry_points()
    return [_REGISTRY[env_id] for env_id in sorted(_REGISTRY)]


def registered_ids() -> list[str]:
    """All registered ids, sorted."""
    _load_entry_points()
    return sorted(_REGISTRY)


def env_spec(env_id: str) -> EnvSpec:
    """The spec of a registered id, or an EnvError listing close matches."""
    if env_id not in _REGISTRY:
        _load_entry_points()
    if env_id in _REGISTRY:
        return _REGISTRY[env_id]
    family = _family_of(env_id)
    if family is not None:
        return family.spec(env_id)
    if env_id.endswith(".py"):
        raise EnvError(
            f"env.id '{env_id}' names a Python file but not what in it builds the env; add it after a "
            f"colon: env.id={env_id}:make_env (a function or class of the file), or "
            f"env.id={env_id}:family/name (an id the file registers)"
        )
    close = difflib.get_close_matches(env_id, list(_REGISTRY), n=3, cutoff=0.5)
    if close:
        hint = f"did you mean {', '.join(repr(c) for c in close)}?"
    else:
        hint = (
            "run `marl-ppo envs` to list ids; for an id that a file of yours registers, name the file "
            f"first: env.id=path/to/file.py:{env_id}"
        )
    raise EnvError(f"unknown env id '{env_id}'; {hint}")


def default_copies(env_id: str) -> int | None:
    """The `num_envs` that `env_id`'s registration asks for when a config does not set it (see
    EnvSpec.copies); None for an unknown id (refused later, with its hint) or a bare callable."""
    try:
        name = registered_id(env_id)
    except EnvError:
        return None
    if name is None:
        return None
    if name not in _REGISTRY:
        _load_entry_points()
    if name in _REGISTRY:
        return _REGISTRY[name].copies
    family = _family_of(name)
    return None if family is None else family.copies


def _family_of(env_id: str) -> IdFamily | None:
    """The registered prefix family `env_id` belongs to (the longest prefix that matches), or None."""
    for family in sorted(_PREFIXES.values(), key=lambda family: -len(family.prefix)):
        if env_id.startswith(family.prefix) and len(env_id) > len(family.prefix):
            return family
    return None


def registered_id(env_id: str) -> str | None:
    """The registered id that `env_id` names, or None when it names a callable (`module:callable`).

    For `path/to/file.py:family/name` and `package.module:family/name` the file or module is loaded
    first (once per process), so that the `register_env` calls it makes have run.
    """
    source, _, name = env_id.rpartition(":")
    if not source:
        return env_id
    if "/" not in name:
        return None
    if source.endswith(".py"):
        _load_file(Path(source), env_id)
    else:
        _import_module(source, extra=None, env_id=env_id)
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1, cutoff=0.8)
        hint = (
            f"did you mean '{source}:{close[0]}'?"
            if close
            else f"it must call marl_ppo.register_env('{name}', ...) when loaded; check env.id"
        )
        raise EnvError(f"env '{env_id}': loading '{source}' registered no env '{name}'; {hint}")
    return name


def env_file(env_id: str) -> Path | None:
    """The user's Python file that `env_id` names (`path/to/file.py:name`), or None."""
    source, _, _ = env_id.rpartition(":")
    return Path(source) if source.endswith(".py") else None


def anchored(env_id: str) -> str:
    """`env_id` with its file (if it names one) as an absolute path: the same env from any directory."""
    path = env_file(env_id)
    if path is None or path.is_absolute():
        return env_id
    return f"{path.resolve()}:{env_id.rpartition(':')[2]}"


def moved(recorded: str, env_id: str) -> bool:
    """Whether `env_id` names the same callable or id as `recorded`, in a file of another path (the
    override that follows a user's env file to where it went)."""
    return (
        env_file(recorded) is not None
        and env_file(env_id) is not None
        and recorded.rpartition(":")[2] == env_id.rpartition(":")[2]
    )


def resolve_factory(env_id: str) -> tuple[Factory, dict[str, Any]]:
    """The factory behind an env id and its registered default kwargs."""
    name = registered_id(env_id)
    if name is not None:
        spec = env_spec(name)
        missing = spec.missing_modules
        if missing and spec.extra is not None:
            raise EnvError(_missing_extra(env_id, ", ".join(missing), spec.extra))
        return spec.load(), dict(spec.kwargs)
    target, _, attr = env_id.rpartition(":")
    if target.endswith(".py"):
        return _attr_of_file(_load_file(Path(target), env_id), Path(target), attr, env_id), {}
    return _import_attr(env_id, extra=None, env_id=env_id), {}


def make_env(env_id: str, /, **kwargs: Any) -> Any:
    """Build the environment exactly as its factory returns it (registered defaults, then `kwargs`;
    any name, `env_id` too, reaches the factory)."""
    factory, defaults = resolve_factory(env_id)
    try:
        return factory(**{**defaults, **kwargs})
    except EnvError:  # a factory's own one-line refusal
        raise
    except TypeError as err:
        raise EnvError(f"env '{env_id}' rejected its kwargs: {err}; check env.kwargs") from None
    except ModuleNotFoundError as err:
        name = registered_id(env_id)
        extra = _REGISTRY[name].extra if name in _REGISTRY else None
        if extra is None:
            raise _missing_module(env_id, "its factory", err) from None
        raise EnvError(_missing_extra(env_id, str(err.name), extra)) from None
    except Exception as err:
        raise _factory_failed(env_id, err) from err


def _factory_failed(env_id: str, err: Exception) -> EnvError:
    text = " ".join(str(err).split())
    return EnvError(
        f"env '{env_id}': its factory raised {type(err).__name__}: {text}; --debug shows the traceback"
    )


def _missing_extra(env_id: str, package: str, extra: str) -> str:
    return f"env '{env_id}' needs the optional package '{package}'; install it with: pip install 'marl-ppo[{extra}]'"


PIP_NAMES = {
    "cv2": "opencv-python",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "OpenGL": "PyOpenGL",
}
"""Distribution names of well-known modules whose `pip install` name differs from their import name."""


def _extra_providing(module: str) -> str | None:
    """The marl-ppo extra that installs top-level `module` (a module a registered env needs), or None."""
    _load_entry_points()
    for spec in _REGISTRY.values():
        needs = spec.requires
        if not needs and isinstance(spec.entry_point, str):
            needs = (spec.entry_point.partition(":")[0].split(".")[0],)
        if spec.extra is not None and module in needs:
            return spec.extra
    for family in _PREFIXES.values():
        if family.extra is not None and module in family.requires:
            return family.extra
    return None


def _missing_module(
    env_id: str, needed_by: str, err: ModuleNotFoundError, *, beside: Path | None = None
) -> EnvError:
    """A module that an env's code imports cannot be found: name it and what brings it.

    Only a package that one of marl-ppo's extras installs (or a well-known module with another pip
    name) gets a `pip install`: any other name may be the user's own code, and installing whatever
    the registry holds under that name would be wrong and unsafe."""
    if not err.name:
        return _factory_failed(env_id, err)
    top = err.name.split(".")[0]
    extra = _extra_providing(top)
    if extra is not None:
        fix = f"install it with: pip install 'marl-ppo[{extra}]'"
    elif top in PIP_NAMES:
        fix = f"install it with: pip install {PIP_NAMES[top]}"
    else:
        where = f"next to {beside} " if beside is not None else ""
        fix = (
            f"no {top}.py or {top}/ was found {where}or on the import path (PYTHONPATH); if it is your "
            f"own code, put it there or add its folder to PYTHONPATH, else install the package that provides it"
        )
    return EnvError(f"env '{env_id}': {needed_by} imports '{err.name}', which cannot be found; {fix}")


def _names_missing(module_name: str, err: ModuleNotFoundError) -> bool:
    """Whether the module the id names (or a package on its path) is what is missing, rather than a
    module that it imports."""
    return err.name is not None and (module_name == err.name or module_name.startswith(err.name + "."))


def _import_attr(entry_point: str, *, extra: str | None, env_id: str) -> Factory:
    module_name, _, attr = entry_point.partition(":")
    module = _import_module(module_name, extra=extra, env_id=env_id)
    try:
        factory: Factory = getattr(module, attr)
    except AttributeError:
        raise EnvError(
            f"env '{env_id}': module '{module_name}' has no attribute '{attr}'; check env.id"
        ) from None
    if not callable(factory):
        raise EnvError(f"env '{env_id}': '{entry_point}' is not callable; point env.id at a factory function")
    return factory


def _import_module(module_name: str, *, extra: str | None, env_id: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if extra is not None:
            raise EnvError(_missing_extra(env_id, str(err.name), extra)) from None
        if not _names_missing(module_name, err):
            raise _missing_module(env_id, f"module '{module_name}'", err) from None
        raise EnvError(
            f"env '{env_id}': cannot import module '{module_name}' ({err}); check env.id"
        ) from None
    except Exception as err:  # a syntax error or a failing import inside the module
        raise EnvError(
            f"env '{env_id}': importing module '{module_name}' raised {type(err).__name__}: "
            f"{' '.join(str(err).split())}; --debug shows the traceback"
        ) from err


def _load_file(path: Path, env_id: str) -> Any:
    """The module of a user's `file.py`, executed once per process (its `register_env` calls included)."""
    if not path.is_file():
        raise EnvError(
            f"env '{env_id}': file '{path}' does not exist; check env.id, or if the file moved, point to it "
            f"with env.id=NEW/PATH/{path.name}:{env_id.rpartition(':')[2]}"
        )
    # named by the file's absolute path, the same in every process: pickled env copies (a resumed
    # run's env states) find their classes again once the file is loaded
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    module_name = f"marl_ppo_user_env_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise EnvError(f"env '{env_id}': cannot load '{path}' as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        _importable_folder(path)
        try:
            spec.loader.exec_module(module)
        except ModuleNotFoundError as err:  # the file imports a package that is not installed
            del sys.modules[module_name]
            raise _missing_module(env_id, f"'{path}'", err, beside=path.resolve().parent) from None
        except Exception as err:  # a syntax error or a failing import inside the file
            del sys.modules[module_name]
            raise EnvError(
                f"env '{env_id}': loading '{path}' raised {type(err).__name__}: "
                f"{' '.join(str(err).split())}; --debug shows the traceback"
            ) from err
    return module


def _importable_folder(path: Path) -> None:
    """Put the folder of a user's env file on the import path, as Python does for a script it runs,
    so that the file can import the modules beside it (`from predator import Predator`)."""
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _attr_of_file(module: Any, path: Path, attr: str, env_id: str) -> Factory:
    factory: Factory | None = getattr(module, attr, None)
    if not callable(factory):
        raise EnvError(f"env '{env_id}': '{path}' defines no callable '{attr}'; check env.id")
    return factory
