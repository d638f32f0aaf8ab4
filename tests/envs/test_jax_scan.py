"""A rollout compiled as one `lax.scan` (`rollout.jax_scan`) takes the per-step path's trajectories: for
the same actions, every record equals what `JaxVectorEnv.step` in a Python loop gives, bit for bit,
through resets and truncations, the policy's records (log-probs, values, and a GRU's flags and carries
as it steps them through episode starts) equal acting's, and the env copies and the carries continue
from the same place; sampled rollouts repeat from their key, take only allowed actions, and replay to
themselves."""

from typing import Any

import pytest
import torch

from marl_ppo.config import load_config
from marl_ppo.models.acting import ActingView
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.copies import settle_copies
from tests.helpers import vector_env

pytestmark = pytest.mark.jax  # JAX is imported inside the tests, so that collecting them loads nothing

COPIES = 4
STEPS = 12
SEED = 11
ENVS = {
    "mpe_simple_spread_v3": "env.kwargs={max_steps: 5}",
    "smax_3m": "env.kwargs={max_steps: 5}",
}
"""Episodes of at most 5 steps: a 12-step rollout crosses resets and truncations."""


NETWORKS = {
    "mlp": (),
    "gru": ("model.recurrent=gru", "model.recurrent_size=8"),
    "gru_actor": ("model.recurrent=gru", "model.recurrent_size=8", "model.recurrent_critic=false"),
}
"""Feed-forward networks (empty carries), GRU ones (actor and critic) carrying 8 numbers a row, and a
GRU actor beside a feed-forward critic."""


def _setup(env, network="mlp"):
    config = settle_copies(
        load_config(
            None,
            [
                f"env.id=jaxmarl/{env}",
                f"rollout.num_envs={COPIES}",
                "model.hidden_sizes=[16,16]",
                ENVS[env],
                *NETWORKS[network],
            ],
        )
    )
    venv = vector_env(config)
    torch.manual_seed(2)
    return venv, TeamModel(venv.spec, config)


def _allowed(mask, n, generator):
    if mask.shape[-1] == 0:
        mask = torch.ones((*mask.shape[:-1], n), dtype=torch.bool)
    weights = mask.float().reshape(-1, mask.shape[-1])
    return torch.multinomial(weights, 1, generator=generator).reshape(mask.shape[:-1])


def _per_step(venv, actions_of):
    """`STEPS` calls of `JaxVectorEnv.step` from `reset(SEED)`: the actions and the records the scan
    makes, stacked `(T, E, ...)` (float copies of torch's arrays)."""
    arrays = venv.reset(SEED)
    rows = []
    for t in range(STEPS):
        before = arrays
        actions = actions_of(t, before)
        arrays = venv.step(actions)
        row = {"state": before.state.clone(), "final_state": arrays.final_state.clone()}
        row["episode_over"] = venv.episode_over.clone()
        for g in venv.spec.groups:
            b, a = before.groups[g.name], arrays.groups[g.name]
            row[g.name] = {
                "obs": b.obs.clone(),
                "action_mask": b.action_mask.clone(),
                "actions": actions[g.name].clone(),
                "rewards": a.reward.clone(),
                "terminated": a.terminated.clone(),
                "truncated": a.truncated.clone(),
                "final_obs": a.final_obs.clone(),
            }
        rows.append(row)
    stacked: dict[str, Any] = {
        key: torch.stack([r[key] for r in rows]) for key in ("state", "final_state", "episode_over")
    }
    for g in venv.spec.groups:
        stacked[g.name] = {key: torch.stack([r[g.name][key] for r in rows]) for key in rows[0][g.name]}
    return stacked, arrays


