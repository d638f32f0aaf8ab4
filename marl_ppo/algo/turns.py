"""How the actors take their turns in an update (`ppo.actor_update`): all at once, or one agent after another.

The trainer runs its epochs once per `Turn`. A turn says whose actors learn in it (`learners`), whether
the critic learns alongside (`critic`), the batches its losses read and how an actor step is taken.

`Simultaneous` (MAPPO, IPPO) is one turn: every agent's actor and the critic, on the prepared batches.

`Sequential` is HAPPO (Kuba et al., ICLR 2022): one turn per agent, every agent of every group in one
sequence, in a fresh random order each update (its own generator, saved in checkpoints).

- Agent i_m's clipped objective is weighted by the factor
  `M = prod_{k<m} pi_new^{i_k}(a|o) / pi_ref^{i_k}(a|o)` of the agents updated before it, one number
  per env step (an agent absent at the step counts 1), recomputed on the whole batch after each turn.
  It multiplies each sample's advantage weight (`Sequences.weight`), outside the clip, unclipped.
- The reference `pi_ref` is the one the trainer's ratio uses (`logp_ref`): the acting policy, or under
  decoupled policy lag the policy at the start of the update, which is each agent's own until its turn.
- The critic learns in the first turn's epochs (its loss does not read the actors).
- Every agent has an Adam of its own (`AgentAdam`: its rows of its group's stacked actor parameters,
  its own moments and step count), and a turn steps the learning agent's: no other agent's weights,
  moments or count change in it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from marl_ppo.algo.losses import masked_mean
from marl_ppo.algo.optim import AgentAdam, make_agent_optimizer, make_optimizer
from marl_ppo.algo.sequences import Sequences, policy
from marl_ppo.models.team import TeamModel


@dataclass(frozen=True)
class Turn:
    """One pass of the trainer's epochs: who learns, on what."""

    batches: Mapping[str, Sequences]
    """The prepared batches the turn's losses read (a later HAPPO turn's weights include its factor)."""
    learners: Mapping[str, torch.Tensor]
    """Group -> `(A_g,)` bool: the agents whose actors learn in the turn (a group not named: none)."""
    critic: bool
    """Whether the critic learns in the turn's epochs."""
    optimizer: torch.optim.Optimizer
    """The learning actors' optimizer: the trainer clips its gradients and steps it."""


class ActorUpdate(Protocol):
    """What the trainer asks of `ppo.actor_update`: the actors' optimizers, the turns of an update, their
    scalars, a state to save."""

    @property
    def optimizers(self) -> Mapping[str, torch.optim.Optimizer]:
        """Every actor optimizer by name (the trainer zeroes them all and sets their learning rate)."""
        ...

    def turns(self, batches: Mapping[str, Sequences]) -> Iterator[Turn]:
        """The update's turns; each is taken (its epochs run) before the next is drawn."""
        ...

    def scalars(self) -> dict[str, float]:
        """The last update's per-agent diagnostics as full TensorBoard tags (empty when there are none)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps for an exact resume (merged into the trainer's state; empty: nothing)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()` from the trainer's saved state."""
        ...


def everyone(batches: Mapping[str, Sequences]) -> dict[str, torch.Tensor]:
    """`Turn.learners` naming every agent of every group."""
    return {
        name: torch.ones(b.alive.shape[-1], dtype=torch.bool, device=b.alive.device)
        for name, b in batches.items()
    }


