"""The `jaxmarl/*` ids, an id family registered through its own `marl_ppo.envs` entry point (imports
nothing until an env is built or listed).

Every id is a batched env: its factory builds all E copies as one `JaxVectorEnv` (extra `jax`).
"""

from __future__ import annotations

from typing import Any

from marl_ppo.envs.registry import EnvError, register_prefix

JAX_REQUIRES = ("jax", "jaxmarl")

JAX_COPIES = 64
"""JaxMARL's `num_envs` when a config does not set it: the copies step as one compiled batch, whose
cost grows far slower than the number of copies."""


def make_jaxmarl(
    name: str, *, num_envs: int = 64, device: str = "cpu", seed: int | None = None, **kwargs: Any
) -> Any:
    """All `num_envs` copies of the JaxMARL env `name` (a key of `jaxmarl_families()`) as one vector env.

    JAX runs on its default device; its arrays reach torch by DLPack, and the collector moves them to
    the training device where that differs. `seed` is unused: `reset(seed)` seeds every copy.
    """
    from marl_ppo.envs.jax.families import jaxmarl_families
    from marl_ppo.envs.jax.runtime import jax_modules
    from marl_ppo.envs.jax.vector import jax_vector_env

    jax_modules()  # a missing JAX fails here in one line, and the compilation cache is on
    family = jaxmarl_families()[name]
    try:
        env = family.make(**kwargs)
    except TypeError as err:
        raise EnvError(f"env 'jaxmarl/{name}' rejected its kwargs: {err}; check env.kwargs") from None
    return jax_vector_env(env, family, f"jaxmarl/{name}", num_envs)


def reports_shaped_reward(env_id: str) -> bool:
    """The env of `env_id` reports a shaped reward (a JaxMARL family with one: Overcooked)."""
    from marl_ppo.envs.jax.families import jaxmarl_families

    prefix, _, name = env_id.partition("/")
    family = jaxmarl_families().get(name) if prefix == "jaxmarl" else None
    return family is not None and family.shaped_reward


def family_names() -> list[str]:
    """Every name after `jaxmarl/` (SMAX maps, Overcooked layouts, Hanabi, MPE scenarios)."""
    from marl_ppo.envs.jax.families import jaxmarl_families

    return sorted(jaxmarl_families())


def register_jaxmarl() -> None:
    """Register the `jaxmarl/` id family: every name of `family_names()`, an unknown one refused with
    the closest."""
    register_prefix(
        "jaxmarl/",
        make_jaxmarl,
        extra="jax",
        requires=JAX_REQUIRES,
        batched=True,
        own_threads=True,
        copies=JAX_COPIES,
        names=family_names,
    )
