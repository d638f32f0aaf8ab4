"""Recurrent policies: torch's cell equations, sequence chunks that recompute what acted, state resets,
every collection mode acting alike, and exact resume."""

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.losses import approx_kl
from marl_ppo.algo.sequences import critic_values as _critic_values
from marl_ppo.algo.sequences import cut_batch, unchunk
from marl_ppo.algo.sequences import policy as _policy
from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import ConfigError, load_config
from marl_ppo.models.layers import stacked_linear
from marl_ppo.models.recurrent import StackedRecurrent
from marl_ppo.plan.copies import settle_copies
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.run.build import build_collector
from marl_ppo.run.loop import train
from tests.helpers import (
    DEVICES,
    ROOT,
    K,
    Killed,
    assert_same_run_state,
    crash_at_update,
    grad_of,
    vector_env,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # workers compute with one thread: bit-identical products

SPREAD_YAML = ROOT / "experiments/mpe/simple_spread.yaml"


def _spread(tiny_overrides, *extra):
    """simple_spread with 7-step episodes: episode starts fall inside chunks of 5 and of 10."""
    return load_config(
        SPREAD_YAML,
        [
            *tiny_overrides,
            "rollout.num_envs=3",
            "rollout.rollout_steps=20",
            "env.kwargs.max_cycles=7",
            "model.recurrent=gru",
            "model.recurrent_size=8",
            "rollout.vector=sync",
            "rollout.policy_lag=0",
            *extra,
        ],
    )


def _collect(config, seed=0):
    torch.manual_seed(seed)
    collector, model = build_collector(plan_run(config))
    try:
        collector.start(seed)
        buffer = RolloutBuffer(
            model.spec, config.rollout.rollout_steps, config.rollout.copies, memory=model.memory_layout()
        )
        result = collector.collect(buffer)
    finally:
        collector.close()
    return model, buffer, result


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("copies", [1, 3])
def test_stacked_cells_compute_torchs_cells(kind, copies):
    torch.manual_seed(0)
    layer = StackedRecurrent(kind, copies=copies, in_dim=5, hidden=4, orthogonal_init=True)
    with torch.no_grad():
        for parameter in (layer.bias_ih, layer.bias_hh):
            parameter.uniform_(-0.5, 0.5)
    x, state = torch.randn(6, 3, 5), torch.randn(6, 3, layer.state_size)
    got = layer.cell(stacked_linear(x, layer.weight_ih, layer.bias_ih), state)
    for agent in range(3):
        w = agent if copies > 1 else 0
        cell = nn.GRUCell(5, 4) if kind == "gru" else nn.LSTMCell(5, 4)
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(cell, name).copy_(getattr(layer, name)[w])
        if kind == "gru":
            expected = cell(x[:, agent], state[:, agent])
        else:
            h, c = cell(x[:, agent], (state[:, agent, :4], state[:, agent, 4:]))
            expected = torch.cat([h, c], -1)
        torch.testing.assert_close(got[:, agent], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("copies", [1, 3])
def test_the_stacked_step_and_torchs_cells_unroll_alike(kind, copies):
    """`fast.recurrent_cell: false` (torch's cells) computes the same outputs, states and gradients."""
    results = []
    for library in (False, True):
        torch.manual_seed(0)  # the same weights and inputs for both
        layer = StackedRecurrent(
            kind, copies=copies, in_dim=5, hidden=4, orthogonal_init=False, library_cell=library
        )
        x, state = torch.randn(6, 2, 3, 5), torch.randn(2, 3, layer.state_size)
        is_first, acted = torch.rand(6, 2, 3) < 0.2, torch.rand(6, 2, 3) < 0.7
        outputs, final = layer(x, state, is_first, acted)
        (outputs.sum() + final.pow(2).sum()).backward()
        results.append((outputs.detach(), final.detach(), [grad_of(p).clone() for p in layer.parameters()]))
    (ours, ours_final, ours_grads), (torchs, torchs_final, torchs_grads) = results
    torch.testing.assert_close(ours, torchs, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours_final, torchs_final, rtol=0, atol=1e-6)
    for a, b in zip(ours_grads, torchs_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_unroll_resets_at_episode_starts_and_holds_the_state_where_an_agent_waits():
    torch.manual_seed(0)
    layer = StackedRecurrent("gru", copies=1, in_dim=3, hidden=4, orthogonal_init=False)
    x = torch.randn(4, 1, 2, 3)
    state = torch.randn(1, 2, 4)
    is_first = torch.tensor([[False, False], [False, False], [True, False], [False, False]]).unsqueeze(1)
    acted = torch.tensor([[True, True], [True, False], [True, False], [True, True]]).unsqueeze(1)
    outputs, final = layer(x, state, is_first, acted)
    projected = nn.functional.linear(x, layer.weight_ih[0], layer.bias_ih[0])
    h0 = layer.cell(projected[0], state)
    torch.testing.assert_close(outputs[0], h0, rtol=0, atol=0)
    # agent 0 acts every step and restarts from zero at step 2
    torch.testing.assert_close(
        outputs[2, :, 0], layer.cell(projected[2], torch.zeros(1, 2, 4))[:, 0], rtol=0, atol=0
    )
    # agent 1 waits at steps 1 and 2: its state at step 3 is the one after step 0
    torch.testing.assert_close(outputs[3, :, 1], layer.cell(projected[3], h0)[:, 1], rtol=0, atol=0)
    assert torch.equal(final[:, 1], outputs[3, :, 1])


@pytest.mark.parametrize("critic", ["state", "team", "obs"])
def test_recomputed_outputs_equal_the_acting_ones_for_every_chunk_length(tiny_overrides, critic):
    """Before the first update, ratio 1 and KL 0 for chunks of 1, 5 and the whole rollout, with
    episode starts inside chunks; the per-step outputs do not depend on the chunk length."""
    config = _spread(tiny_overrides, f"ppo.critic={critic}")
    model, buffer, result = _collect(config)
    stored = buffer.groups["agent"]
    first = buffer.memory["agent"].is_first.any(-1)
    assert first[1:].any() and not first[5::5].all(), "episode starts inside the chunks"
    outputs = []
    for length in (1, 5, None):
        ppo = dataclasses.replace(config.ppo, chunk_length=length)
        fresh = copy.deepcopy(model)  # prepare moves its value normalizer's statistics; `model`'s acted
        trainer = Trainer(fresh, ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0))
        batches = rollout_batches(
            buffer, result.last_values, result.last_alive, gamma=0.9, lam=0.9, team=critic == "team"
        )
        prepared = trainer.prepare(batches)["agent"]
        with torch.no_grad():
            actor, critic_net, norm = model.group("agent")
            logp = _policy(actor, prepared).log_prob(prepared.actions)
            values = norm.denormalize(_critic_values(critic_net, prepared))
        alive = prepared.alive
        assert float(approx_kl(logp, prepared.logp_old, alive)) < 1e-10
        ratio = (logp - prepared.logp_old).exp()[alive]
        torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-5)
        steps = (
            unchunk(logp, steps=config.rollout.rollout_steps),
            unchunk(values, steps=config.rollout.rollout_steps),
        )
        torch.testing.assert_close(steps[0], stored.logp, rtol=0, atol=1e-5)
        torch.testing.assert_close(steps[1], stored.values, rtol=0, atol=1e-5)
        outputs.append(steps)
    for logp, values in outputs[1:]:
        torch.testing.assert_close(logp, outputs[0][0], rtol=0, atol=1e-5)
        torch.testing.assert_close(values, outputs[0][1], rtol=0, atol=1e-5)


def test_an_observation_before_an_episode_start_changes_no_output_after_it(tiny_overrides):
    config = _spread(tiny_overrides, "ppo.chunk_length=null")
    model, buffer, result = _collect(config)
    memory = buffer.memory["agent"]
    start = int(torch.nonzero(memory.is_first[1:, 0, 0])[0]) + 1  # copy 0's second episode
    batches = rollout_batches(buffer, result.last_values, result.last_alive, gamma=0.9, lam=0.9)

    def outputs(batch):
        trainer = Trainer(model, config.ppo.settled(convolutional=False), generator=torch.Generator())
        prepared = trainer.prepare({"agent": batch})["agent"]
        with torch.no_grad():
            actor, critic, _ = model.group("agent")
            logits = _policy(actor, prepared).log_prob(prepared.actions)
            values = _critic_values(critic, prepared)
        return unchunk(logits, steps=config.rollout.rollout_steps), unchunk(
            values, steps=config.rollout.rollout_steps
        )

    batch = batches["agent"]
    changed_obs = batch.obs.clone().reshape(
        config.rollout.rollout_steps, config.rollout.copies, *batch.obs.shape[1:]
    )
    noise = torch.Generator().manual_seed(1)  # not a constant shift, which the input LayerNorm removes
    changed_obs[:start, 0] += torch.randn(changed_obs[:start, 0].shape, generator=noise)
    changed_state = batch.state.clone().reshape(config.rollout.rollout_steps, config.rollout.copies, -1)
    changed_state[:start, 0] += torch.randn(changed_state[:start, 0].shape, generator=noise)
    changed = dataclasses.replace(batch, obs=changed_obs.flatten(0, 1), state=changed_state.flatten(0, 1))
    (logp_a, values_a), (logp_b, values_b) = outputs(batch), outputs(changed)
    assert torch.equal(logp_a[start:, 0], logp_b[start:, 0]) and torch.equal(
        values_a[start:, 0], values_b[start:, 0]
    )
    assert not torch.equal(logp_a[:start, 0], logp_b[:start, 0])  # the change reached the outputs before


@pytest.mark.parametrize(("vector", "workers"), [("subprocess", 2), ("workers", 1)])
def test_the_recurrent_policy_acts_alike_in_every_collection_mode(tiny_overrides, vector, workers):
    """Env worker processes step for the learner, which samples; one rollout worker over every copy
    samples with its own seed, so the sync collector is seeded alike."""
    from marl_ppo.rollout.slice import worker_seed

    config = _spread(tiny_overrides, f"rollout.num_workers={workers}")
    reference, _, _ = _collect(config)
    collected = []
    for mode in ("sync", vector):
        torch.manual_seed(0)
        collector, model = build_collector(
            plan_run(dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, vector=mode)))
        )
        model.load_state_dict(reference.state_dict())
        try:
            collector.start(1)
            torch.manual_seed(worker_seed(1, 0))
            buffers = []
            for _ in range(2):  # the states carry over from the first rollout into the second
                buffer = RolloutBuffer(
                    model.spec,
                    config.rollout.rollout_steps,
                    config.rollout.copies,
                    memory=model.memory_layout(),
                )
                result = collector.collect(buffer)
                buffers.append((buffer, result))
        finally:
            collector.close()
        collected.append(buffers)
    for (a, result_a), (b, result_b) in zip(*collected, strict=True):
        for position, (x, y) in enumerate(zip(a.tensors(), b.tensors(), strict=True)):
            assert torch.equal(x, y), f"buffer tensor {position}"
        assert torch.equal(result_a.last_values["agent"], result_b.last_values["agent"])
    assert collected[0][1][0].memory["agent"].actor_state.abs().sum() > 0


