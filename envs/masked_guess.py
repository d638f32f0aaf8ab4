"""A masked-action game: each step only some actions are allowed, and the env refuses the others.

Two agents; each step every agent gets a fresh random mask with at least one allowed action and
is paid 1 for choosing its highest allowed action. A masked action raises ValueError (or, with
`strict=False`, is counted in `masked_choices`), so a framework bug that samples one fails loudly. Masks come in a Dict observation (`mask_in="obs"`,
PettingZoo's classic convention) or in `infos[agent]["action_mask"]` (`mask_in="info"`); with
`multi=True` actions are MultiDiscrete([3, 3]) with one mask per dimension.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class MaskedGuessEnv(ParallelEnv):
    """Two agents choosing among allowed actions only; episodes are truncated after `max_steps`."""

    metadata = {"name": "masked_guess_v0", "render_modes": []}

    def __init__(
        self, max_steps: int = 8, mask_in: str = "obs", multi: bool = False, strict: bool = True
    ) -> None:
        if mask_in not in ("obs", "info"):
            raise ValueError(f"mask_in must be 'obs' or 'info', got {mask_in!r}")
        self.possible_agents = ["player_0", "player_1"]
        self.agents: list[str] = []
        self.max_steps, self.mask_in, self.multi, self.strict = max_steps, mask_in, multi, strict
        self.masked_choices = 0
        """Masked actions received (only counted when `strict=False`; strict envs raise instead)."""
        self.sizes = [3, 3] if multi else [5]
        self._rng = np.random.default_rng()
        self._masks: dict[str, list[np.ndarray]] = {}
        self._t = 0

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Space:
        features = spaces.Box(0.0, 1.0, (sum(self.sizes),), np.float32)
        if self.mask_in == "info":
            return features
        if self.multi:  # one mask per dimension, as gymnasium's MultiDiscrete.sample(mask=...) expects
            mask_space = spaces.Tuple([spaces.Box(0, 1, (size,), np.int8) for size in self.sizes])
        else:
            mask_space = spaces.Box(0, 1, (self.sizes[0],), np.int8)
        return spaces.Dict({"observation": features, "action_mask": mask_space})

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Space:
        return spaces.MultiDiscrete(self.sizes) if self.multi else spaces.Discrete(self.sizes[0])

    def _draw_masks(self) -> None:
        self._masks = {}
        for agent in self.agents:
            parts = []
            for size in self.sizes:
                mask = (self._rng.random(size) < 0.5).astype(np.int8)
                mask[self._rng.integers(size)] = 1
                parts.append(mask)
            self._masks[agent] = parts

    def _observe(self) -> tuple[dict, dict]:
        observations, infos = {}, {}
        for agent in self.agents:
            flat = np.concatenate(self._masks[agent])
            mask = tuple(self._masks[agent]) if self.multi else flat
            features = flat.astype(np.float32)  # the mask is visible to the policy, so the task is learnable
            if self.mask_in == "obs":
                observations[agent] = {"observation": features, "action_mask": mask}
                infos[agent] = {}
            else:
                observations[agent] = features
                infos[agent] = {"action_mask": mask}
        return observations, infos

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._draw_masks()
        return self._observe()

    def step(self, actions):
        rewards = {}
        for agent in self.agents:
            chosen = np.atleast_1d(np.asarray(actions[agent]))
            for k, (choice, mask) in enumerate(zip(chosen, self._masks[agent], strict=True)):
                if not mask[int(choice)]:
                    self.masked_choices += 1
                if not mask[int(choice)] and self.strict:
                    raise ValueError(
                        f"{agent} chose masked action {int(choice)} in dimension {k} at step {self._t}"
                    )
            best = [int(np.flatnonzero(mask)[-1]) for mask in self._masks[agent]]
            rewards[agent] = float(np.mean([int(c) == b for c, b in zip(chosen, best, strict=True)]))
        self._t += 1
        over = self._t >= self.max_steps
        self._draw_masks()
        observations, infos = self._observe()
        terminations = {a: False for a in self.agents}
        truncations = {a: over for a in self.agents}
        if over:
            self.agents = []
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs) -> MaskedGuessEnv:
    """Factory for the registry."""
    return MaskedGuessEnv(**kwargs)
