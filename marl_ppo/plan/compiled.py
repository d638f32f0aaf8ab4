"""Whether a run's rollouts are compiled (`rollout.compiled`): a JaxMARL env's rollout as one `lax.scan`
(`rollout.compiled.CompiledSource`), or the per-step collector.

The plan settles it once: compiled where the env is a JaxMARL vector env, no league snapshots act
beside the learner and every network has a JAX forward (`unsupported_reason`, the one home of what
`rollout.jax_policy` covers), read from the networks built on the meta device for a probe of the env
(built, not reset: nothing is compiled or stepped). Otherwise per step, with the reason in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import gymnasium as gym
import torch

from marl_ppo.config import ConfigError, ExperimentConfig
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.envs.spec import BatchedLayout, EnvLayout
from marl_ppo.models.recurrent import StackedRecurrent
from marl_ppo.models.team import TeamModel

ACTIVATION_NAMES: dict[Callable[[torch.Tensor], torch.Tensor], str] = {
    torch.tanh: "tanh",
    torch.relu: "relu",
}
"""The activations of `AgentMLP` that the JAX forward computes, by the name it computes them by."""


def unsupported_reason(model: TeamModel) -> str | None:
    """Why `model`'s networks have no JAX forward (one line), or None where they all have one: the
    JAX forward covers feed-forward and GRU networks over vector inputs with Discrete actions, in fp32."""
    for name in model.group_names():
        networks = model.group(name)
        actor, critic = networks.actor, networks.critic
        if not isinstance(actor.action_space, gym.spaces.Discrete):
            return (
                f"group '{name}' has {actor.action_space} actions; the compiled rollout covers Discrete ones"
            )
        for core in (actor.core, critic.core):
            if isinstance(core, StackedRecurrent) and core.kind != "gru":
                return (
                    f"group '{name}' has an {core.kind.upper()} network; the compiled rollout covers GRU "
                    "and feed-forward ones"
                )
        if actor.features is not None or critic.images is not None:
            return f"group '{name}' reads images through a CNN; the compiled rollout covers vector inputs"
        for net in (actor.net, critic.net):
            if net.precision != "fp32":
                return f"model.precision={net.precision}; the compiled rollout computes in fp32"
            if net.activation not in ACTIVATION_NAMES:
                return f"group '{name}' has an MLP the compiled rollout does not cover"
    return None


def recurrent_reason(model: TeamModel) -> str | None:
    """Why the JAX learner cannot update `model` (one line) where its rollout is compiled, or None:
    the learner's forward covers feed-forward networks only."""
    for name in model.group_names():
        networks = model.group(name)
        if networks.actor.carry_size or networks.critic.carry_size:
            return f"group '{name}' has a recurrent network; the JAX learner covers feed-forward ones"
    return None


def learner_unsupported_reason(config: ExperimentConfig, rollout_path: str | None) -> str | None:
    """Why `fast.learner: jax` cannot update the run of `config` (one line), or None where it can: the
    compiled learner (`algo.jax_trainer`) covers the runs whose rollout is compiled (`rollout.compiled`
    settled true: feed-forward or GRU networks over vectors, Discrete actions, fp32; `rollout_path` is
    `settle_compiled`'s line, None for an env that is not JaxMARL's), with feed-forward networks, a
    simultaneous actor update and no policy lag."""
    ppo = config.ppo
    if config.rollout.compiled is not True:
        if rollout_path is None:
            return f"env '{config.env.id}' is not a JaxMARL env, and the JAX learner needs a compiled rollout"
        return f"the rollout is {rollout_path}, and the JAX learner needs a compiled rollout"
    if ppo.actor_update != "simultaneous":
        return f"ppo.actor_update={ppo.actor_update} (HAPPO's turns); the JAX learner updates every actor at once"
    if config.rollout.policy_lag:
        return (
            f"rollout.policy_lag={config.rollout.policy_lag} (ppo.lagged_ratio); "
            "the JAX learner takes on-policy batches only"
        )
    if config.model.precision != "fp32":
        return f"model.precision={config.model.precision}; the JAX learner computes in fp32"
    if config.model.recurrent is not None:
        return f"model.recurrent={config.model.recurrent}; the JAX learner covers feed-forward networks"
    return None


def settle_learner(config: ExperimentConfig, rollout_path: str | None) -> str | None:
    """How the run's updates run, for the start line: `compiled (one JAX program per update)` where
    `fast.learner: jax`, else None (torch's learner). `jax` where the run is not covered is a
    ConfigError with the reason (`learner_unsupported_reason`)."""
    if config.fast.learner != "jax":
        return None
    reason = learner_unsupported_reason(config, rollout_path)
    if reason is not None:
        raise ConfigError(f"fast.learner=jax: {reason}; set fast.learner=torch")
    return "compiled (one JAX program per update)"


def settle_compiled(config: ExperimentConfig, layout: EnvLayout) -> tuple[ExperimentConfig, str | None]:
    """`config` with `rollout.compiled` settled to true or false, and for a JaxMARL env how its
    rollouts run, for the start line (`compiled (lax.scan over T steps)` or `per-step (reason)`; None
    for other envs). `true` where the run cannot be compiled is a ConfigError with the reason."""
    jax_env = isinstance(layout, BatchedLayout) and layout.own_threads
    reason = _per_step_reason(config, layout) if jax_env else f"env '{config.env.id}' is not a JaxMARL env"
    if reason is not None and config.rollout.compiled is True:
        raise ConfigError(f"rollout.compiled=true: {reason}; set rollout.compiled: auto or false")
    rollout = dataclasses.replace(config.rollout, compiled=reason is None)
    settled = dataclasses.replace(config, rollout=rollout)
    if not jax_env:
        return settled, None
    if reason is None:
        return settled, f"compiled (lax.scan over {config.rollout.rollout_steps} steps)"
    return settled, f"per-step ({reason})"


def _per_step_reason(config: ExperimentConfig, layout: EnvLayout) -> str | None:
    """Why a JaxMARL env's rollouts step per step (one line), or None where they can be compiled."""
    if config.rollout.compiled is False:
        return "rollout.compiled=false"
    if config.league.opponents not in (None, "latest"):
        return f"league.opponents={config.league.opponents} acts snapshots beside the learner at every step"
    probe = build_vector_env(config, layout)
    try:
        if not isinstance(probe, JaxVectorEnv):
            return f"env '{config.env.id}' is not a JaxMARL vector env"
        with torch.device("meta"):  # the networks' structure only: no weights initialised
            model = TeamModel(probe.spec, config)
    finally:
        probe.close()
    return unsupported_reason(model)