@pytest.mark.parametrize(("vector", "lag"), [("sync", 0), ("subprocess", 0), ("workers", 0), ("workers", 1)])
def test_a_recurrent_run_killed_mid_episode_resumes_to_the_uninterrupted_weights(
    tiny_overrides, tmp_path, monkeypatch, vector, lag
):
    config = load_config(
        SPREAD_YAML,
        [
            *tiny_overrides,
            "rollout.rollout_steps=10",
            f"total_steps={2 * K * 20}",
            f"log.checkpoint_every={K}",
            f"rollout.vector={vector}",
            "rollout.num_workers=2",
            f"rollout.policy_lag={lag}",
            "model.recurrent=gru",
            "model.recurrent_size=8",
            "ppo.chunk_length=4",
        ],
    )
    straight = train(config, tmp_path / "straight")
    crash_at_update(monkeypatch, K + 2)
    with pytest.raises(Killed):
        train(config, tmp_path / "resumed")
    monkeypatch.undo()
    saved = load_checkpoint(tmp_path / "resumed/checkpoints/latest.pt")
    assert saved["updates"] == K and saved["env_steps"] % 25 != 0  # 25-step episodes: killed mid-episode
    if vector == "workers":  # each worker saves its collector's live states
        memories = [worker["collector"]["memory"] for worker in saved["collector"]["workers"]]
    else:
        memories = [saved["collector"]["memory"]]
    assert all(memory["agent"]["actor"].abs().sum() > 0 for memory in memories)
    resumed = train(config, tmp_path / "resumed", resume=True)
    assert resumed.team_return_mean == straight.team_return_mean
    assert_same_run_state(
        tmp_path / "straight/checkpoints/final.pt", tmp_path / "resumed/checkpoints/final.pt"
    )


