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
- An actor step changes the learning agent's weights only (`AgentRows`): every other actor weight and
  Adam moment is put back after it, and each agent keeps its own Adam step count, so every agent's
  actor steps as if it had an Adam of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from marl_ppo.algo.losses import masked_mean
from marl_ppo.algo.sequences import Sequences, policy
from marl_ppo.models.team import TeamModel

StepActors = Callable[[torch.optim.Optimizer], None]


@dataclass(frozen=True)
class Turn:
    """One pass of the trainer's epochs: who learns, on what."""

    batches: Mapping[str, Sequences]
    """The prepared batches the turn's losses read (a later HAPPO turn's weights include its factor)."""
    learners: Mapping[str, torch.Tensor]
    """Group -> `(A_g,)` bool: the agents whose actors learn in the turn (a group not named: none)."""
    critic: bool
    """Whether the critic learns in the turn's epochs."""
    step: StepActors
    """Takes one actor optimizer step (the gradients are clipped before)."""


class ActorUpdate(Protocol):
    """What the trainer asks of `ppo.actor_update`: the turns of an update, their scalars, a state to save."""

    def turns(self, batches: Mapping[str, Sequences], optimizer: torch.optim.Optimizer) -> Iterator[Turn]:
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


def _step(optimizer: torch.optim.Optimizer) -> None:
    optimizer.step()


def everyone(batches: Mapping[str, Sequences]) -> dict[str, torch.Tensor]:
    """`Turn.learners` naming every agent of every group."""
    return {
        name: torch.ones(b.alive.shape[-1], dtype=torch.bool, device=b.alive.device)
        for name, b in batches.items()
    }