@pytest.mark.parametrize("network", sorted(NETWORKS))
@pytest.mark.parametrize("env", sorted(ENVS))
def test_the_scan_on_given_actions_takes_the_per_step_paths_trajectories_exactly(env, network):
    from marl_ppo.rollout.jax_policy import JaxPolicy
    from marl_ppo.rollout.jax_scan import CompiledRollout

    venv, model = _setup(env, network)
    generator = torch.Generator().manual_seed(4)

    def actions_of(t, arrays):
        return {
            g.name: _allowed(arrays.groups[g.name].action_mask, g.action_space.n, generator)
            for g in venv.spec.groups
        }

    expected, end = _per_step(venv, actions_of)
    end = {"state": end.state.clone(), **{g.name: end.groups[g.name].obs.clone() for g in venv.spec.groups}}
    assert expected["episode_over"].any() and any(
        expected[g.name]["truncated"].any() for g in venv.spec.groups
    )

    policy = JaxPolicy(model)
    rollout = CompiledRollout(venv, policy, STEPS)
    venv.reset(SEED)
    records = rollout.replay(
        policy.weights(), {g.name: expected[g.name]["actions"] for g in venv.spec.groups}
    )
    for key in ("state", "final_state", "episode_over"):
        torch.testing.assert_close(records[key], expected[key], rtol=0, atol=0)
    view, layout = ActingView(model), model.memory_layout()
    # an agent's episode starts at the first step and after each step where its copy's ended
    starts = torch.cat([torch.ones(1, COPIES, dtype=torch.bool), expected["episode_over"][:-1]])
    for g in venv.spec.groups:
        got, want = records["groups"][g.name], expected[g.name]
        for key, value in want.items():
            assert got[key].shape == value.shape, key
            torch.testing.assert_close(got[key].to(value.dtype), value, rtol=0, atol=0, msg=key)
        # the recorded flags, carries, log-probs and values are the policy's stepped along the
        # recorded observations from zero carries, as the per-step path steps it
        is_first = starts[..., None].expand(-1, -1, g.num_agents)
        assert torch.equal(got["is_first"], is_first)
        acted = torch.ones((1, COPIES, g.num_agents), dtype=torch.bool)
        actor = torch.zeros(COPIES, g.num_agents, layout[g.name].actor_size)
        critic = torch.zeros(COPIES, layout[g.name].critic_rows, layout[g.name].critic_size)
        for t in range(STEPS):
            step = slice(t, t + 1)
            torch.testing.assert_close(got["actor_state"][t], actor, rtol=0, atol=1e-6)
            torch.testing.assert_close(got["critic_state"][t], critic, rtol=0, atol=1e-6)
            with torch.no_grad():
                dist, actor = view.actor(
                    g.name, want["obs"][step], want["action_mask"][step], actor, is_first[step], acted
                )
                values, critic = view.critic(
                    g.name, expected["state"][step], want["obs"][step], critic, is_first[step], acted
                )
            torch.testing.assert_close(
                got["logp"][step], dist.log_prob(want["actions"][step]), rtol=0, atol=1e-6
            )
            torch.testing.assert_close(got["values"][step], values, rtol=0, atol=1e-6)
        after = records["memory"][g.name]
        assert torch.equal(after.is_first, expected["episode_over"][-1, :, None].expand(-1, g.num_agents))
        torch.testing.assert_close(after.actor, actor, rtol=0, atol=1e-6)
        torch.testing.assert_close(after.critic, critic, rtol=0, atol=1e-6)
        if network != "mlp":
            assert actor.shape[-1] == 8 and actor.abs().max() > 0.1
            assert critic.shape[-1] == (8 if network == "gru" else 0)
        truncated = want["truncated"].flatten(1).any(1)
        assert (got["final_values"][~truncated] == 0).all() and (got["final_values"][truncated] != 0).any()
    # the copies continue where the per-step path's did
    torch.testing.assert_close(venv.arrays.state, end["state"], rtol=0, atol=0)
    for g in venv.spec.groups:
        torch.testing.assert_close(venv.arrays.groups[g.name].obs, end[g.name], rtol=0, atol=0)


@pytest.mark.parametrize("network", ["gru", "mlp"])
def test_a_sampled_rollout_repeats_from_its_key_takes_allowed_actions_and_replays_to_itself(network):
    import jax

    from marl_ppo.rollout.jax_policy import JaxPolicy
    from marl_ppo.rollout.jax_scan import CompiledRollout

    venv, model = _setup("smax_3m", network)
    policy = JaxPolicy(model)
    rollout = CompiledRollout(venv, policy, STEPS)
    params = policy.weights()

    def sampled(seed):
        venv.reset(SEED)
        records = rollout.run(params, jax.random.PRNGKey(seed))
        return jax.tree.map(lambda t: t.clone(), records)

    first, again, other = sampled(0), sampled(0), sampled(1)
    rollout.run(params, jax.random.PRNGKey(2))  # the copies continue from the last rollout's end
    # one program whether the copies come from a reset or from the last rollout (jit's cache size)
    assert rollout._sampled._cache_size() == 1
    (group,) = venv.spec.groups
    actions, masks = first["groups"][group.name]["actions"], first["groups"][group.name]["action_mask"]
    assert torch.equal(actions, again["groups"][group.name]["actions"])
    assert not torch.equal(actions, other["groups"][group.name]["actions"])
    assert torch.gather(masks, -1, actions.long().unsqueeze(-1)).all()  # only allowed actions
    venv.reset(SEED)
    replayed = rollout.replay(params, {group.name: actions})
    for key, value in first["groups"][group.name].items():
        assert torch.equal(replayed["groups"][group.name][key], value), key
    assert torch.equal(replayed["state"], first["state"])
    for carried, again_carried in zip(
        first["memory"][group.name], replayed["memory"][group.name], strict=True
    ):
        assert torch.equal(carried, again_carried)


def test_the_next_rollout_starts_from_the_last_ones_outputs_unless_torch_wrote_into_the_arrays():
    # scan_start takes up the last scan's own outputs while the published arrays are untouched; after an
    # in-place write (as a resume's load writes them) it rebuilds them from the arrays, write included
    from marl_ppo.rollout.jax_policy import JaxPolicy
    from marl_ppo.rollout.jax_scan import CompiledRollout

    venv, model = _setup("mpe_simple_spread_v3")
    policy = JaxPolicy(model)
    rollout = CompiledRollout(venv, policy, STEPS)
    venv.reset(SEED)
    key = policy.jax.random.PRNGKey(0)
    rollout.run(policy.weights(), key)
    assert venv._scan_out is not None
    _, _, out = venv.scan_start()
    assert out is venv._scan_out[0]
    group = venv.spec.groups[0].name
    venv.arrays.groups[group].obs[0, 0, 0] = 123.0
    _, _, rebuilt = venv.scan_start()
    assert rebuilt is not venv._scan_out[0]
    assert float(rebuilt["obs"][group][0, 0, 0]) == 123.0
    for name in ("state", "done", "won"):
        torch.testing.assert_close(
            torch.from_dlpack(rebuilt[name]), torch.from_dlpack(out[name]), rtol=0, atol=0
        )