def test_recurrent_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="model.recurrent_critic=true needs a recurrent layer"):
        load_config(None, ["model.recurrent_critic=true"])
    with pytest.raises(ConfigError, match=r"ppo.num_minibatches=4 exceeds the 2 sequence chunks"):
        load_config(
            None,
            [
                "model.recurrent=gru",
                "rollout.num_envs=2",
                "rollout.rollout_steps=10",
                "ppo.chunk_length=null",
            ],
        )
    config = load_config(None, ["model.recurrent=lstm"])
    assert config.model.critic_recurrent and config.sequence_chunks is None  # the copies are the env's
    assert settle_copies(config).sequence_chunks == 16 * 10
    assert not load_config(
        None, ["model.recurrent=gru", "model.recurrent_critic=false"]
    ).model.critic_recurrent


def test_chunks_pad_an_uneven_rollout_with_steps_that_neither_act_nor_count():
    from marl_ppo.algo.batch import AgentBatch

    steps, envs = 5, 2
    rows = torch.arange(steps * envs, dtype=torch.float32).reshape(-1, 1)  # row t * E + e
    alive = torch.ones(steps * envs, 1, dtype=torch.bool)
    batch = AgentBatch(
        steps=steps,
        obs=rows,
        state=rows,
        action_mask=rows[:, :0],
        actions=rows,
        logp_old=rows,
        values_old=rows,
        advantages=rows,
        returns=rows,
        alive=alive,
        is_first=alive,
        acted=alive,
        actor_carry=rows.unsqueeze(-1),
        critic_carry=rows.unsqueeze(-1),
    )
    chunked = cut_batch(batch, length=3, advantages=rows, returns=rows, value_ref=rows)
    assert chunked.inputs.obs.shape == (3, 4, 1) and chunked.actor_carry.shape == (4, 1, 1)
    # chunk k * E + e starts at step 3k of copy e
    assert chunked.actor_carry.flatten().tolist() == [0.0, 1.0, 6.0, 7.0]
    assert chunked.inputs.obs[:, 2, 0].tolist() == [6.0, 8.0, 0.0]
    assert chunked.alive[:, 2, 0].tolist() == [True, True, False]
    assert not chunked.inputs.acted[2, 2:].any()
    assert torch.equal(unchunk(chunked.inputs.obs, steps=steps), rows.reshape(steps, envs, 1))
    assert torch.equal(chunked.weight, torch.ones_like(chunked.weight))  # on-policy: every sample weighs 1
    assert torch.equal(chunked.logp_ref, chunked.logp_old)