class Simultaneous:
    """Every actor learns at once from the same batch (MAPPO, IPPO): one turn, with the critic."""

    def turns(self, batches: Mapping[str, Sequences], optimizer: torch.optim.Optimizer) -> Iterator[Turn]:
        """One turn: every agent, the critic, the prepared batches, a plain optimizer step."""
        yield Turn(batches, everyone(batches), critic=True, step=_step)

    def scalars(self) -> dict[str, float]:
        """None: the trainer's `train/` diagnostics cover the one turn."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Nothing to keep."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""


class Sequential:
    """HAPPO: the agents learn one after another in a fresh random order, each objective weighted by the
    factor of the agents before it (see the module docstring)."""

    def __init__(self, model: TeamModel, *, seed: int, clip_ratio: float) -> None:
        self.model = model
        self.agents = [(g.name, i, agent) for g in model.spec.groups for i, agent in enumerate(g.agents)]
        """(group, index in the group, agent id) of every agent, in the team's order."""
        self.clip_ratio = clip_ratio
        self.generator = torch.Generator().manual_seed(seed)
        """Draws each update's order."""
        self.adam_steps = torch.zeros(len(self.agents), dtype=torch.float64)
        """Adam steps each agent's actor has taken (its bias correction's count)."""
        self.order: list[int] = []
        """The last update's order, as indices into `agents`."""
        self._scalars: dict[str, float] = {}

    def turns(self, batches: Mapping[str, Sequences], optimizer: torch.optim.Optimizer) -> Iterator[Turn]:
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
            own = list(self.model.group(group).actor.parameters())
            _set_adam_step(optimizer, own, float(self.adam_steps[index]))
            yield Turn(
                turn_batches,
                {group: learners},
                critic=position == 0,
                step=AgentRows(self.model, group, agent),
            )
            self.adam_steps[index] = _adam_step(optimizer, own)
            log_ratio = self._log_ratio(batch, group, agent)
            ratio = log_ratio.exp()
            self._record(name, position, batch.alive[..., agent], factor, ratio, log_ratio)
            factor = ratio if factor is None else factor * ratio
        # one count in every parameter's state, so a checkpoint moves between Adam implementations
        _set_adam_step(optimizer, list(self.model.actors.parameters()), float(self.adam_steps.max()))

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
        """The order generator's state and each agent's Adam step count."""
        return {"actor_order": self.generator.get_state(), "actor_adam_steps": self.adam_steps.clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`; a checkpoint of a simultaneous run has neither entry and is refused."""
        if "actor_order" not in state:
            raise ValueError(
                "the checkpoint was written by a run with ppo.actor_update=simultaneous; resume it with that setting"
            )
        self.generator.set_state(state["actor_order"])
        self.adam_steps = state["actor_adam_steps"].clone().to(torch.float64)


class AgentRows:
    """An actor optimizer step that changes one agent's actor only.

    Every actor parameter of a group without a shared actor stacks its agents' weights along its first
    axis, agent-major; the learning agent's rows are kept, and every other row of its group and every
    other group's parameter, with their Adam moments, is put back after the step (a zero gradient still
    moves weights by their momentum). Where the optimizer had no state yet, the moments put back are zeros.
    """

    def __init__(self, model: TeamModel, group: str, agent: int) -> None:
        agents = model.spec.group(group).num_agents
        own = {id(p) for p in model.group(group).actor.parameters()}
        self.parts: list[tuple[torch.Tensor, int, torch.Tensor]] = []
        """(parameter, copies along its first axis, the rows put back)."""
        for p in model.actors.parameters():
            if id(p) not in own:
                self.parts.append((p, 1, torch.zeros(1, dtype=torch.long, device=p.device)))
            elif agents > 1:
                if p.shape[0] % agents:
                    raise ValueError(
                        f"actor parameter of shape {tuple(p.shape)} is not stacked over {agents} agents"
                    )
                others = [i for i in range(agents) if i != agent]
                self.parts.append((p, agents, torch.tensor(others, dtype=torch.long, device=p.device)))

    def __call__(self, optimizer: torch.optim.Optimizer) -> None:
        """Step, then put every row but the learning agent's back."""
        kept = [self._rows(optimizer, p, copies, rows) for p, copies, rows in self.parts]
        optimizer.step()
        with torch.no_grad():
            for (p, copies, rows), saved in zip(self.parts, kept, strict=True):
                for key, tensor in _stacked(optimizer, p).items():
                    before = saved.get(key)
                    view = tensor.view(copies, -1)
                    if before is None:  # state the step created: zero before it
                        view.index_fill_(0, rows, 0.0)
                    else:
                        view.index_copy_(0, rows, before)

    @staticmethod
    def _rows(
        optimizer: torch.optim.Optimizer, p: torch.Tensor, copies: int, rows: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        return {
            key: tensor.view(copies, -1).index_select(0, rows)
            for key, tensor in _stacked(optimizer, p).items()
        }


def _stacked(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parameter's values and every state tensor of its shape (Adam's moments), detached."""
    state = optimizer.state.get(p, {})
    tensors = {"param": p.detach()}
    tensors.update(
        (key, value)
        for key, value in state.items()
        if isinstance(value, torch.Tensor) and value.shape == p.shape
    )
    return tensors


def _adam_step(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> float:
    """The Adam step count in the state of the first of `params` that has one (0: none has stepped)."""
    for p in params:
        step = optimizer.state.get(p, {}).get("step")
        if step is not None:
            return float(step)
    return 0.0


def _set_adam_step(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], count: float) -> None:
    """Set the Adam step count of every one of `params` that has state."""
    for p in params:
        step = optimizer.state.get(p, {}).get("step")
        if isinstance(step, torch.Tensor):
            step.fill_(count)


def make_actor_update(kind: str, model: TeamModel, *, seed: int, clip_ratio: float) -> ActorUpdate:
    """The `ppo.actor_update` named `kind`; `seed` seeds a sequential update's order."""
    if kind == "sequential":
        return Sequential(model, seed=seed, clip_ratio=clip_ratio)
    if kind == "simultaneous":
        return Simultaneous()
    raise ValueError(f"unknown ppo.actor_update '{kind}'; expected simultaneous or sequential")
