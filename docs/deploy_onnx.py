"""Play episodes of an exported policy with onnxruntime and NumPy alone, as a deployed controller would.

    marl-ppo train experiments/mpe/simple_spread.yaml --run-dir runs/spread
    marl-ppo export runs/spread                       # runs/spread/export/onnx: agent.onnx, policy.json
    python docs/deploy_onnx.py runs/spread/export/onnx --seed 1000000

Nothing of marl_ppo or torch is imported here: the files and policy.json are the whole contract
(docs/export.md). The env is mpe2's simple_spread_v3 built with the kwargs policy.json records; for
another PettingZoo parallel env, build it instead in `make_env`. Observations that are flat Boxes are
fed as they come; the rest of the loop (groups, masks, the recurrent carry, sampling noise) follows
policy.json and fits any exported policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime


def make_env(env: dict[str, Any]) -> Any:
    """The env the policy was trained on (here simple_spread; replace for another env)."""
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(**env["kwargs"])


class Controller:
    """One exported policy: per group an onnxruntime session, the agents' carries and episode flags."""

    def __init__(self, directory: Path, seed: int) -> None:
        self.sidecar = json.loads((directory / "policy.json").read_text())
        self.groups = self.sidecar["groups"]
        self.sessions = {
            name: onnxruntime.InferenceSession(str(directory / g["file"]), providers=["CPUExecutionProvider"])
            for name, g in self.groups.items()
        }
        self.rng = np.random.default_rng(seed)
        self.start_episode()

    def start_episode(self) -> None:
        """Zero carries; every agent starts an episode."""
        self.carry = {
            n: np.zeros((1, len(g["agents"]), g["carry_size"]), np.float32) for n, g in self.groups.items()
        }
        self.first = {n: np.ones((1, len(g["agents"])), bool) for n, g in self.groups.items()}

    def act(self, observations: dict[str, Any]) -> dict[str, Any]:
        """The present agents' actions, one batch row per group."""
        actions = {}
        for name, group in self.groups.items():
            agents, inputs = group["agents"], group["inputs"]
            dim, dtype = group["observation"]["dim"], group["observation"]["dtype"]
            obs = np.zeros((1, len(agents), dim), dtype)
            alive = np.zeros((1, len(agents)), bool)
            mask = np.ones(
                (1, len(agents), inputs["action_mask"]["shape"][2] if "action_mask" in inputs else 0), bool
            )
            for i, agent in enumerate(agents):
                if agent in observations:
                    seen = observations[agent]
                    if isinstance(seen, dict):  # PettingZoo's masked observations
                        mask[0, i] = np.asarray(seen["action_mask"], bool).reshape(-1)
                        seen = seen["observation"]
                    obs[0, i] = np.asarray(seen, dtype).reshape(-1)
                    alive[0, i] = True
            feed = {
                "obs": obs,
                "action_mask": mask,
                "carry": self.carry[name],
                "episode_start": self.first[name],
            }
            feed["alive"] = alive
            if "noise" in inputs:
                shape = (1, len(agents), *inputs["noise"]["shape"][2:])
                box = group["action_space"]["kind"] == "Box"
                noise = self.rng.standard_normal(shape) if box else self.rng.random(shape)
                feed["noise"] = noise.astype(np.float32)
            session = self.sessions[name]
            wanted = {i.name for i in session.get_inputs()}
            outputs = dict(
                zip(
                    [o.name for o in session.get_outputs()],
                    session.run(None, {k: v for k, v in feed.items() if k in wanted}),
                    strict=True,
                )
            )
            if "next_carry" in outputs:
                self.carry[name] = outputs["next_carry"]
            self.first[name] = np.zeros_like(self.first[name])
            for i, agent in enumerate(agents):
                if alive[0, i]:
                    actions[agent] = _env_action(group["action_space"], outputs["actions"][0, i])
        return actions


def _env_action(space: dict[str, Any], action: np.ndarray) -> Any:
    """An action as the env takes it: shifted by a discrete space's start, clipped to a Box's bounds."""
    if space["kind"] == "Discrete":
        return int(action) + space["start"]
    if space["kind"] == "MultiDiscrete":
        return np.asarray(action) + np.asarray(space["start"])
    return np.clip(action, np.asarray(space["low"]), np.asarray(space["high"])).astype(np.float32)


def play(directory: Path, seed: int, episodes: int) -> list[float]:
    """Each episode's team return (the sum over agents of its rewards); the first reset uses `seed`."""
    controller = Controller(directory, seed)
    env = make_env(controller.sidecar["env"])
    observations, _ = env.reset(seed=seed)
    returns = []
    for _ in range(episodes):
        controller.start_episode()
        team_return = 0.0
        while env.agents:
            observations, rewards, _, _, _ = env.step(controller.act(observations))
            team_return += sum(
                float(np.float32(r)) for r in rewards.values()
            )  # float32 rewards, float64 sums
        returns.append(team_return)
        observations, _ = env.reset()
    env.close()
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="a directory `marl-ppo export` wrote")
    parser.add_argument("--seed", type=int, default=0, help="the env's first reset seed")
    parser.add_argument("--episodes", type=int, default=1)
    options = parser.parse_args()
    for episode, team_return in enumerate(play(options.directory, options.seed, options.episodes)):
        print(f"episode {episode}: team return {team_return:.6f}")


if __name__ == "__main__":
    main()