def test_a_players_state_advances_only_on_its_own_moves(tiny_overrides):
    config = load_config(
        ROOT / "experiments/classic/tictactoe_v3.yaml",
        [
            *tiny_overrides,
            "rollout.vector=sync",
            "rollout.num_envs=3",
            "rollout.rollout_steps=30",
            "model.recurrent=gru",
        ],
    )
    _, buffer, _ = _collect(config)
    memory, alive = buffer.memory["player"], buffer.groups["player"].alive
    same_episode = ~memory.is_first[:-1] & ~memory.is_first[1:]  # no reset at t or at t + 1
    held = ~alive[:-1] & same_episode  # waited at t
    moved = alive[:-1] & ~memory.is_first[1:]
    change = (memory.actor_state[1:] - memory.actor_state[:-1]).abs().amax(-1)
    assert held.sum() > 20 and moved.sum() > 20
    assert (change[held] == 0).all() and (change[moved] > 0).all()
    # both players start afresh together, at the step after a game ended
    over = buffer.groups["player"].terminated.any(-1) | buffer.groups["player"].truncated.any(-1)
    assert torch.equal(memory.is_first[1:], over[:-1].unsqueeze(-1).expand_as(memory.is_first[1:]))


def test_an_agent_that_left_carries_a_fresh_state_until_the_next_episode(tiny_overrides):
    config = load_config(
        None,
        [
            *tiny_overrides,
            "env.id=envs/early_leaver_v0",
            "env.kwargs={leave_at: 2, max_steps: 5}",
            "rollout.vector=sync",
            "rollout.num_envs=2",
            "rollout.rollout_steps=12",
            "model.recurrent=gru",
        ],
    )
    _, buffer, _ = _collect(config)
    memory, stored = buffer.memory["agent"], buffer.groups["agent"]
    leaver = 1
    left = stored.terminated[:, :, leaver]  # its last step of each episode
    assert (
        left.sum() == 6
        and torch.equal(  # 12 steps of 5-step episodes, 2 copies
            memory.is_first[1:, :, leaver], (left | stored.truncated[:, :, 0])[:-1]
        )
    )
    absent_after = ~stored.alive[:, :, leaver] & ~memory.is_first[:, :, leaver]
    assert absent_after.sum() > 0
    assert (memory.actor_state[:, :, leaver][absent_after] == 0).all()
    acting = stored.alive[:, :, leaver] & ~memory.is_first[:, :, leaver]  # its second step: a state to carry
    assert acting.sum() == 6 and (memory.actor_state[:, :, leaver][acting].abs().sum(-1) > 0).all()


