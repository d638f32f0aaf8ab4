"""The one loop that steps a vector env with a policy: act -> step -> carry advance -> episode accounting.

Training's collector, evaluation, the scores against a random opponent and video recording all step
their envs through `Stepper.step`, each with its own `Acting`: the collector's samples and stores
every step, evaluation's takes the policy's mode or a sample, the random policy's draws uniformly.
The stepper keeps every env copy's running per-agent returns and episode length and hands back the
episodes that ended.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from marl_ppo.envs.spec import TeamArrays
from marl_ppo.envs.vector.base import VectorEnv, WinsEpisodes
from marl_ppo.models.acting import ActingView
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.memory import PolicyMemory, make_memory


class Acting(Protocol):
    """A policy the stepper drives over E env copies."""

    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """Per group, the actions `(E, A_g, ...)` for the arrays' observations."""
        ...

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """After the env step (`arrays` hold its rewards and flags): carry the policy's state on."""
        ...


class EpisodeLimitError(ValueError):
    """An env copy ran `max_episode_steps` without ending an episode."""


@dataclass(frozen=True)
class Finished:
    """An episode that ended at the last step."""

    copy: int
    """The env copy it ran in."""
    agent_returns: np.ndarray
    """`(num_agents,)` float64: each agent's return, in the team's agent order."""
    length: int
    """Env steps of the episode."""
    won: bool | None = None
    """Whether the team won it, for an env whose episodes can be won (`WinsEpisodes`); else None."""


