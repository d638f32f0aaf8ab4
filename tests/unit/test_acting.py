"""Every acting caller steps the policy through an `ActingView`: the collector, evaluation, the scores
against a random opponent and video compute the same numbers, in float32 and under bf16 on a CPU."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from marl_ppo.config import load_config
from marl_ppo.eval.evaluate import eval_config, run_episodes
from marl_ppo.eval.versus import play_vs_random
from marl_ppo.eval.video import record_episode, render_env
from marl_ppo.models.acting import ActingMLP, ActingView
from marl_ppo.models.distributions import ActionDistribution
from marl_ppo.models.team import GroupActor, TeamModel
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.memory import FirstStep
from marl_ppo.rollout.stepper import PolicyActing
from tests.helpers import ROOT, vector_env

CPU = torch.device("cpu")
SEED = 7
STEPS = 6
"""Every episode's length (`max_cycles`): one rollout, one evaluation episode, one recorded episode."""


def _logits(dist):
    """The first (here the only) action head's logits of an acting or learning distribution."""
    return dist.parts[0].logits


@dataclass(frozen=True)
class _Call:
    """One actor forward while acting: its group, the MLP it ran on, its inputs and distributions."""

    name: str
    net: object
    inputs: tuple[torch.Tensor, ...]
    dist: ActionDistribution

    @property
    def logits(self) -> torch.Tensor:
        return _logits(self.dist)


class _Recorder:
    """Records every `GroupActor.forward_with` call and every sampled action."""

    def __init__(self, model: TeamModel, monkeypatch: pytest.MonkeyPatch) -> None:
        names = {id(model.group(name).actor): name for name in model.group_names()}
        self.calls: list[_Call] = []
        self.actions: list[torch.Tensor] = []
        forward_with, sample = GroupActor.forward_with, FirstStep.sample

        def recorded_forward(actor, net, *inputs):
            dist, carry = forward_with(actor, net, *inputs)
            copies = tuple(t.clone() for t in inputs)
            self.calls.append(_Call(names[id(actor)], net, copies, dist))
            return dist, carry

        def recorded_sample(step):
            actions = sample(step)
            self.actions.append(actions.clone())
            return actions

        monkeypatch.setattr(GroupActor, "forward_with", recorded_forward)
        monkeypatch.setattr(FirstStep, "sample", recorded_sample)

    def take(self) -> tuple[list[_Call], list[torch.Tensor]]:
        """The calls and actions so far, and start afresh."""
        taken = self.calls, self.actions
        self.calls, self.actions = [], []
        return taken


def _config(precision: str, recurrent: str | None):
    return load_config(
        ROOT / "experiments/mpe/simple_spread.yaml",
        [
            f"env.kwargs.max_cycles={STEPS}",
            "rollout.num_envs=1",
            f"rollout.rollout_steps={STEPS}",
            "rollout.vector=sync",
            "ppo.num_minibatches=1",
            "model.hidden_sizes=[16,16]",
            f"model.precision={precision}",
            f"model.recurrent={'null' if recurrent is None else recurrent}",
        ],
    )


def _log_probs(calls: list[_Call], actions: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each step's log-probabilities `(E, A)` of its actions, as the collector computes them."""
    return [FirstStep(call.dist).log_prob(chosen) for call, chosen in zip(calls, actions, strict=True)]


@pytest.mark.parametrize("recurrent", [None, "gru"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_acting_caller_gives_the_same_actions_and_log_probs(precision, recurrent, monkeypatch):
    pytest.importorskip("pygame")  # mpe2's frames for the recorded episode
    config = _config(precision, recurrent)
    torch.manual_seed(0)
    venv = vector_env(config)
    model = TeamModel(venv.spec, config)
    recorder = _Recorder(model, monkeypatch)
    taken = {}
    try:
        collector = Collector(venv, model, CPU)
        collector.start(SEED)
        torch.manual_seed(SEED)  # what evaluation and video seed their sampling with
        buffer = RolloutBuffer(venv.spec, STEPS, 1, memory=model.memory_layout())
        collector.collect(buffer)
        taken["collector"] = recorder.take()
        run_episodes(venv, model, CPU, episodes=1, seed=SEED, deterministic=False)
        taken["evaluation"] = recorder.take()
        policy = PolicyActing(model, 1, CPU, deterministic=False)
        play_vs_random(venv, policy, CPU, mode="seats", episodes_per_side=1, seed=SEED)
        taken["versus"] = recorder.take()
    finally:
        venv.close()
    env = render_env(config)
    try:
        record_episode(env, venv.spec, model, CPU, seed=SEED, deterministic=False)
    finally:
        env.close()
    taken["video"] = recorder.take()

    reference = ActingView(model)
    for caller, (calls, _) in taken.items():
        # one acting MLP per group for the whole rollout or set of episodes, read from the weights once
        assert calls and all(isinstance(call.net, ActingMLP) for call in calls), caller
        assert len({id(call.net) for call in calls}) == len(model.group_names()), caller
        for call in calls:  # the numbers of the one acting path
            dist, _ = reference.actor(call.name, *call.inputs)
            assert torch.equal(_logits(dist), call.logits), caller

    # the same env seed and sampling seed: the same episode, action for action
    collected, collected_actions = taken["collector"]
    stored = buffer.groups["agent"]
    assert len(collected) == STEPS
    assert torch.equal(stored.actions, torch.stack(collected_actions).to(stored.actions.dtype))
    assert torch.equal(stored.logp, torch.stack(_log_probs(collected, collected_actions)))
    for caller in ("evaluation", "video"):
        calls, actions = taken[caller]
        assert len(calls) == STEPS, caller
        assert torch.equal(torch.stack(actions), torch.stack(collected_actions)), caller
        assert torch.equal(torch.stack(_log_probs(calls, actions)), stored.logp), caller
    first, first_actions = taken["versus"][0][0], taken["versus"][1][0]  # then random seats play too
    assert torch.equal(first.logits, collected[0].logits) and torch.equal(first_actions, collected_actions[0])


def test_acting_reads_the_weights_when_its_view_is_built():
    """A view built after an update acts with the new weights; one built before keeps the folded
    first layers it read (a view serves one rollout or one set of episodes)."""
    config = _config("fp32", None)
    spec_env = vector_env(eval_config(config, 1))
    try:
        spec = spec_env.spec
    finally:
        spec_env.close()
    torch.manual_seed(0)
    model = TeamModel(spec, config)
    actor = model.group("agent").actor
    obs = torch.randn(1, 2, 3, spec.groups[0].obs_dim)
    inputs = (obs, torch.ones(1, 2, 3, 0, dtype=torch.bool), torch.zeros(2, 3, 0))
    flags = torch.ones(1, 2, 3, dtype=torch.bool)
    before = ActingView(model)
    with torch.no_grad():
        want, _ = actor(*inputs, flags, flags)
        got, _ = before.actor("agent", *inputs, flags, flags)
        assert torch.equal(_logits(got), _logits(want))
        assert actor.net.norm_weight is not None
        actor.net.norm_weight.mul_(1.5)  # an update
        moved, _ = actor(*inputs, flags, flags)
        after, _ = ActingView(model).actor("agent", *inputs, flags, flags)
        stale, _ = before.actor("agent", *inputs, flags, flags)
    assert torch.equal(_logits(after), _logits(moved))
    assert not torch.equal(_logits(moved), _logits(want))
    assert torch.equal(_logits(stale), _logits(want))