def test_a_recurrent_run_evaluates_deterministic_and_sampled_and_records_a_gif(tiny_overrides, tmp_path):
    from PIL import Image

    from marl_ppo.eval.from_checkpoint import evaluate_checkpoint

    config = load_config(
        SPREAD_YAML,
        [
            *tiny_overrides,
            "rollout.vector=sync",
            "rollout.policy_lag=0",
            "model.recurrent=lstm",
            "eval.every=50",
            "eval.episodes=2",
        ],
    )
    train(config, tmp_path / "run")
    runs = [
        evaluate_checkpoint(
            tmp_path / "run", episodes=3, deterministic=deterministic, out=tmp_path / name, render=render
        )
        for deterministic, name, render in ((True, "a", "gif"), (True, "b", None), (False, "c", None))
    ]
    first, again, sampled = (run.result for run in runs)
    assert len(first.team_returns) == 3 and np.array_equal(first.team_returns, again.team_returns)
    assert not np.array_equal(first.team_returns, sampled.team_returns)
    assert runs[0].video is not None and Image.open(runs[0].video).n_frames <= 26  # type: ignore[attr-defined]  # a GIF and (first.lengths == 25).all()


def test_a_recurrent_policy_in_vmas_restarts_the_states_of_finished_copies():
    pytest.importorskip("vmas")
    from marl_ppo.models.team import TeamModel
    from marl_ppo.rollout.collector import Collector

    config = load_config(
        None,
        ["env.id=vmas/navigation", "env.kwargs={max_steps: 4}", "rollout.num_envs=4", "model.recurrent=gru"],
    )
    venv = vector_env(config)
    torch.manual_seed(0)
    model = TeamModel(venv.spec, config)
    cpu = torch.device("cpu")
    buffer = RolloutBuffer(venv.spec, 10, config.rollout.copies, memory=model.memory_layout())
    collector = Collector(venv, model, cpu)
    collector.start(0)

    collector.collect(buffer)
    memory = buffer.memory["agent"]
    # 4-step episodes: every copy's agents start afresh at steps 0, 4 and 8
    starts = memory.is_first.all(-1).all(-1).nonzero().flatten().tolist()
    assert starts == [0, 4, 8] and memory.is_first.sum() == 3 * 4 * 4
    assert memory.actor_state[1:4].abs().sum(-1).gt(0).all() and memory.critic_state[5:8].abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_recurrent_vmas_rollout_and_update_stay_on_the_device(device):
    pytest.importorskip("vmas")
    from marl_ppo.algo.batch import rollout_batches
    from marl_ppo.models.team import TeamModel
    from marl_ppo.rollout.collector import Collector

    where = torch.device(device)
    config = load_config(
        None,
        [
            "env.id=vmas/navigation",
            "env.kwargs={max_steps: 6}",
            "rollout.num_envs=4",
            "model.recurrent=gru",
            f"host.device={device}",
            "ppo.num_minibatches=2",
        ],
    )
    venv = vector_env(config, where)
    torch.manual_seed(0)
    model = TeamModel(venv.spec, config).to(where)
    buffer = RolloutBuffer(venv.spec, 8, config.rollout.copies, where, model.memory_layout())
    collector = Collector(venv, model, where)
    collector.start(0)
    result = collector.collect(buffer)
    assert all(t.device.type == where.type for t in buffer.tensors())
    assert all(t.device.type == where.type for t in collector.memory.live["agent"].tensors())
    batches = rollout_batches(buffer, result.last_values, result.last_alive, gamma=0.99, lam=0.95)
    before = copy.deepcopy(model.state_dict())
    stats = Trainer(
        model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    ).update(batches)
    assert stats.pi_steps > 0 and math.isfinite(stats.loss_v)
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    saved = collector.state_dict()["memory"]["agent"]
    assert saved["actor"].device.type == "cpu" and saved["actor"].abs().sum() > 0


