"""Every scenario of an installed family by id: `vmas/<scenario>`, `magent2/<env>` and
`pettingzoo/<family>/<env>`, beside the catalog's ids (which have experiment files).

Each family is an id prefix (`registry.register_prefix`) whose names are read from the installed
package, so `marl-ppo envs` lists what the installed version offers, and an unknown name is refused
with the closest ones. Listing a family imports nothing of its envs: names come from the package's
module files (MAgent2, PettingZoo, and VMAS's scenario folders).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path
from typing import Any

from marl_ppo.envs.registry import EnvError, make_env, register_prefix, registered_ids

ENV_MODULE = re.compile(r"^[a-z0-9_]+_v\d+$")

VMAS_COPIES = 1024
"""VMAS's `num_envs` when a config does not set it: its batched simulator pays off with many copies
(flocking on 2 CPU cores: 80 env steps/s with 16 copies, about 1,100 with 1,024)."""
"""A versioned env module (`battle_v4`, `hanabi_v5`), as MAgent2 and PettingZoo name them."""

PETTINGZOO_FAMILIES = {
    # family: (extra, modules its envs need beyond pettingzoo); atari needs ROM files no registry ships
    "butterfly": ("butterfly", ("pygame", "pymunk")),
    "classic": ("classic", ("pygame",)),
    "sisl": ("sisl", ("pygame", "Box2D")),
}
PETTINGZOO_CLASSIC_NEEDS = {
    # classic games whose engines come from other packages (the `classic` extra installs them)
    "chess_v6": ("chess",),
    "go_v5": (),
    "hanabi_v5": ("pyspiel", "shimmy"),
    "leduc_holdem_v4": ("rlcard",),
    "texas_holdem_v4": ("rlcard",),
    "texas_holdem_no_limit_v6": ("rlcard",),
    "gin_rummy_v4": ("rlcard",),
}


def env_modules(package: str) -> list[str]:
    """The versioned env modules of `package` (dotted), read from its files: nothing is imported, not
    even the top package (whose own imports would load numpy or gymnasium for `marl-ppo envs`)."""
    top, *rest = package.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.submodule_search_locations is None:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    return sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if ENV_MODULE.match(m.name))


def vmas_names() -> list[str]:
    """VMAS's scenarios, MPE ports and debug scenarios included, read from its scenario files
    (importing vmas would import torch, which `marl-ppo envs` does not)."""
    spec = importlib.util.find_spec("vmas")
    if spec is None or spec.submodule_search_locations is None:
        return []
    root = Path(next(iter(spec.submodule_search_locations))) / "scenarios"
    folders = [str(root / sub) for sub in ("", "mpe", "debug")]
    return sorted({m.name for m in pkgutil.iter_modules(folders) if not m.ispkg})


def make_vmas(scenario: str, /, *, num_envs: int = 32, device: str = "cpu", **kwargs: Any) -> Any:
    """The raw batched VMAS environment (terminated and truncated kept apart, dict spaces)."""
    import vmas

    kwargs.setdefault("continuous_actions", True)
    kwargs.setdefault("max_steps", 100)
    return vmas.make_env(
        scenario=scenario,
        num_envs=num_envs,
        device=device,
        dict_spaces=True,
        terminated_truncated=True,
        **kwargs,
    )


def magent2_names() -> list[str]:
    """MAgent2's environments (`battle_v4`, `tiger_deer_v4`, ...)."""
    return env_modules("magent2.environments")


def make_magent2(name: str, **kwargs: Any) -> Any:
    """A MAgent2 environment's parallel env."""
    module = importlib.import_module(f"magent2.environments.{name}")
    return module.parallel_env(**kwargs)


def pettingzoo_names() -> list[str]:
    """`<family>/<env>` for every env of PettingZoo's butterfly, classic and sisl families."""
    return [
        f"{family}/{env}" for family in PETTINGZOO_FAMILIES for env in env_modules(f"pettingzoo.{family}")
    ]


def make_pettingzoo(name: str, **kwargs: Any) -> Any:
    """A PettingZoo env by `<family>/<env>`: its parallel env, or its AEC env for turn-based games; an
    env the catalog lists (`sisl/multiwalker_v9`) is built as the catalog builds it."""
    if name in registered_ids():
        return make_env(name, **kwargs)
    family, _, env = name.partition("/")
    extra, modules = PETTINGZOO_FAMILIES[family]
    needs = (*modules, *(PETTINGZOO_CLASSIC_NEEDS.get(env, ()) if family == "classic" else ()))
    missing = [module for module in needs if importlib.util.find_spec(module) is None]
    if missing:
        raise EnvError(
            f"env 'pettingzoo/{name}' needs the optional package '{missing[0]}'; install it with: "
            f"pip install 'marl-ppo[{extra}]'"
        )
    module = importlib.import_module(f"pettingzoo.{family}.{env}")
    if hasattr(module, "parallel_env") and not _turn_based(module):
        return module.parallel_env(**kwargs)
    return module.env(**kwargs)


def _turn_based(module: Any) -> bool:
    """Whether a PettingZoo env module is a turn-based game (its raw env is an AEC env that is not
    parallelizable), which is played move by move."""
    raw = getattr(module, "raw_env", None)
    return raw is not None and not getattr(raw, "metadata", {}).get("is_parallelizable", False)


def register_families() -> None:
    """The `vmas/`, `magent2/` and `pettingzoo/` prefixes (registered catalog ids win over them)."""
    register_prefix(
        "vmas/",
        make_vmas,
        extra="vmas",
        requires=("vmas",),
        batched=True,
        copies=VMAS_COPIES,
        names=vmas_names,
    )
    register_prefix("magent2/", make_magent2, extra="magent2", requires=("magent2",), names=magent2_names)
    register_prefix(
        "pettingzoo/", make_pettingzoo, extra="classic", requires=("pettingzoo",), names=pettingzoo_names
    )
