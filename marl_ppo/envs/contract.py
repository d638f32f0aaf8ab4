"""Cheap run-time checks of what an env returns: one vectorized test per group array, details only on failure."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from marl_ppo.envs.spec import TeamSpec
from marl_ppo.faults import one_line

REJOIN_KEY = "agents_can_rejoin"
"""An env whose `metadata[REJOIN_KEY]` is true may bring an agent back after it terminated."""

_NUMERIC_KINDS = "biuf"


class EnvContractError(RuntimeError):
    """The environment broke the PettingZoo contract; the message names env, copy, step and agent."""


def first_nonfinite(arrays: Sequence[np.ndarray]) -> tuple[int, int] | None:
    """(group, agent) of the first NaN or inf in per-group arrays shaped `(A_g, ...)`, else None."""
    for g, array in enumerate(arrays):
        if not np.isfinite(array).all():
            finite_rows = np.isfinite(array.reshape(array.shape[0], -1)).all(axis=1)
            return g, int(np.argmin(finite_rows))
    return None


def box_mismatch(array: np.ndarray, space: gym.spaces.Box) -> str | None:
    """Why `array` cannot be an observation of `space` (shape or dtype), else None."""
    kind = array.dtype.kind
    if array.shape == space.shape and kind in _NUMERIC_KINDS and (kind != "f" or space.dtype.kind == "f"):
        return None
    return (
        f"observation has shape {array.shape} and dtype {array.dtype}; expected shape {space.shape} "
        f"and dtype {space.dtype} as declared by {space}"
    )


def describe(value: object, limit: int = 60) -> str:
    """A short one-line repr of a value the env returned, for error messages."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ContractChecks:
    """The adapters' checks of one env copy; errors name the env id, the copy, the episode step and the agent."""

    spec: TeamSpec
    copy_index: int
    step_count: int
    _done_at: dict[str, int]
    """Agents that terminated or were truncated this episode, and the episode step when they did."""

    def _error(self, agent: str | None, problem: str) -> EnvContractError:
        """A contract error naming the env id, the copy, the episode step and (when known) the agent."""
        who = f", agent '{agent}'" if agent is not None else ""
        return EnvContractError(
            f"env '{self.spec.env_id}' (copy {self.copy_index}, episode step {self.step_count}){who}: {problem}"
        )

    def _call(self, name: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the env's `reset` or `step`; an exception from the env becomes a contract error."""
        try:
            return method(*args, **kwargs)
        except EnvContractError:
            raise
        except Exception as err:
            raise self._error(
                None,
                f"{name} raised {type(err).__name__}: {one_line(err)} (--debug shows the env's traceback)",
            ) from err

    def _check_finite(self, arrays: list[np.ndarray], what: str) -> None:
        bad = first_nonfinite(arrays)
        if bad is not None:
            g, i = bad
            value = describe(arrays[g][i].tolist())
            raise self._error(
                self.spec.groups[g].agents[i], f"{what} {value} holds NaN or inf; expected finite values"
            )

    def _check_no_rejoin(self, live: set[str]) -> None:
        for agent, step in self._done_at.items():
            if agent in live and step < self.step_count:
                raise self._error(
                    agent,
                    f"agent is live again after it terminated or was truncated at episode step {step}; "
                    f"an env whose agents may come back sets metadata['{REJOIN_KEY}'] = True",
                )

    def _write_reward(self, agent: str, rewards: Mapping[str, Any], target: np.ndarray, i: int) -> None:
        try:
            reward = float(rewards[agent])
        except KeyError:
            raise self._error(
                agent, "step gave no reward for this agent, which acted; expected a number"
            ) from None
        except (TypeError, ValueError):
            raise self._error(agent, f"reward {describe(rewards[agent])} is not a number") from None
        if not math.isfinite(reward):  # a scalar test is cheaper than one over the reward array
            raise self._error(agent, f"reward {reward} is not finite; expected a finite number")
        target[i] = reward
