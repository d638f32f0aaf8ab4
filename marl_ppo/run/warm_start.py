"""Warm starts (`model.init_from`): a new run's networks start from another run's weights.

The source's groups are matched by name. A weight of the same shape is copied. A team whose group
has another number of agents is mapped only through a shared network's agent-id input: the first
layer of a shared MLP reads the observation and then a one-hot agent id, and the id's columns are
the agents' embeddings. An agent of the source keeps its column (matched by name); a new agent takes
the column of the source agent at its position modulo the source's team size, and the run's start
line names who took whose. Everything else that does not fit (observations of another size, a global
state that grows with the team, per-agent networks) is refused in one line that says what to change.

With `model.init_optimizer` the trainer's state (the optimizers' moments and step counts and the
minibatch-shuffling generator) is carried too, so that the same settings learn from the same batch
as the source would have; without it the optimizers start fresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import ConfigError, ModelConfig
from marl_ppo.eval.from_checkpoint import resolve_checkpoint
from marl_ppo.models.layers import AgentMLP
from marl_ppo.models.team import TeamModel

NETWORKS = {
    "actors": ("actors",),
    "critics": ("critics", "value_norms"),
    "both": ("actors", "critics", "value_norms"),
}
"""The model's module lists that each `model.init_networks` choice starts from the source."""


@dataclass(frozen=True)
class WarmStart:
    """What a warm start loaded, for the start line and the optimizer step that follows."""

    checkpoint: Path
    networks: str
    borrowed: dict[str, str] = field(default_factory=dict)
    """A new agent -> the source agent whose id embedding it took."""
    payload: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        """The start line: the source, the networks and each new agent's borrowed id."""
        networks = {"both": "actors and critics", "actors": "actors", "critics": "critics"}[self.networks]
        line = f"starting the {networks} from {self.checkpoint}"
        if self.borrowed:
            taken = ", ".join(f"{new} takes {old}'s agent id" for new, old in self.borrowed.items())
            line += f"; {taken}"
        return line

    def carry_optimizer(self, trainer: Trainer, model_config: ModelConfig) -> None:
        """With `model.init_optimizer`, the source's trainer state into `trainer` (see the module)."""
        if model_config.init_optimizer:
            trainer.load_state_dict(dict(self.payload["trainer"]))


def warm_start(model: TeamModel, model_config: ModelConfig) -> WarmStart:
    """Load `model_config.init_from`'s chosen networks into `model` (see the module)."""
    assert model_config.init_from is not None
    checkpoint, _ = resolve_checkpoint(model_config.init_from)
    payload = load_checkpoint(checkpoint)
    source_groups: dict[str, list[str]] = payload["groups"]
    order = list(source_groups)
    here = {g.name: g for g in model.spec.groups}
    missing = sorted(set(here) - set(source_groups))
    if missing:
        raise ConfigError(
            f"model.init_from: {checkpoint} has groups {order} but this run has {missing} besides; "
            "warm starts match groups by name (env.groups names them)"
        )
    id_layers = _agent_id_layers(model)
    source_weights: Mapping[str, torch.Tensor] = payload["model"]
    state = model.state_dict()
    borrowed: dict[str, str] = {}
    for index, name in enumerate(model.group_names()):
        source_index = order.index(name)
        ours, theirs = tuple(here[name].agents), tuple(source_groups[name])
        for module_list in NETWORKS[model_config.init_networks]:
            prefix, source_prefix = f"{module_list}.{index}.", f"{module_list}.{source_index}."
            for key in [k for k in state if k.startswith(prefix)]:
                source_key = source_prefix + key[len(prefix) :]
                if source_key not in source_weights:
                    raise ConfigError(
                        f"model.init_from: {checkpoint} has no '{source_key}' for this run's '{key}' (its "
                        f"networks are built otherwise); keep the source's model settings"
                    )
                source = source_weights[source_key]
                if source.shape == state[key].shape:
                    state[key] = source.clone()
                elif key in id_layers and _fits_ids(source, state[key], id_layers[key], theirs):
                    state[key] = _mapped_ids(source, state[key], id_layers[key], ours, theirs, borrowed)
                else:
                    raise _refusal(checkpoint, name, key, source, state[key], ours, theirs)
    if model_config.init_optimizer:
        _check_optimizer_state(checkpoint, payload, ours_by_group={n: g.agents for n, g in here.items()})
    model.load_state_dict(state)
    return WarmStart(checkpoint, model_config.init_networks, borrowed, payload)


