"""Pistonball's observations and state read from one copy of its screen per frame."""

from __future__ import annotations

from typing import Any

import numpy as np

PISTONBALL_MODULE = "pettingzoo.butterfly.pistonball.pistonball"


def one_screen_copy(env: Any) -> Any:
    """`env` with its pistonball core's `observe` and `state` reading one copy of the screen per frame;
    any other env is returned as it is.

    Pistonball's `observe(agent)` copies that piston's crop out of the pygame surface (one strided copy
    per piston, 20 a step) and `state()` copies the whole screen once more. Here the screen is copied
    once after it may have changed (a step, a reset or a render of the core) and every piston's crop
    and the state are views of that copy, with the same values, shapes and axis order as the env's own.
    Each copy is a new array, so an observation kept from an earlier frame stays as it was.
    """
    core = getattr(getattr(env, "aec_env", None), "unwrapped", None)
    if core is None or type(core).__module__ != PISTONBALL_MODULE:
        return env
    ScreenCopy(core).install()
    return env


class ScreenCopy:
    """The frame cache behind `one_screen_copy`, installed on one pistonball core instance."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.screen: np.ndarray | None = None  # (W, H, 3) as pygame's surfarray lays it out

    def install(self) -> None:
        core = self.core
        for name in ("step", "reset", "render"):
            setattr(core, name, self._invalidating(getattr(core, name)))
        core.observe = self.observe
        core.state = self.state

    def _invalidating(self, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.screen = None
            return method(*args, **kwargs)

        return call

    def _screen(self) -> np.ndarray:
        if self.screen is None:
            import pygame

            self.screen = np.array(pygame.surfarray.pixels3d(self.core.screen))
        return self.screen

    def observe(self, agent: str) -> np.ndarray:
        """The env's `observe`: the piston's crop, 40 px either side, rotated to (H, W, 3)."""
        core = self.core
        i = core.agent_name_mapping[agent]
        x_high = core.wall_width + core.piston_width * (i + 2)
        x_low = core.wall_width + core.piston_width * (i - 1)
        y_high = core.screen_height - core.wall_width - core.piston_body_height
        y_low = core.wall_width
        cropped = self._screen()[x_low:x_high, y_low:y_high, :]
        return np.fliplr(np.rot90(cropped, k=3))

    def state(self) -> np.ndarray:
        """The env's `state`: the whole screen as (H, W, 3)."""
        return np.fliplr(np.rot90(self._screen(), k=3))
