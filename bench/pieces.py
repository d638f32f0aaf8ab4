"""Each hand-written piece of `marl_ppo/fast/` against the library's, in one process: `python -m bench.pieces`.

The pieces' own work at the sizes the default experiment and VMAS navigation give them, timed in
turn (ours first in even repeats, the library's first in odd ones) on one thread; medians over the
repeats. `bench.library` measures what each piece changes in a whole training run.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def paired(name: str, ours: Callable[[], None], library: Callable[[], None], repeats: int = 9) -> None:
    """Print the medians of `repeats` timings of each, and the library's over ours."""
    times: dict[str, list[float]] = {"ours": [], "library": []}
    for k in range(repeats):
        for which, fn in (("ours", ours), ("library", library))[:: 1 if k % 2 == 0 else -1]:
            started = time.perf_counter()
            fn()
            times[which].append(time.perf_counter() - started)
    a, b = statistics.median(times["ours"]), statistics.median(times["library"])
    print(
        f"{name:58s} ours {a * 1e3:9.2f} ms  library {b * 1e3:9.2f} ms  library/ours {b / a:6.2f}", flush=True
    )


def _raw_steps(env: Any, actions: list[dict[str, Any]], *, state: bool = False) -> Callable[[], None]:
    """A timed body: `actions` stepped through the reset parallel env (its live agents' entries), with
    the state read after each step where `state`."""
    env.reset(seed=0)

    def run() -> None:
        for step in actions:
            if not env.agents:
                env.reset()
            env.step({agent: a for agent, a in step.items() if agent in env.agents})
            if state:
                env.state()

    return run


def screen_copy() -> None:
    """Pistonball's and cooperative_pong's observations and state per step, from one screen copy and
    from the envs' own calls."""
    from marl_ppo.envs.registry import make_env
    from marl_ppo.fast.screen_copy import one_screen_copy

    for env_id, short in (
        ("butterfly/pistonball_v6", "pistonball"),
        ("butterfly/cooperative_pong_v6", "pong"),
    ):
        try:
            ours = one_screen_copy(make_env(env_id))
            library = make_env(env_id)
        except Exception as err:  # the butterfly extra is optional
            print(f"{'screen copy, ' + short:58s} skipped: {err}", flush=True)
            return
        for agent in ours.possible_agents:
            ours.action_space(agent).seed(0)
        actions = [  # the same random actions for both: pistons move continuously, paddles in 3 moves
            {agent: ours.action_space(agent).sample() for agent in ours.possible_agents} for _ in range(100)
        ]
        paired(
            f"screen copy, {short}, 100 raw env steps with the state",
            _raw_steps(ours, actions, state=True),
            _raw_steps(library, actions, state=True),
            repeats=5,
        )


def main() -> int:
    """Time every piece against the library's."""
    torch.set_num_threads(1)
    screen_copy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