def _check_optimizer_state(
    checkpoint: Path, payload: Mapping[str, Any], ours_by_group: Mapping[str, tuple[str, ...]]
) -> None:
    """`model.init_optimizer` needs the source's trainer state, for the same team."""
    if "trainer" not in payload:
        raise ConfigError(
            f"model.init_optimizer=true but {checkpoint} holds no optimizer state (a best-policy "
            "checkpoint); point model.init_from at the run directory or its latest.pt"
        )
    theirs = {name: tuple(agents) for name, agents in payload["groups"].items()}
    if theirs != dict(ours_by_group):
        raise ConfigError(
            f"model.init_optimizer=true carries Adam's state of the same weights, but this run's team "
            f"{dict(ours_by_group)} is not {checkpoint}'s {theirs}; drop model.init_optimizer"
        )


def _agent_id_layers(model: TeamModel) -> dict[str, int]:
    """The first-layer weights of shared MLPs with an agent-id input: state key -> observation width."""
    return {
        f"{name}.layers.0.weight": module.in_dim
        for name, module in model.named_modules()
        if isinstance(module, AgentMLP) and module.add_agent_id
    }


def _fits_ids(source: torch.Tensor, target: torch.Tensor, in_dim: int, theirs: tuple[str, ...]) -> bool:
    """Whether the source's layer is the same layer with another number of agent-id columns."""
    return source.shape[:2] == target.shape[:2] and source.shape[2] - len(theirs) == in_dim > 0


def _mapped_ids(
    source: torch.Tensor,
    target: torch.Tensor,
    in_dim: int,
    ours: tuple[str, ...],
    theirs: tuple[str, ...],
    borrowed: dict[str, str],
) -> torch.Tensor:
    """A shared first layer `(1, out, in + A)` for this team from the source's `(1, out, in + A_src)`:
    the observation's columns as they are, each agent's id column its own or a borrowed one."""
    mapped = target.clone()
    mapped[..., :in_dim] = source[..., :in_dim]
    for position, agent in enumerate(ours):
        origin = agent if agent in theirs else theirs[position % len(theirs)]
        if origin != agent:
            borrowed[agent] = origin
        mapped[..., in_dim + position] = source[..., in_dim + theirs.index(origin)]
    return mapped


def _refusal(
    checkpoint: Path,
    group: str,
    key: str,
    source: torch.Tensor,
    target: torch.Tensor,
    ours: tuple[str, ...],
    theirs: tuple[str, ...],
) -> ConfigError:
    """The one line for a weight that does not fit, naming the likely cause and the fix."""
    where = f"model.init_from: {checkpoint}'s '{key}' is {tuple(source.shape)} but this run's is {tuple(target.shape)}"
    if len(ours) != len(theirs) and source.shape[0] == len(theirs) and target.shape[0] == len(ours) > 1:
        return ConfigError(
            f"{where}: group '{group}' has {len(ours)} agents here and {len(theirs)} there, each with its "
            "own weights; a team of another size maps only onto shared networks (model.share_actor / "
            "model.share_critic: true in both runs)"
        )
    return ConfigError(
        f"{where}: in group '{group}' the observations, global state or network sizes differ; start only "
        "the networks that fit (model.init_networks: actors or critics) or keep those sizes"
    )
