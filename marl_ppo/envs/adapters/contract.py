"""Cheap run-time checks of what an env returns: one vectorized test per group array, details only on failure."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.faults import UserError, one_line

REJOIN_KEY = "agents_can_rejoin"
"""An env whose `metadata[REJOIN_KEY]` is true may bring an agent back after it terminated."""

_NUMERIC_KINDS = "biuf"


class EnvContractError(UserError, RuntimeError):
    """The environment broke the PettingZoo contract; the message names env, copy, step and agent."""


def check_finite(
    arrays: TeamArrays[np.ndarray], adapters: Sequence[ContractChecks], ended: np.ndarray, *, state: bool
) -> None:
    """One isfinite test per `(E, A_g, D)` observation array (and `(E, S)` state) of a vector step.

    `arrays` holds the rows of `adapters` (a TeamArrays or a block of its rows) and `ended` their
    `episode_over` flags. Only on failure is the env copy and agent found, and that adapter raises.
    """
    checks: list[tuple[str, str | None, np.ndarray]] = [
        (field, name, getattr(group, field))
        for field in ("final_obs", "obs")
        for name, group in arrays.groups.items()
    ]
    if state:
        checks += [("final_state", None, arrays.final_state), ("state", None, arrays.state)]
    for field, name, array in checks:
        if not np.isfinite(array).all():
            bad = np.argwhere(~np.isfinite(array))[0]
            e, i = int(bad[0]), (None if name is None else int(bad[1]))
            adapters[e].raise_nonfinite(
                field, name, i, array[e] if i is None else array[e, i], bool(ended[e])
            )


def box_mismatch(array: np.ndarray, space: gym.spaces.Box) -> str | None:
    """Why `array` cannot be an observation of `space` (shape or dtype), else None."""
    kind = array.dtype.kind
    if (
        array.shape == space.shape
        and kind in _NUMERIC_KINDS
        and (kind != "f" or np.dtype(space.dtype).kind == "f")
    ):
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
    ended_at: int
    """Steps of the episode that the last reset ended."""
    _done_at: dict[str, int]
    """Agents that terminated or were truncated this episode, and the episode step when they did."""
    _rejoin: bool
    """The env declares `metadata[REJOIN_KEY]`: its agents may leave and come back."""
    _left_at: dict[str, int]
    """In an env whose agents may come back: agents outside env.agents that left with neither flag,
    and the episode step when they left."""

    def _error(self, agent: str | None, problem: str, *, step: int | None = None) -> EnvContractError:
        """A contract error naming the env id, the copy, the episode step and (when known) the agent."""
        who = f", agent '{agent}'" if agent is not None else ""
        step = self.step_count if step is None else step
        return EnvContractError(
            f"env '{self.spec.env_id}' (copy {self.copy_index}, episode step {step}){who}: {problem}"
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

    def raise_nonfinite(
        self, field: str, group: str | None, i: int | None, value: np.ndarray, ended: bool
    ) -> None:
        """Raise the error for a NaN or inf in `field` (agent `i` of group `group`, or the state)."""
        # a final value of an episode that ended (and was reset) came from that episode's last step
        step = self.ended_at if ended and field.startswith("final_") else self.step_count
        what = "state()" if i is None else "observation"
        agent = None if group is None or i is None else self.spec.group(group).agents[i]
        problem = f"{what} {describe(value.tolist())} holds NaN or inf; expected finite values"
        raise self._error(agent, problem, step=step)

    def _check_no_rejoin(self, live: set[str]) -> None:
        for agent, step in self._done_at.items():
            if agent in live and step < self.step_count:
                raise self._error(
                    agent,
                    f"agent is live again after it terminated or was truncated at episode step {step}; "
                    f"an env whose agents may come back sets metadata['{REJOIN_KEY}'] = True",
                )

    def _check_leavers(self, silent: list[str], live: set[str], over: bool) -> None:
        """Agents that left env.agents at this step with neither flag (`silent`) break the contract: their
        last move would bootstrap across the episode's end. An env whose agents may come back
        (`REJOIN_KEY`) may keep an agent out while the episode goes on, as long as it returns."""
        if not self._rejoin:
            if silent:
                raise self._error(
                    silent[0],
                    "agent left env.agents without being terminated or truncated; an env removes an agent "
                    "by setting its termination or truncation flag at the step it leaves (an env whose "
                    f"agents may leave and come back sets metadata['{REJOIN_KEY}'] = True)",
                )
            return
        for agent in silent:
            self._left_at.setdefault(agent, self.step_count)
        for agent in [a for a in self._left_at if a in live]:
            del self._left_at[agent]
        if over and self._left_at:
            agent, step = next(iter(self._left_at.items()))
            raise self._error(
                agent,
                f"agent left env.agents at episode step {step} without being terminated or truncated and "
                "the episode ended before it came back; an env ends an agent by setting its termination "
                "or truncation flag",
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
