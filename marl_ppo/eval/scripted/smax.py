"""SMAX's heuristic micromanagement policy for the allies of `jaxmarl/smax_*`: JaxMARL's own.

`HeuristicEnemySMAX`, the env those ids build, plays its enemies with JaxMARL's heuristic
(`jaxmarl.environments.smax.heuristic_enemy.create_heuristic_policy`); the same function plays the
allies' side from an ally's own observation, which has the layout of an enemy's (the other units of
its team, then the other team, then its own features and unit type). Attack a unit in range (the one
attacked last while it stays in range, else the closest); else walk towards a visible enemy, else
towards the point opposite its start across the map's centre.

The heuristic needs the numbers of allies and enemies, read from the observation's length and the
action mask's (five moves, then one attack per enemy), and the map's size and unit ranges, which are
SMAX's defaults (an env made with other `map_width`, `map_height` or unit tables is not supported).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from marl_ppo.eval.evaluate import EvalError

MOVES = 5
"""SMAX's movement actions (up, right, down, left, stop) before the attacks."""


@functools.cache
def _unit_sizes() -> tuple[int, int]:
    """The length of one other unit's features and of a unit's own features in SMAX's observation."""
    from jaxmarl.environments.smax import SMAX

    probe = SMAX(num_allies=1, num_enemies=1)
    return len(probe.unit_features), len(probe.own_features)


@functools.cache
def _policy(num_allies: int, num_enemies: int) -> Any:
    """JaxMARL's heuristic for the allies (team 0) of a SMAX battle of this size, jitted with the split
    of its random key: `(key, memory, observation) -> (action, memory, key)`."""
    import jax
    from jaxmarl.environments.smax import SMAX
    from jaxmarl.environments.smax.heuristic_enemy import create_heuristic_policy

    heuristic = create_heuristic_policy(
        SMAX(num_allies=num_allies, num_enemies=num_enemies), 0, shoot=True, attack_mode="closest"
    )

    def step(key: Any, memory: Any, observation: Any) -> tuple[Any, Any, Any]:
        key, drawn = jax.random.split(key)
        action, memory = heuristic(drawn, memory, observation)
        return action, memory, key

    return jax.jit(step)


def battle_size(observation_size: int, mask_size: int) -> tuple[int, int]:
    """`(allies, enemies)` of the battle an ally's observation and action mask come from."""
    other, own = _unit_sizes()
    units, rest = divmod(observation_size - own, other)
    enemies = mask_size - MOVES
    if rest or enemies < 1 or units + 1 <= enemies:
        raise EvalError(
            f"scripted/smax reads an ally's observation of SMAX (unit_list); an observation of "
            f"{observation_size} values with {mask_size} actions is not one: play it on jaxmarl/smax_* ids"
        )
    return units + 1 - enemies, enemies


class SmaxHeuristic:
    """`scripted/smax`: JaxMARL's heuristic for each ally it plays, with each ally's memory (its target
    and the enemy it attacked last) kept for the episode."""

    def __init__(self, seed: int = 0) -> None:
        try:
            import jax
            from jaxmarl.environments.smax.heuristic_enemy import get_heuristic_policy_initial_state
        except ImportError:
            raise EvalError(
                "scripted/smax needs JaxMARL; install it with: pip install 'marl-ppo[jax]'"
            ) from None
        self._key = jax.random.PRNGKey(seed)
        start = get_heuristic_policy_initial_state()  # typed as the heuristic returns it: one compile
        self._start = start.replace(last_attacked_enemy=jax.numpy.int32(start.last_attacked_enemy))
        self._memory: dict[str, Any] = {}

    def reset(self) -> None:
        """A new episode: every ally starts from the heuristic's initial memory."""
        self._memory.clear()

    def __call__(self, observation: np.ndarray, action_mask: np.ndarray | None, agent: str) -> int:
        """The heuristic's action for `agent`; a dead unit, which may only stop, stops."""
        if action_mask is None:
            raise EvalError("scripted/smax needs SMAX's action masks (which attacks are in range)")
        allowed = np.asarray(action_mask, bool)
        if not allowed[: MOVES - 1].any():
            return MOVES - 1  # SMAX lets a dead unit only stop
        observation = np.asarray(observation, np.float32)
        policy = _policy(*battle_size(observation.size, allowed.size))
        action, self._memory[agent], self._key = policy(
            self._key, self._memory.get(agent, self._start), observation
        )
        return int(action)