def test_an_agent_that_joins_mid_episode_starts_from_a_fresh_state(tiny_overrides):
    config = load_config(
        None,
        [
            *tiny_overrides,
            "env.id=tests.helpers:LateJoinerEnv",
            "env.kwargs={leave_at: 10, max_steps: 5}",
            "rollout.vector=sync",
            "rollout.num_envs=2",
            "rollout.rollout_steps=10",
            "model.recurrent=gru",
            "model.orthogonal_init=false",  # biases: [2, 2] layer-normalizes to zeros
        ],
    )
    _, buffer, _ = _collect(config)
    memory, alive = buffer.memory["agent"], buffer.groups["agent"].alive
    joiner = alive[:, 0, 2].tolist()
    assert joiner == [False, False, True, True, True] * 2  # joins at the third step of each episode
    first_moves = [2, 7]
    assert (memory.actor_state[first_moves, :, 2] == 0).all() and (
        memory.critic_state[first_moves, :, 2] == 0
    ).all()
    assert not memory.is_first[first_moves, :, 2].any()  # fresh because its episode began at step 0 or 5
    assert (memory.actor_state[[3, 8], :, 2].abs().sum(-1) > 0).all()  # then it carries its own state


def test_a_groups_carries_start_afresh_where_its_team_episode_ends(tiny_overrides):
    """The team critic's episode ends where every agent of the group is out (each ended and has not
    acted since) and one ends at that step, as GAE ends it (`algo.gae.team_steps`), though the copy
    plays on: every agent's `is_first` is set after it, so the team critic's one row resets there.
    A waiting agent is not out, and an agent that acts again after ending is in again."""
    from types import SimpleNamespace

    import numpy as np

    from marl_ppo.models.acting import ActingView
    from marl_ppo.models.team import TeamModel
    from marl_ppo.rollout.memory import make_memory

    config = _spread(tiny_overrides, "ppo.critic=team")
    spec = build_collector(plan_run(config))[1].spec
    model = TeamModel(spec, config)
    memory = make_memory(model, 1, torch.device("cpu"))
    policy = ActingView(model)
    obs_dim = spec.groups[0].obs_dim
    inputs = ({"agent": torch.zeros(1, 3, obs_dim)}, {"agent": torch.ones(1, 3, 0, dtype=torch.bool)})
    continuing = np.zeros(1, dtype=bool)

    def step(acting, ended):
        memory.distributions(policy, *inputs, {"agent": torch.tensor([acting])})
        flags = SimpleNamespace(terminated=np.array([ended]), truncated=np.zeros((1, 3), bool))
        memory.advance(SimpleNamespace(groups={"agent": flags}), continuing)  # type: ignore[arg-type]  # the one field read
        return memory.live["agent"].is_first[0].tolist()

    assert step([True, True, True], [True, False, False]) == [True, False, False]
    assert step([False, True, False], [False, False, False]) == [False, False, False]  # agent 2 waits
    assert step([False, True, True], [False, True, False]) == [False, True, False]
    assert step([True, False, True], [False, False, False]) == [False, False, False]  # agent 0 is back
    assert step([False, False, True], [False, False, True]) == [False, False, True]  # agent 0 is in
    assert step([True, False, False], [True, False, False]) == [True, True, True]  # every agent out
    assert step([True, True, True], [False, False, False]) == [False, False, False]
