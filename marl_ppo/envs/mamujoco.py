"""Multi-agent MuJoCo (MaMuJoCo, from Gymnasium-Robotics): `mamujoco/<Scenario>-<agent split>` ids.

A MuJoCo robot's joints are split between agents (`HalfCheetah-2x3`: two agents of three joints
each); every agent is paid the robot's reward, each observes its own joints (and `agent_obsk` joints
further, an `env.kwargs` key, with the other keys of `mamujoco_v1.parallel_env` and of the MuJoCo
env below it). The critic's state is the single-agent MuJoCo observation (`state_space` is set
here; the library gives `state()` only). The 1,000-step limit of the MuJoCo envs ends an episode
as a truncation, a fall (Ant, Walker2d, Hopper, Humanoid) as a termination.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata
import io
import re
import warnings
from typing import Any

from marl_ppo.envs.registry import EnvError

SPLITS: dict[str, tuple[str, ...]] = {
    # scenario: the agent splits Gymnasium-Robotics 1.4 defines for it ("None": one agent, every joint)
    "HalfCheetah": ("2x3", "6x1"),
    "Ant": ("2x4", "2x4d", "4x2"),
    "Hopper": ("3x1",),
    "Walker2d": ("2x3",),
    "Humanoid": ("9|8",),
    "HumanoidStandup": ("9|8",),
    "Reacher": ("2x1",),
    "Swimmer": ("2x1",),
    "Pusher": ("3p",),
    "CoupledHalfCheetah": ("1p1",),
    "ManySegmentSwimmer": ("10x2",),  # any NxK: N agents of K segments
    "ManySegmentAnt": ("2x3",),  # any NxK
}
ANY_SPLIT = ("ManySegmentSwimmer", "ManySegmentAnt")
"""Scenarios whose robot is generated for the split, so every `NxK` builds."""


LIBRARY_FAULTS: dict[str, tuple[tuple[int, ...], tuple[int, ...], str]] = {
    # scenario: (the first MuJoCo version, the last Gymnasium-Robotics version, why they fail together)
    "CoupledHalfCheetah": (
        (3, 6),
        (1, 4, 2),
        "Gymnasium-Robotics 1.4.2 and earlier read MuJoCo's tendon Jacobian `ten_J` as a dense matrix, "
        "which MuJoCo 3.6 made sparse; pip install 'mujoco<3.6' to build it",
    ),
}
"""Scenarios whose observation fails inside the libraries at these versions; not listed there."""


def names() -> list[str]:
    """The `<Scenario>-<split>` names the family lists (ManySegment robots take any NxK), less those
    the installed libraries fail to build."""
    return [
        f"{scenario}-{split}"
        for scenario, splits in SPLITS.items()
        if library_fault(scenario) is None
        for split in splits
    ]


def library_fault(scenario: str) -> str | None:
    """Why the installed MuJoCo and Gymnasium-Robotics fail to build `scenario`, or None where they build it."""
    if scenario not in LIBRARY_FAULTS:
        return None
    first_mujoco, last_robotics, why = LIBRARY_FAULTS[scenario]
    mujoco, robotics = _version("mujoco"), _version("gymnasium-robotics")
    if mujoco is None or robotics is None:  # not installed: building names the extra to install
        return None
    return why if mujoco >= first_mujoco and robotics <= last_robotics else None


def _version(distribution: str) -> tuple[int, ...] | None:
    """The installed release of `distribution` as numbers (`(3, 6, 0)`), without importing it."""
    try:
        text = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def make_mamujoco(name: str, /, **kwargs: Any) -> Any:
    """The MaMuJoCo parallel env `name` (`HalfCheetah-2x3`), with a `state_space` for the critic."""
    scenario, split = _parse(name)
    fault = library_fault(scenario)
    if fault is not None:
        raise EnvError(f"env 'mamujoco/{name}' does not build with the installed libraries: {fault}")
    # importing gymnasium_robotics prints a notice about its Adroit hand envs, unrelated to MaMuJoCo, to
    # stderr, once per process (every rollout worker): it is kept out of the run's output
    with contextlib.redirect_stderr(io.StringIO()):
        from gymnasium_robotics import mamujoco_v1
    _mujoco_warnings_as_python_warnings()
    env = mamujoco_v1.parallel_env(scenario, None if split == "None" else split, **kwargs)
    env.state_space = env.single_agent_env.observation_space
    return env


def _mujoco_warnings_as_python_warnings() -> None:
    """Route MuJoCo's warnings through Python's `warnings` (once per message and place, filterable).

    MuJoCo prints each warning itself, so the deprecation it finds in Gymnasium's own robot files
    (`settotalmass`) would print once per env copy. A handler the user installed is left in place.
    """
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_warn)


def _warn(text: str) -> None:
    warnings.warn(f"MuJoCo: {text}", RuntimeWarning, stacklevel=2)


def _parse(name: str) -> tuple[str, str]:
    scenario, _, split = name.partition("-")
    if scenario not in SPLITS or not split:
        close = difflib.get_close_matches(name, names(), n=3, cutoff=0.5)
        hint = ", ".join(f"'mamujoco/{c}'" for c in close) or "'mamujoco/HalfCheetah-2x3'"
        raise EnvError(
            f"unknown env id 'mamujoco/{name}'; ids are mamujoco/<Scenario>-<split> with a scenario of "
            f"{', '.join(SPLITS)} (closest: {hint})"
        )
    if split not in (*SPLITS[scenario], "None") and not (scenario in ANY_SPLIT and _is_nxk(split)):
        raise EnvError(
            f"unknown env id 'mamujoco/{name}': {scenario} splits as "
            f"{', '.join(SPLITS[scenario])}{' or any NxK' if scenario in ANY_SPLIT else ''}, "
            "or None (one agent)"
        )
    return scenario, split


def _is_nxk(split: str) -> bool:
    agents, _, segments = split.partition("x")
    return agents.isdigit() and segments.isdigit() and int(agents) > 0 and int(segments) > 0