class Simultaneous:
    """Every actor learns at once from the same batch (MAPPO, IPPO): one turn, with the critic, and one
    optimizer over every actor parameter."""

    def __init__(self, model: TeamModel, *, lr: float, optimizer: str) -> None:
        self.optimizer = make_optimizer(model.actors.parameters(), lr=lr, kind=optimizer)
        self.optimizers = {"actors": self.optimizer}

    def turns(self, batches: Mapping[str, Sequences]) -> Iterator[Turn]:
        """One turn: every agent, the critic, the prepared batches, the one optimizer."""
        yield Turn(batches, everyone(batches), critic=True, optimizer=self.optimizer)

    def scalars(self) -> dict[str, float]:
        """None: the trainer's `train/` diagnostics cover the one turn."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state."""
        return {"actor_optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`; a checkpoint of a sequential run is refused."""
        if "actor_order" in state:
            raise ValueError(
                "the checkpoint was written by a run with ppo.actor_update=sequential; resume it with that setting"
            )
        self.optimizer.load_state_dict(state["actor_optimizer"])


class Sequential:
    """HAPPO: the agents learn one after another in a fresh random order, each objective weighted by the
    factor of the agents before it (see the module docstring)."""

    def __init__(self, model: TeamModel, *, seed: int, clip_ratio: float, lr: float, optimizer: str) -> None:
        self.model = model
        self.agents = [(g.name, i, agent) for g in model.spec.groups for i, agent in enumerate(g.agents)]
        """(group, index in the group, agent id) of every agent, in the team's order."""
        self.optimizers: dict[str, AgentAdam] = {
            name: make_agent_optimizer(
                model.group(group).actor.parameters(),
                agent=agent,
                agents=model.spec.group(group).num_agents,
                lr=lr,
                kind=optimizer,
            )
            for group, agent, name in self.agents
        }
        """Agent id -> the Adam of its rows of its group's actor parameters."""
        self.clip_ratio = clip_ratio
        self.generator = torch.Generator().manual_seed(seed)
        """Draws each update's order."""
        self.order: list[int] = []
        """The last update's order, as indices into `agents`."""
        self._scalars: dict[str, float] = {}

    def turns(self, batches: Mapping[str, Sequences]) -> Iterator[Turn]:
        """One turn per agent in a fresh random order; after each, the factor takes in its ratio."""
        self.order = torch.randperm(len(self.agents), generator=self.generator).tolist()
        self._scalars = {}
        factor: torch.Tensor | None = None  # (L, C); None: 1 everywhere (the first turn)
        for position, index in enumerate(self.order):
            group, agent, name = self.agents[index]
            batch = batches[group]
            turn_batches = dict(batches)
            if factor is not None:
                turn_batches[group] = dataclasses.replace(batch, weight=batch.weight * factor.unsqueeze(-1))
            learners = torch.zeros(batch.alive.shape[-1], dtype=torch.bool, device=batch.alive.device)
            learners[agent] = True
            yield Turn(turn_batches, {group: learners}, critic=position == 0, optimizer=self.optimizers[name])
            log_ratio = self._log_ratio(batch, group, agent)
            ratio = log_ratio.exp()
            self._record(name, position, batch.alive[..., agent], factor, ratio, log_ratio)
            factor = ratio if factor is None else factor * ratio

    @torch.no_grad()
    def _log_ratio(self, batch: Sequences, group: str, agent: int) -> torch.Tensor:
        """The agent's log ratio new / reference over the whole batch `(L, C)`, 0 where it is absent."""
        logp = policy(self.model.group(group).actor, batch).log_prob(batch.actions)[..., agent]
        return torch.where(batch.alive[..., agent], logp - batch.logp_ref[..., agent], 0.0)

    def _record(
        self,
        name: str,
        position: int,
        alive: torch.Tensor,
        factor: torch.Tensor | None,
        ratio: torch.Tensor,
        log_ratio: torch.Tensor,
    ) -> None:
        """The factor the agent was handed (mean and spread over its live samples), and its KL and clip
        fraction after its turn, under `agents/<id>/`."""
        given = torch.ones_like(ratio) if factor is None else factor
        mean = masked_mean(given, alive)
        spread = masked_mean((given - mean).pow(2), alive).sqrt()
        clipped = ((ratio - 1.0).abs() > self.clip_ratio).float()
        values = {
            "turn": float(position),
            "factor_mean": float(mean),
            "factor_std": float(spread),
            "kl": float(masked_mean((ratio - 1.0) - log_ratio, alive)),
            "clipfrac": float(masked_mean(clipped, alive)),
        }
        self._scalars.update({f"agents/{name}/{key}": value for key, value in values.items()})

    def scalars(self) -> dict[str, float]:
        """Per agent: its position in the last order, the factor it was handed, its KL and clip fraction."""
        return dict(self._scalars)

    def state_dict(self) -> dict[str, Any]:
        """The order generator's state and every agent's optimizer state, by agent id."""
        return {
            "actor_order": self.generator.get_state(),
            "actor_optimizers": {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`, or the layout written before every agent had an optimizer of its own
        (`_split_team_optimizer`); a checkpoint of a simultaneous run is refused."""
        if "actor_order" not in state:
            raise ValueError(
                "the checkpoint was written by a run with ppo.actor_update=simultaneous; resume it with that setting"
            )
        self.generator.set_state(state["actor_order"])
        saved = state.get("actor_optimizers")
        if saved is None:
            saved = self._split_team_optimizer(state["actor_optimizer"], state["actor_adam_steps"])
        if saved.keys() != self.optimizers.keys():
            raise ValueError(
                f"the checkpoint holds actor optimizers of agents {sorted(saved)} but this run has "
                f"{sorted(self.optimizers)}; it was written for a different team"
            )
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(saved[name])

    def _split_team_optimizer(self, team: Mapping[str, Any], steps: torch.Tensor) -> dict[str, Any]:
        """Every agent's optimizer state from the layout that kept one Adam over all actor parameters
        (every agent's rows and moments put back after another agent's step) and each agent's step
        count: the agent's rows of each moment, with its own count (no state: it has not stepped)."""
        index = {id(p): i for i, p in enumerate(self.model.actors.parameters())}
        (settings,) = team["param_groups"]
        states: dict[str, Any] = {}
        for (_, _, name), count in zip(self.agents, steps.tolist(), strict=True):
            optimizer = self.optimizers[name]
            params = optimizer.param_groups[0]["params"]
            entries = {}
            for i, p in enumerate(params):
                saved = team["state"].get(index[id(p)])
                if saved is not None and count > 0:
                    entries[i] = {
                        "step": torch.tensor(count, dtype=torch.float32),
                        **{key: optimizer.rows(saved[key]).clone() for key in ("exp_avg", "exp_avg_sq")},
                    }
            states[name] = {
                "state": entries,
                "param_groups": [{**settings, "params": list(range(len(params)))}],
            }
        return states


def make_actor_update(
    kind: str, model: TeamModel, *, seed: int, clip_ratio: float, lr: float, optimizer: str
) -> ActorUpdate:
    """The `ppo.actor_update` named `kind`, its actors' optimizers Adam at `lr` on the code path
    `optimizer` names (`fast.optimizer`); `seed` seeds a sequential update's order."""
    if kind == "sequential":
        return Sequential(model, seed=seed, clip_ratio=clip_ratio, lr=lr, optimizer=optimizer)
    if kind == "simultaneous":
        return Simultaneous(model, lr=lr, optimizer=optimizer)
    raise ValueError(f"unknown ppo.actor_update '{kind}'; expected simultaneous or sequential")
