"""The JaxMARL envs marl_ppo offers, and what each family needs beyond JaxMARL's common API.

JaxMARL's envs share `reset(key)` and `step_env(key, state, actions)` over dicts keyed by agent, but
differ in where their action masks come from, how an episode's end splits into termination and a
time limit, and whether an episode can be won. A `JaxFamily` holds those differences as values, so the
one vector env (`marl_ppo.envs.jax.vector`) steps every family the same way. Each function here runs
inside `jax.jit`: it takes the raw env and one copy's state and returns JAX arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SMAX_MAPS = (
    "3m",
    "2s3z",
    "25m",
    "3s5z",
    "8m",
    "5m_vs_6m",
    "10m_vs_11m",
    "27m_vs_30m",
    "3s5z_vs_3s6z",
    "3s_vs_5z",
    "6h_vs_8z",
    "smacv2_5_units",
    "smacv2_10_units",
    "smacv2_20_units",
)
"""SMAX's maps (jaxmarl.environments.smax.MAP_NAME_TO_SCENARIO), against its heuristic enemy."""

OVERCOOKED_LAYOUTS = ("cramped_room", "asymm_advantages", "coord_ring", "forced_coord", "counter_circuit")
"""Overcooked's layouts (jaxmarl.environments.overcooked.overcooked_layouts)."""

MPE_SCENARIOS = (
    "simple_v3",
    "simple_spread_v3",
    "simple_adversary_v3",
    "simple_crypto_v3",
    "simple_push_v3",
    "simple_reference_v3",
    "simple_speaker_listener_v4",
    "simple_tag_v3",
    "simple_world_comm_v3",
)
"""JaxMARL's ports of the MPE scenarios (`MPE_<name>`)."""


def _never(env: Any, state: Any) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(False)


def _step_limit(env: Any, state: Any) -> Any:
    """The episode reached the env's `max_steps` (MPE, Overcooked end only there)."""
    return state.step >= env.max_steps


@dataclass(frozen=True)
class JaxFamily:
    """What one family of JaxMARL envs needs beyond the common API; every function runs under jit."""

    name: str
    make: Callable[..., Any]
    """`make(**env_kwargs)`: the raw JaxMARL env."""
    masks: Callable[[Any, Any], dict[str, Any]] | None = None
    """`masks(env, state)`: per agent, the actions allowed next; None: every action always is."""
    time_limit: Callable[[Any, Any], Any] = _never
    """`time_limit(env, state)` of a finished episode: True when it ended by the time limit (truncation)
    rather than by reaching a terminal state."""
    won: Callable[[Any, Any], Any] | None = None
    """`won(env, state)` of a finished episode: True when the team won it (logged as a win rate)."""
    world_state: bool = False
    """The env puts the global state in its observations under `world_state`; else the critic's state
    is every agent's observation, concatenated."""
    shaped_reward: bool = False
    """The env's step reports a shaped reward per agent in its info under `shaped_reward` (learned
    from with `env.shaped_reward`)."""


def make_smax(map_name: str, **kwargs: Any) -> Any:
    """SMAX on `map_name` against JaxMARL's heuristic enemy (`HeuristicEnemySMAX`)."""
    import jaxmarl
    from jaxmarl.environments.smax import map_name_to_scenario

    return jaxmarl.make("HeuristicEnemySMAX", scenario=map_name_to_scenario(map_name), **kwargs)


def _smax_sides(env: Any, state: Any) -> tuple[Any, Any]:
    """Whether any ally, and any enemy, is still alive."""
    alive = state.state.unit_alive
    return alive[: env.num_allies].any(), alive[env.num_allies :].any()


def _smax_time_limit(env: Any, state: Any) -> Any:
    allies, enemies = _smax_sides(env, state)
    return allies & enemies  # nobody won: the step limit ended it


def _smax_won(env: Any, state: Any) -> Any:
    allies, enemies = _smax_sides(env, state)
    return allies & ~enemies


def _smax_masks(env: Any, state: Any) -> dict[str, Any]:
    masks: dict[str, Any] = env.get_avail_actions(state)
    return masks


def make_overcooked(layout: str, **kwargs: Any) -> Any:
    """Overcooked (JaxMARL's first version) on `layout`; its 400-step episodes end only by the limit."""
    import warnings

    import jaxmarl
    from jaxmarl.environments.overcooked import overcooked_layouts

    with warnings.catch_warnings():  # it recommends OvercookedV2, whose layouts differ from the papers'
        warnings.simplefilter("ignore", DeprecationWarning)
        return jaxmarl.make("overcooked", layout=overcooked_layouts[layout], **kwargs)


def make_hanabi(**kwargs: Any) -> Any:
    """Hanabi (JaxMARL's port; two players, full game by default)."""
    import jaxmarl

    return jaxmarl.make("hanabi", **kwargs)


def _hanabi_masks(env: Any, state: Any) -> dict[str, Any]:
    masks: dict[str, Any] = env.get_legal_moves(state)
    return masks


def make_mpe(scenario: str, **kwargs: Any) -> Any:
    """JaxMARL's MPE port of `scenario` (discrete actions)."""
    import jaxmarl

    return jaxmarl.make(f"MPE_{scenario}", **kwargs)


def smax(map_name: str) -> JaxFamily:
    """The family record of SMAX on `map_name`."""
    return JaxFamily(
        "smax",
        lambda **kwargs: make_smax(map_name, **kwargs),
        masks=_smax_masks,
        time_limit=_smax_time_limit,
        won=_smax_won,
        world_state=True,
    )


def overcooked(layout: str) -> JaxFamily:
    """The family record of Overcooked on `layout`."""
    return JaxFamily(
        "overcooked",
        lambda **kwargs: make_overcooked(layout, **kwargs),
        time_limit=_step_limit,
        shaped_reward=True,
    )


def hanabi() -> JaxFamily:
    """The family record of Hanabi: legal moves as masks, episodes that end only when the game does."""
    return JaxFamily("hanabi", make_hanabi, masks=_hanabi_masks)


def mpe(scenario: str) -> JaxFamily:
    """The family record of an MPE scenario."""
    return JaxFamily("mpe", lambda **kwargs: make_mpe(scenario, **kwargs), time_limit=_step_limit)


def jaxmarl_families() -> dict[str, JaxFamily]:
    """Every `jaxmarl/<name>` id's family record, keyed by the name."""
    families = {f"smax_{name}": smax(name) for name in SMAX_MAPS}
    families.update({f"overcooked_{layout}": overcooked(layout) for layout in OVERCOOKED_LAYOUTS})
    families["hanabi"] = hanabi()
    families.update({f"mpe_{scenario}": mpe(scenario) for scenario in MPE_SCENARIOS})
    return families
