"""Butterfly's pixel envs (pistonball, cooperative_pong) read their observations and state from one
copy of their screen per frame."""

from __future__ import annotations

from typing import Any

import numpy as np

PISTONBALL_MODULE = "pettingzoo.butterfly.pistonball.pistonball"
PONG_MODULE = "pettingzoo.butterfly.cooperative_pong.cooperative_pong"


def one_screen_copy(env: Any) -> Any:
    """`env` with its pistonball or cooperative_pong core reading one copy of the screen per frame;
    any other env (and cooperative_pong in `human` mode, which shows every frame) is returned as it is.

    Pistonball's `observe(agent)` copies that piston's crop out of the pygame surface (one strided copy
    per piston, 20 a step, and 20 more that PettingZoo's parallel wrapper reads before each piston's
    move and discards) and `state()` copies the whole screen once more. Cooperative_pong's `observe`
    gives each paddle the whole screen (two copies a step), `state()` a third, and its step renders
    after each paddle's move, each render a fourth and fifth copy that the step throws away. Here the
    screen is copied once after it may have changed (pistonball: after it draws; cooperative_pong: a
    step, a reset or a render) and the observations and the state are views of that copy, with the
    same values, shapes and axis order as the env's own; cooperative_pong's step only draws. Each copy
    is a new array, so an observation kept from an earlier frame stays as it was.
    """
    core = getattr(getattr(env, "aec_env", None), "unwrapped", None)
    if core is None:
        return env
    kind = type(core).__module__
    if kind == PISTONBALL_MODULE:
        PistonballScreen(core).install()
    elif kind == PONG_MODULE and core.render_mode == "rgb_array":
        PongScreen(core).install()
    return env


class ScreenCopy:
    """The frame cache behind `one_screen_copy`, installed on one env core instance."""

    CHANGES_SCREEN: tuple[str, ...] = ("step", "reset", "render")
    """The core's methods after whose call the screen may have changed."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.screen: np.ndarray | None = None  # (W, H, 3) as pygame's surfarray lays it out

    def install(self) -> None:
        core = self.core
        for name in self.CHANGES_SCREEN:
            setattr(core, name, _Invalidating(self, getattr(core, name)))
        core.observe = self.observe
        core.state = self.state

    def invalidate(self) -> None:
        """Forget the copy: the screen may change."""
        self.screen = None

    def surface(self) -> Any:
        """The pygame surface the env draws its frames on."""
        raise NotImplementedError

    def _screen(self) -> np.ndarray:
        if self.screen is None:
            import pygame

            self.screen = np.array(pygame.surfarray.pixels3d(self.surface()))
        return self.screen

    def observe(self, agent: str) -> np.ndarray:
        raise NotImplementedError

    def state(self) -> np.ndarray:
        """The env's `state`: the whole screen as (H, W, 3)."""
        return np.fliplr(np.rot90(self._screen(), k=3))


class PistonballScreen(ScreenCopy):
    """Pistonball: the screen changes only where the env draws (at the end of each cycle, on reset and
    render), so the parallel wrapper's reads between the pistons' moves share one copy."""

    CHANGES_SCREEN = ("draw", "draw_background", "reset", "render")

    def surface(self) -> Any:
        return self.core.screen

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


class PongScreen(ScreenCopy):
    """Cooperative_pong: the AEC core delegates to a game object (`core.env`) that a seeded reset
    builds anew; the game's own `render`, which its step and reset call, is made to draw only, and
    the core's `render` (a user's frame) still returns the game's full render."""

    def install(self) -> None:
        core = self.core
        self.core_reset = core.reset
        core.reset = self.reset
        core.render = self.render
        super().install()
        self.draw_only()

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        """The core's `reset`; a seeded one builds a new game (whose first render copies once)."""
        result = self.core_reset(*args, **kwargs)
        self.draw_only()
        return result

    def draw_only(self) -> None:
        """The current game's `render` made to draw without copying the screen."""
        game = self.core.env
        if not isinstance(game.__dict__.get("render"), _Drawing):
            game.render = _Drawing(self, game)

    def render(self) -> Any:
        """The core's `render`: the game's own (class) render, which draws and returns the frame."""
        game = self.core.env
        return type(game).render(game)

    def surface(self) -> Any:
        return self.core.env.screen

    def observe(self, agent: str) -> np.ndarray:
        """The env's `observe`: the whole screen as (H, W, 3), the same for both paddles."""
        return self.state()


class _Invalidating:
    """A core method that first forgets the screen copy (a callable object, so the env still pickles)."""

    def __init__(self, cache: ScreenCopy, method: Any) -> None:
        self.cache, self.method = cache, method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.cache.invalidate()
        return self.method(*args, **kwargs)


class _Drawing:
    """Cooperative_pong's game `render` as its step and reset call it: draw the frame, copy nothing."""

    def __init__(self, cache: ScreenCopy, game: Any) -> None:
        self.cache, self.game = cache, game

    def __call__(self) -> None:
        self.game.draw()
        self.cache.invalidate()
