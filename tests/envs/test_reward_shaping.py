"""Shaped rewards (`env.shaped_reward`, `rollout.shaping`): the weight falls linearly to 0 over its
steps, read at each rollout's start; JaxMARL's Overcooked reports its shaped reward beside its own;
the per-step collector and the compiled rollout store `reward + weight * shaped` bit for bit alike, on
a hand-played onion put in the pot (3 x the weight), while the episodes' returns keep the env's own
reward; an env without a shaped reward, and an anneal without one, are refused in one line."""

import numpy as np
import pytest
import torch

import marl_ppo.rollout.memory as memory_module
from marl_ppo.config import ConfigError, load_config
from marl_ppo.envs.jax.catalog import reports_shaped_reward
from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.copies import settle_copies
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.compiled import CompiledSource
from marl_ppo.rollout.shaping import WEIGHT_TAG, RewardShaping, reward_shaping
from tests.helpers import vector_env

CPU = torch.device("cpu")
COPIES = 2
STEPS = 5
"""One rollout is one whole episode (`max_steps: 5`)."""

UP, RIGHT, LEFT, STAY, INTERACT = 0, 2, 3, 4, 5
"""JaxMARL's Overcooked actions."""
COOK_0 = [LEFT, INTERACT, RIGHT, UP, INTERACT]
"""On cramped_room, cook 0 starts beside the onion pile on its left, one step left of the cell below the
pot: face the pile, take an onion, step right, face the pot, put it in (shaped reward 3, at step 4)."""


def test_the_weight_falls_linearly_from_its_start_to_zero_at_its_steps_and_stays_there():
    annealed = RewardShaping(2.0, 2_500_000)
    weights = [annealed.weight_at(steps) for steps in (0, 625_000, 1_250_000, 2_500_000, 5_000_000)]
    assert weights == [2.0, 1.5, 1.0, 0.0, 0.0]
    assert RewardShaping(0.5).weight_at(10**9) == 0.5
    config = load_config(None, ["env.shaped_reward=1.5", "env.shaped_reward_steps=100"])
    assert reward_shaping(config) == RewardShaping(1.5, 100)
    assert reward_shaping(load_config(None, [])) is None


def test_an_env_without_a_shaped_reward_and_an_anneal_of_none_are_refused_in_one_line():
    assert reports_shaped_reward("jaxmarl/overcooked_coord_ring")
    assert not reports_shaped_reward("jaxmarl/smax_3m") and not reports_shaped_reward("mpe2/simple_spread_v3")
    with pytest.raises(ConfigError) as refused:
        plan_run(load_config(None, ["env.id=mpe2/simple_spread_v3", "env.shaped_reward=1"]))
    assert str(refused.value) == (
        "env.shaped_reward=1.0: env 'mpe2/simple_spread_v3' reports no shaped reward (JaxMARL's Overcooked "
        "layouts do); set env.shaped_reward: 0"
    )
    with pytest.raises(ConfigError, match="env.shaped_reward"):
        load_config(None, ["env.shaped_reward=-1"])
    with pytest.raises(ConfigError) as unshaped:
        plan_run(load_config(None, ["env.id=jaxmarl/overcooked_coord_ring", "env.shaped_reward_steps=100"]))
    assert str(unshaped.value) == (
        "env.shaped_reward_steps=100 anneals a shaped reward that is off (env.shaped_reward: 0); set "
        "env.shaped_reward to its starting weight, or env.shaped_reward_steps: null"
    )


@pytest.mark.jax
def test_both_rollout_paths_store_the_shaped_reward_by_its_weight_and_returns_keep_the_envs_own(monkeypatch):
    config = settle_copies(
        load_config(
            None,
            [
                "env.id=jaxmarl/overcooked_cramped_room",
                "env.kwargs={max_steps: 5}",
                f"rollout.num_envs={COPIES}",
                f"rollout.rollout_steps={STEPS}",
                "model.hidden_sizes=[16,16]",
            ],
        )
    )
    compiled_env, per_step_env = vector_env(config), vector_env(config)
    assert isinstance(compiled_env, JaxVectorEnv) and isinstance(per_step_env, JaxVectorEnv)
    (group,) = compiled_env.spec.groups
    torch.manual_seed(2)
    model = TeamModel(compiled_env.spec, config)
    # over 2 rollouts of 10 env steps each: the first at weight 2, the second at 1
    shaping = RewardShaping(2.0, 2 * STEPS * COPIES)
    source = CompiledSource(compiled_env, model, CPU, steps=STEPS, seed=0)
    collector = Collector(per_step_env, model, CPU)
    source.shaping = collector.shaping = shaping
    actions = torch.tensor([[a, STAY] for a in COOK_0]).unsqueeze(1).expand(STEPS, COPIES, 2).contiguous()

    def replayed(params, key, memory):
        return source.rollout.replay(params, {group.name: actions}, memory)

    monkeypatch.setattr(source.rollout, "run", replayed)
    queue: list[torch.Tensor] = []
    monkeypatch.setattr(memory_module.FirstStep, "sample", lambda self: queue.pop(0).clone())
    seen = []
    original_step = per_step_env.step

    def step(sent):
        arrays = original_step(sent)
        shaped = per_step_env.shaped_reward
        assert shaped is not None
        seen.append((arrays.groups[group.name].reward.clone(), shaped[group.name].clone()))
        return arrays

    monkeypatch.setattr(per_step_env, "step", step)
    source.start(0)
    collector.start(0)
    for weight in (2.0, 1.0):
        compiled = RolloutBuffer(compiled_env.spec, STEPS, COPIES, memory=model.memory_layout())
        per_step = RolloutBuffer(compiled_env.spec, STEPS, COPIES, memory=model.memory_layout())
        got = source.collect(compiled)
        queue.extend(actions)
        want = collector.collect(per_step)
        stored = compiled.groups[group.name].rewards
        assert torch.equal(stored, per_step.groups[group.name].rewards)
        assert torch.equal(compiled.groups[group.name].actions, per_step.groups[group.name].actions)
        # the onion goes into the pot at step 4 in both copies: 3 x the weight to cook 0, nothing else
        expected = torch.zeros(STEPS, COPIES, 2)
        expected[4, :, 0] = 3.0 * weight
        assert torch.equal(stored, expected)
        env_rewards = torch.stack([reward for reward, _ in seen[-STEPS:]])
        shaped = torch.stack([reward for _, reward in seen[-STEPS:]])
        assert torch.equal(stored, env_rewards + weight * shaped)
        assert got.perf[WEIGHT_TAG] == want.perf[WEIGHT_TAG] == weight
        # each copy's episode ends at the rollout's last step, its returns the env's own (no soup: 0)
        for result in (got, want):
            assert [episode.length for episode in result.episodes] == [STEPS] * COPIES
            assert all(np.array_equal(e.agent_returns, [0.0, 0.0]) for e in result.episodes)
    assert not queue