def to_tensor(value: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of an env array on `device` (the env overwrites its arrays at the next step)."""
    if isinstance(value, torch.Tensor):
        return value.to(device, copy=True)
    return torch.from_numpy(value.copy()).to(device)


class Stepper:
    """Steps `venv` one step at a time with an `Acting`, keeping each copy's running returns and length."""

    def __init__(self, venv: VectorEnv, *, max_episode_steps: int | None = None) -> None:
        """`max_episode_steps`: raise EpisodeLimitError when a copy runs this long without an episode end."""
        self.venv = venv
        self.max_episode_steps = max_episode_steps
        spec = venv.spec
        # the running totals live where the env's arrays do: torch tensors on the simulator's device
        # for a tensor env, NumPy arrays otherwise (a few small in-place NumPy operations per step,
        # where torch ones cost several times as much)
        self._where = venv.arrays.state.device if venv.tensor_io else None
        self._columns = {g.name: _columns(spec.agents, g.agents, self._where) for g in spec.groups}
        """The columns of each group's agents in the team's agent order: a slice where contiguous."""
        self._returns: Any
        self._lengths: Any
        if self._where is None:
            self._returns = np.zeros((venv.num_envs, spec.num_agents), dtype=np.float64)
            self._lengths = np.zeros(venv.num_envs, dtype=np.int64)
        else:
            self._returns = torch.zeros(
                (venv.num_envs, spec.num_agents), dtype=torch.float64, device=self._where
            )
            self._lengths = torch.zeros(venv.num_envs, dtype=torch.int64, device=self._where)
        self.env_seconds = 0.0
        """Wall time spent inside the vector env's step since the last `reset`."""
        self._wins = venv if isinstance(venv, WinsEpisodes) else None

    def reset(self, seed: int) -> TeamArrays:
        """Reset every env copy (copy i with `seed + i`) and clear the running returns and lengths."""
        arrays = self.venv.reset(seed)
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self.env_seconds = 0.0
        return arrays

    def step(self, acting: Acting) -> list[Finished]:
        """One step of every copy: `acting`'s actions, the env step, `acting.advance`, the accounting;
        the episodes that ended at it, in copy order."""
        venv = self.venv
        actions = acting.act(venv.arrays)
        sent = actions if venv.tensor_io else {name: a.cpu().numpy() for name, a in actions.items()}
        started = time.perf_counter()
        venv.step(sent)
        self.env_seconds += time.perf_counter() - started
        acting.advance(venv.arrays, venv.episode_over)
        return self._account()

    def _account(self) -> list[Finished]:
        for name, group in self.venv.arrays.groups.items():
            self._returns[:, self._columns[name]] += group.reward
        self._lengths += 1
        over = self.venv.episode_over
        if self.max_episode_steps is not None and int(self._lengths.max()) >= self.max_episode_steps:
            raise EpisodeLimitError(
                f"env '{self.venv.spec.env_id}' ran {self.max_episode_steps} steps without ending an "
                "episode; evaluation needs episodes that end (set a time limit in env.kwargs)"
            )
        if not over.any():
            return []
        ended: Any = np.flatnonzero(over) if self._where is None else torch.nonzero(over).flatten()
        returns = self._returns[ended]  # an advanced index: a copy of the ended episodes' totals
        if self._where is not None:
            returns = returns.cpu().numpy()  # only the ended episodes' totals leave the device
        lengths = self._lengths[ended].tolist()
        self._returns[ended] = 0.0
        self._lengths[ended] = 0
        copies = ended.tolist()
        won: list[bool | None] = (
            [None] * len(copies) if self._wins is None else _as_list(self._wins.episode_won, copies)
        )
        return [
            Finished(int(copy), agent_returns, length, copy_won)
            for copy, agent_returns, length, copy_won in zip(copies, returns, lengths, won, strict=True)
        ]

    def state_dict(self) -> dict[str, Any]:
        """The unfinished episodes' running returns and lengths (CPU tensors)."""
        return {
            "returns": torch.as_tensor(self._returns).cpu().clone(),
            "lengths": torch.as_tensor(self._lengths).cpu().clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`."""
        if self._where is None:
            self._returns[...] = torch.as_tensor(state["returns"]).numpy()
            self._lengths[...] = torch.as_tensor(state["lengths"]).numpy()
        else:
            self._returns.copy_(state["returns"])
            self._lengths.copy_(state["lengths"])


def _columns(agents: Sequence[str], members: Sequence[str], device: torch.device | None) -> slice | Any:
    """The columns of `members` among `agents`: a slice where they are contiguous and in order, else an
    index (NumPy, or a torch tensor on `device`)."""
    columns = [agents.index(a) for a in members]
    if columns == list(range(columns[0], columns[0] + len(columns))):
        return slice(columns[0], columns[0] + len(columns))
    return np.array(columns) if device is None else torch.tensor(columns, device=device)


def _as_list(flags: np.ndarray | torch.Tensor, copies: list[int]) -> list[bool | None]:
    """`flags` of the copies named, as Python bools."""
    if isinstance(flags, torch.Tensor):
        flags = flags.cpu().numpy()
    return [bool(flags[copy]) for copy in copies]


class PolicyActing:
    """The model's actions (its mode, or a sample), its carries kept from step to step (fresh per copy).

    It reads the model's weights once, when built (`ActingView`): build it after the last update
    and for one set of episodes, as the collector builds one view per rollout."""

    def __init__(self, model: TeamModel, copies: int, device: torch.device, *, deterministic: bool) -> None:
        self.memory: PolicyMemory = make_memory(model, copies, device)
        self.policy = ActingView(model)
        self.device, self.deterministic = device, deterministic

    @torch.no_grad()
    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """Per-group actions for the arrays' observations, masks respected."""
        groups = arrays.groups
        obs = {name: to_tensor(group.obs, self.device) for name, group in groups.items()}
        masks = {name: to_tensor(group.action_mask, self.device) for name, group in groups.items()}
        alive = {name: to_tensor(group.alive, self.device) for name, group in groups.items()}
        return self.act_on(obs, masks, alive)

    @torch.no_grad()
    def act_on(
        self,
        obs: Mapping[str, torch.Tensor],
        masks: Mapping[str, torch.Tensor],
        alive: Mapping[str, torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """`act` on the step's arrays already on the device (copies the env step does not overwrite)."""
        dists = self.memory.distributions(self.policy, obs, masks, alive)
        return {name: d.mode() if self.deterministic else d.sample() for name, d in dists.items()}

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """Keep the stepped carries; flag the agents whose episode starts next."""
        self.memory.advance(arrays, episode_over)
