"""Users' env files, as a newcomer writes them: the README's `my_env.py` (copied here, so that the tests
keep the env a README reader starts from even when the README's example changes)."""

from pathlib import Path

RENDEZVOUS = """import numpy as np
from gymnasium.spaces import Box, Discrete
from pettingzoo import ParallelEnv

class Rendezvous(ParallelEnv):  # two agents on a line of 10 cells, paid for standing close together
    metadata, possible_agents = {"name": "rendezvous_v0"}, ["a", "b"]
    observation_space = lambda self, agent, space=Box(0, 9, (2,), np.float32): space
    action_space = lambda self, agent, space=Discrete(3): space  # left, stay, right

    def reset(self, seed=None, options=None):
        self.rng = np.random.default_rng(seed) if seed is not None or not hasattr(self, "rng") else self.rng
        self.agents, self.t, self.pos = ["a", "b"], 0, self.rng.integers(0, 10, 2)
        return {"a": self.pos.astype(np.float32), "b": self.pos[::-1].astype(np.float32)}, {"a": {}, "b": {}}

    def step(self, actions):
        self.pos, self.t = np.clip(self.pos + [actions["a"] - 1, actions["b"] - 1], 0, 9), self.t + 1
        obs = {"a": self.pos.astype(np.float32), "b": self.pos[::-1].astype(np.float32)}
        r, over, self.agents = -float(abs(self.pos[0] - self.pos[1])), self.t >= 20, [] if self.t >= 20 else self.agents
        return obs, {"a": r, "b": r}, {"a": False, "b": False}, {"a": over, "b": over}, {"a": {}, "b": {}}
"""
"""README.md, "Bring your own environment": the env a newcomer pastes into `my_env.py`."""


def write_env_file(directory: Path, *, register: str | None = None, name: str = "my_env.py") -> Path:
    """Write the Rendezvous env file into `directory`; with `register`, the file also registers it under that id."""
    code = RENDEZVOUS
    if register is not None:
        code += f"\n\nimport marl_ppo\n\nmarl_ppo.register_env({register!r}, Rendezvous)\n"
    path = directory / name
    path.write_text(code)
    return path


RENDERS_ONLY_FOR_HUMANS = """

class HumansOnly(Rendezvous):  # takes render_mode, then fails to render anything but 'human' (like LBF)
    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def render(self):
        assert self.render_mode == "human", f"unsupported render mode: {self.render_mode}"
"""
"""Appended to RENDEZVOUS: an env whose render() raises for render_mode='rgb_array'."""


def write_humans_only_file(directory: Path) -> Path:
    """Write a file defining `HumansOnly`, whose render() raises AssertionError for 'rgb_array'."""
    path = directory / "humans_only.py"
    path.write_text(RENDEZVOUS + RENDERS_ONLY_FOR_HUMANS)
    return path
