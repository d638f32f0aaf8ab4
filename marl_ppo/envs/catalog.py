"""The standard benchmark catalog: ids, factories and the optional extra that provides each family.

Registering imports nothing: every factory imports its package when an env is built. Families and
their extras (`pip install 'marl-ppo[EXTRA]'`):
- `mpe2/*` (mpe): every mpe2 scenario;
- `sisl/*` (sisl): multiwalker (its time limit reported as truncation), pursuit (PettingZoo 1.27 no
  longer ships waterworld);
- `butterfly/*` (butterfly): pistonball, cooperative_pong, knights_archers_zombies;
- `classic/*` (classic): rock-paper-scissors (parallel), connect four, tic-tac-toe and Hanabi
  (turn-based); the seats share one policy (self-play); Kuhn and Leduc poker (turn-based, OpenSpiel's
  games through Shimmy, `marl_ppo.envs.openspiel`), whose exploitability OpenSpiel computes;
- `lbf/*` (lbf) and `rware/*` (rware): Gymnasium multi-agent envs, time limits reported as truncation;
- `magent2/battle_v4` (magent2): two armies of many agents;
- `vmas/*` (vmas): VMAS scenarios as one batched simulator whose tensors stay on the training device;
- `mamujoco/<Scenario>-<split>` (mamujoco): multi-agent MuJoCo, any scenario and agent split
  (`marl_ppo.envs.mamujoco`); the ids with experiment files are registered, the others built by prefix;
- `vmas/<scenario>`, `magent2/<env>` and `pettingzoo/<family>/<env>`: every scenario of those installed
  families (`marl_ppo.envs.families`).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from marl_ppo.envs import families
from marl_ppo.envs.families import VMAS_COPIES, make_vmas
from marl_ppo.envs.registry import EnvError, Factory, register_env, register_prefix

MPE2_SCENARIOS = (
    "simple_v3",
    "simple_adversary_v3",
    "simple_crypto_v3",
    "simple_push_v3",
    "simple_reference_v3",
    "simple_speaker_listener_v4",
    "simple_spread_v3",
    "simple_tag_v3",
    "simple_world_comm_v3",
)

PETTINGZOO_PARALLEL = {
    # our id: (PettingZoo registry id, extra, modules it needs)
    "sisl/multiwalker_v9": ("sisl/multiwalker-v9", "sisl", ("pettingzoo", "Box2D", "pygame")),
    "sisl/pursuit_v5": ("sisl/pursuit-v5", "sisl", ("pettingzoo", "pygame")),
    "butterfly/pistonball_v6": ("butterfly/pistonball-v6", "butterfly", ("pettingzoo", "pymunk", "pygame")),
    "butterfly/cooperative_pong_v6": ("butterfly/cooperative_pong-v6", "butterfly", ("pettingzoo", "pygame")),
    "butterfly/knights_archers_zombies_v11": (
        "butterfly/knights_archers_zombies-v11",
        "butterfly",
        ("pettingzoo", "pygame"),
    ),
    "classic/rps_v2": ("classic/rps-v2", "classic", ("pettingzoo", "pygame")),
}

PETTINGZOO_AEC = {  # turn-based games, played move by move (marl_ppo.envs.adapters.aec)
    "classic/connect_four_v3": "classic/connect_four-v3",
    "classic/tictactoe_v3": "classic/tictactoe-v3",
}

OPENSPIEL_GAMES = {  # turn-based OpenSpiel games small enough for OpenSpiel to solve exactly
    "classic/kuhn_poker": "kuhn_poker",
    "classic/leduc_poker": "leduc_poker",
}
"""Our id -> OpenSpiel's game name; env.kwargs are the game's parameters (e.g. `players: 3`)."""

LBF_TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    # EPyMARL's task list; lbforaging registers at most 4 food, so the 5-food tasks set max_num_food
    "Foraging-8x8-2p-2f-coop-v3": ("Foraging-8x8-2p-2f-coop-v3", {}),
    "Foraging-2s-8x8-2p-2f-coop-v3": ("Foraging-2s-8x8-2p-2f-coop-v3", {}),
    "Foraging-10x10-3p-3f-v3": ("Foraging-10x10-3p-3f-v3", {}),
    "Foraging-2s-10x10-3p-3f-v3": ("Foraging-2s-10x10-3p-3f-v3", {}),
    "Foraging-15x15-3p-5f-v3": ("Foraging-15x15-3p-4f-v3", {"max_num_food": 5}),
    "Foraging-15x15-4p-3f-v3": ("Foraging-15x15-4p-3f-v3", {}),
    "Foraging-15x15-4p-5f-v3": ("Foraging-15x15-4p-4f-v3", {"max_num_food": 5}),
}
DRAWN_BUTTERFLY = ("butterfly/pistonball_v6", "butterfly/cooperative_pong_v6")
"""Butterfly envs whose observations are drawn only under a render mode (see `drawn_butterfly`)."""
VMAS_SCENARIOS = ("navigation", "balance", "sampling", "transport", "wheel", "dispersion", "give_way")

RWARE_TASKS = ("rware-tiny-2ag-v2", "rware-tiny-4ag-v2", "rware-small-4ag-v2")

MAMUJOCO_TASKS = ("HalfCheetah-2x3", "Ant-4x2", "Walker2d-2x3")
"""MaMuJoCo ids with experiment files (HARL's MAPPO tasks); every other split builds through the prefix."""
MAMUJOCO_MODULES = ("gymnasium_robotics", "mujoco")


def pettingzoo_parallel(name: str, /, **kwargs: Any) -> Any:
    """A PettingZoo ParallelEnv from PettingZoo's own registry."""
    import pettingzoo

    return pettingzoo.make("parallel", name, **kwargs)


def drawn_butterfly(name: str, env_id: str, /, **kwargs: Any) -> Any:
    """A Butterfly pixel env (pistonball, cooperative_pong) that draws its frames every step.

    These envs draw their screen, which their observations and state are read from, only when a render
    mode is set: without one every observation stays the first frame of the episode. `rgb_array` is
    the default here (the user's `render_mode` wins, unless it is None).
    """
    if "render_mode" in kwargs and kwargs["render_mode"] is None:
        raise EnvError(
            f"env '{env_id}' draws its observations only with a render mode, so render_mode=None would "
            "freeze every frame; drop env.kwargs.render_mode (rgb_array is the default) or set 'human'"
        )
    kwargs.setdefault("render_mode", "rgb_array")
    return pettingzoo_parallel(name, **kwargs)


def multiwalker(**kwargs: Any) -> Any:
    """SISL's multiwalker, whose time limit ends an episode by truncation rather than termination.

    PettingZoo's multiwalker marks every walker terminated once `max_cycles` frames have passed, so a
    walker still carrying the package at the limit would get no bootstrap. The AEC core's `step` is
    wrapped on the instance, which leaves PettingZoo's wrappers as they are; a walker whose own step
    ended it (a fall, the package dropped or delivered: the core's `last_dones`) stays terminated.
    """
    env = pettingzoo_parallel("sisl/multiwalker-v9", **kwargs)
    core = env.aec_env.unwrapped
    core_step = core.step

    def step(action: Any) -> None:
        core_step(action)
        if core.env.frames >= core.env.max_cycles:
            for agent in core.agents:
                if not core.env.last_dones[core.possible_agents.index(agent)]:
                    core.terminations[agent] = False
                    core.truncations[agent] = True

    core.step = step
    return env


def pettingzoo_aec(name: str, /, **kwargs: Any) -> Any:
    """A PettingZoo AEC (turn-based) env from PettingZoo's own registry."""
    import pettingzoo

    return pettingzoo.make("aec", name, **kwargs)


def openspiel_game(game_name: str, /, **params: Any) -> Any:
    """An OpenSpiel game as a PettingZoo AEC env observing information states (`marl_ppo.envs.openspiel`)."""
    from marl_ppo.envs.openspiel import InformationStateGame

    return InformationStateGame(game_name, params)


def gymnasium_team(gym_id: str, package: str, /, **kwargs: Any) -> Any:
    """An env of a package that registers its ids with Gymnasium (LBF, RWARE), as a team."""
    importlib.import_module(package)  # registers its ids with gymnasium
    # Gymnasium's passive checker tests the single-agent API and warns on these envs' per-agent reward
    # lists, which GymnasiumTeamEnv reads as intended (and its adapter checks every step)
    kwargs.setdefault("disable_env_checker", True)
    return gymnasium_id(gym_id, **kwargs)


def gymnasium_id(gym_id: str, /, **kwargs: Any) -> Any:
    """Any id of Gymnasium's registry as a team (one agent, or one per element of Tuple spaces)."""
    import gymnasium

    from marl_ppo.envs.adapters.gymnasium import GymnasiumTeamEnv

    try:
        env = gymnasium.make(gym_id, **kwargs)
    except gymnasium.error.Error as err:
        raise EnvError(f"Gymnasium env '{gym_id}': {err}") from None
    return GymnasiumTeamEnv(env)


def _slug(gym_id: str) -> str:
    return gym_id.lower().replace("-", "_")


def register_catalog() -> None:
    """Register every catalog id and the `gymnasium/` prefix (cheap: nothing is imported).

    Called through the `marl_ppo.envs` entry point, as any other package's envs are.
    """
    register_prefix("gymnasium/", gymnasium_id)
    for name in MPE2_SCENARIOS:
        register_env(f"mpe2/{name}", f"mpe2.{name}:parallel_env", extra="mpe")
    for env_id, (name, extra, modules) in PETTINGZOO_PARALLEL.items():
        factory: Factory
        if env_id in DRAWN_BUTTERFLY:
            factory = functools.partial(drawn_butterfly, name, env_id)
        elif env_id == "sisl/multiwalker_v9":
            factory = multiwalker
        else:
            factory = functools.partial(pettingzoo_parallel, name)
        register_env(env_id, factory, extra=extra, requires=modules)
    for env_id, name in PETTINGZOO_AEC.items():
        factory = functools.partial(pettingzoo_aec, name)
        register_env(env_id, factory, extra="classic", requires=("pettingzoo", "pygame"))
    for task, (gym_id, kwargs) in LBF_TASKS.items():
        factory = functools.partial(gymnasium_team, gym_id, "lbforaging")
        register_env(f"lbf/{_slug(task)}", factory, extra="lbf", requires=("lbforaging",), **kwargs)
    for task in RWARE_TASKS:
        factory = functools.partial(gymnasium_team, task, "rware")
        register_env(f"rware/{_slug(task)}", factory, extra="rware", requires=("rware",))
    for scenario in VMAS_SCENARIOS:
        factory = functools.partial(make_vmas, scenario)
        register_env(
            f"vmas/{scenario}", factory, extra="vmas", requires=("vmas",), batched=True, copies=VMAS_COPIES
        )
    register_mamujoco()
    register_hanabi()
    for env_id, game_name in OPENSPIEL_GAMES.items():
        factory = functools.partial(openspiel_game, game_name)
        register_env(env_id, factory, extra="classic", requires=("pyspiel", "shimmy"))
    families.register_families()
    register_env(
        "magent2/battle_v4",
        "magent2.environments.battle_v4:parallel_env",
        extra="magent2",
        requires=("magent2",),
        map_size=20,
    )


def register_mamujoco() -> None:
    """The MaMuJoCo ids: the tasks with experiment files, and `mamujoco/` for every scenario and split."""
    from marl_ppo.envs import mamujoco

    for task in MAMUJOCO_TASKS:
        factory = functools.partial(mamujoco.make_mamujoco, task)
        register_env(f"mamujoco/{task}", factory, extra="mamujoco", requires=MAMUJOCO_MODULES)
    register_prefix(
        "mamujoco/",
        mamujoco.make_mamujoco,
        extra="mamujoco",
        requires=MAMUJOCO_MODULES,
        names=mamujoco.names,
        closed=False,
    )


def register_hanabi() -> None:
    """Hanabi through PettingZoo (OpenSpiel's game through Shimmy), turn-based: two-player Hanabi-Full
    (5 colours, 5 ranks, hand of 5, 8 hint and 3 life tokens) unless env.kwargs say otherwise."""
    register_env(
        "classic/hanabi_v5",
        "marl_ppo.envs.openspiel:hanabi",
        extra="classic",
        requires=("pettingzoo", "pyspiel", "shimmy"),
    )
