"""MARL structure as properties: who the critic sees, parameter sharing, batched actors, gradients."""

import copy

import pytest
import torch
import torch.nn.functional as F

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.schedule import LrSchedule
from marl_ppo.algo.trainer import Trainer
from marl_ppo.config import load_config
from marl_ppo.envs.grouping import build_team_spec
from marl_ppo.envs.registry import make_env
from marl_ppo.models.acting import ActingMLP
from marl_ppo.models.layers import AgentMLP, StackedLinear
from marl_ppo.models.team import TeamModel
from tests.helpers import collect_rollout, common_twin, values_of

SPREAD = "mpe2/simple_spread_v3"


def _model(critic, share_critic=True, share_actor=False):
    config = load_config(
        None,
        [
            f"env.id={SPREAD}",
            f"ppo.critic={critic}",
            f"model.share_critic={share_critic}",
            f"model.share_actor={share_actor}",
        ],
    )
    spec = build_team_spec(make_env(SPREAD), SPREAD)
    torch.manual_seed(0)
    return TeamModel(spec, config), spec


def _inputs(batch=5):
    obs = torch.randn(batch, 3, 18)
    return obs.reshape(batch, -1).clone(), obs  # state = concatenated observations (as in mpe2)


@pytest.mark.parametrize(
    ("critic", "share_critic"),
    [("state", True), ("state", False), ("state+obs", True), ("state+obs", False), ("team", True)],
)
def test_central_critic_reacts_to_another_agents_observation(critic, share_critic):
    model, _ = _model(critic, share_critic)
    state, obs = _inputs()
    base = values_of(model, state, {"agent": obs})["agent"]
    obs2 = obs.clone()
    obs2[:, 0, 3] += 1.0  # perturb one feature of agent 0, and the state built from it
    changed = values_of(model, obs2.reshape(5, -1), {"agent": obs2})["agent"]
    assert ((changed - base).abs() > 1e-6).all(), "every agent's central value must depend on agent 0"


@pytest.mark.parametrize("share_critic", [True, False])
def test_ippo_critic_ignores_other_agents(share_critic):
    model, _ = _model("obs", share_critic)
    state, obs = _inputs()
    base = values_of(model, state, {"agent": obs})["agent"]
    obs2 = obs.clone()
    obs2[:, 0, 3] += 1.0
    changed = values_of(model, obs2.reshape(5, -1), {"agent": obs2})["agent"]
    assert ((changed[:, 0] - base[:, 0]).abs() > 1e-6).all()
    torch.testing.assert_close(changed[:, 1:], base[:, 1:], rtol=0, atol=0)


def test_per_agent_actors_have_independent_weights_and_shared_actor_one_set():
    separate, _ = _model("state", share_actor=False)
    shared, _ = _model("state", share_actor=True)
    first = separate.group("agent").actor.net.layers[0].weight
    assert first.shape[0] == 3 and not torch.equal(first[0], first[1])
    assert shared.group("agent").actor.net.layers[0].weight.shape[0] == 1
    # the shared actor still tells agents apart through its agent-id input
    obs = torch.zeros(1, 3, 18)
    logits = shared.group("agent").actor.net(obs)
    assert not torch.allclose(logits[0, 0], logits[0, 1])


def test_share_actor_builds_the_same_networks_where_every_group_has_one_agent():
    """simple_speaker_listener's groups are a speaker and a listener: one agent each, so a shared actor
    is an actor per agent (no agent id to read), the same weights from the same seed."""
    env_id = "mpe2/simple_speaker_listener_v4"
    spec = build_team_spec(make_env(env_id), env_id)
    assert [group.num_agents for group in spec.groups] == [1, 1]
    models = []
    for share in ("true", "false"):
        config = load_config(None, [f"env.id={env_id}", f"model.share_actor={share}"])
        torch.manual_seed(0)
        models.append(TeamModel(spec, config).state_dict())
    shared, separate = models
    assert shared.keys() == separate.keys()
    assert all(torch.equal(shared[key], separate[key]) for key in shared)


def _perturbed_mlp(shared: bool, agents: int = 4, in_dim: int = 6) -> AgentMLP:
    torch.manual_seed(1)
    net = AgentMLP(
        num_agents=agents,
        in_dim=in_dim,
        out_dim=3,
        hidden_sizes=(8, 8),
        activation="tanh",
        input_layer_norm=True,
        shared=shared,
        orthogonal_init=True,
        head_gain=1.0,
    )
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # break the init symmetry of LayerNorm affine and biases
    return net


def _loop_over_agents(net: AgentMLP, x: torch.Tensor, shared: bool) -> torch.Tensor:
    """The textbook per-agent computation: LayerNorm with affine, one-hot id appended, then the MLP."""
    rows, agents, in_dim = x.shape
    assert net.norm_weight is not None and net.norm_bias is not None
    outputs = []
    for agent in range(agents):
        copy_ = 0 if shared else agent
        h = F.layer_norm(x[:, agent], (in_dim,)) * net.norm_weight[copy_] + net.norm_bias[copy_]
        if shared:
            h = torch.cat([h, torch.eye(agents)[agent].expand(rows, agents)], dim=-1)
        for k, layer in enumerate(net.layers):
            assert isinstance(layer, StackedLinear)
            h = h @ layer.weight[copy_].T + layer.bias[copy_]
            if k < len(net.layers) - 1:
                h = torch.tanh(h)
        outputs.append(h)
    return torch.stack(outputs, dim=1)


def _gradients(net: AgentMLP, output: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad((output * weights).sum(), list(net.parameters())))


@pytest.mark.parametrize("shared", [False, True])
def test_stacked_mlp_equals_a_loop_over_agents(shared):
    """Outputs and every parameter's gradient match the per-agent loop (the folded LayerNorm affine
    and the additive agent id are exact rewrites)."""
    net = _perturbed_mlp(shared)
    x = torch.randn(7, 4, 6)
    weights = torch.randn(7, 4, 3)
    batched, looped = net(x), _loop_over_agents(net, x, shared)
    torch.testing.assert_close(batched, looped, rtol=1e-5, atol=1e-6)
    for got, want in zip(_gradients(net, batched, weights), _gradients(net, looped, weights), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shared", [False, True])
def test_common_input_equals_the_input_repeated_per_agent(shared):
    """`common_input` (a critic's global state, first layer once per row) equals the forward on the
    state copied to every agent, in outputs and gradients."""
    net = _perturbed_mlp(shared, in_dim=10)
    state = torch.randn(5, 2, 10)  # leading dims (time, env)
    weights = torch.randn(5, 2, 4, 3)
    common = common_twin(net)(state)
    repeated = net(state.unsqueeze(-2).expand(5, 2, 4, 10))
    assert common.shape == (5, 2, 4, 3)
    torch.testing.assert_close(common, repeated, rtol=1e-5, atol=1e-6)
    for got, want in zip(_gradients(net, common, weights), _gradients(net, repeated, weights), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("common", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_the_acting_mlp_gives_the_mlps_outputs_from_weights_read_once(shared, common, precision, monkeypatch):
    """Acting reads each MLP's weights once (`ActingMLP`): its forwards return what the MLP's own
    forward returns without gradients (in float32 bit for bit; under bf16 on a CPU, float32 products
    on bfloat16's grid, within one bfloat16 rounding); one built after an update reads the new weights."""
    net = _perturbed_mlp(shared, in_dim=10 if common else 6)
    net.precision = precision
    net = common_twin(net) if common else net
    x = torch.randn(5, 10) if common else torch.randn(5, 4, 6)
    with torch.no_grad():
        want = net(x)
    acting = ActingMLP(net)
    if precision == "bf16":  # float32 tensors of bfloat16 values
        read = [*acting.first[:2], *(t for layer in acting.rest for t in layer)]
        assert all(t.dtype == torch.float32 and torch.equal(t, t.bfloat16().float()) for t in read)
    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(net, "first_layer", _must_not_run)  # the weights were read when it was built
        _same_output(acting(x), want, precision)
    with torch.no_grad():  # an update after the rollout: the next acting MLP reads the new weights
        for p in net.parameters():
            p.add_(0.05)
        moved = net(x)
        assert not torch.equal(moved, want)
        _same_output(ActingMLP(net)(x), moved, precision)


def _same_output(acting, forward, precision):
    if precision == "fp32":
        assert torch.equal(acting, forward)
    else:  # the sums of a float32 product may run in another order than bfloat16's
        assert ((acting - forward).abs() <= forward.abs() * 2**-7 + 1e-6).all()


def _must_not_run():
    raise AssertionError("an acting forward read the first layer's parameters again")


def test_a_rollout_reads_each_mlps_weights_once_and_never_runs_the_training_forward(monkeypatch):
    config = load_config(
        overrides=["total_steps=64", "rollout.num_envs=2", "rollout.rollout_steps=8", "rollout.vector=sync"]
    )
    reads, forwards = [], []
    first_layer, forward = AgentMLP.first_layer, AgentMLP.forward
    monkeypatch.setattr(AgentMLP, "first_layer", lambda net: reads.append(net) or first_layer(net))  # type: ignore[func-returns-value]
    monkeypatch.setattr(AgentMLP, "forward", lambda net, x: forwards.append(net) or forward(net, x))  # type: ignore[func-returns-value]
    model, _, rollout = collect_rollout(config)
    mlps = [m for m in model.modules() if isinstance(m, AgentMLP)]
    assert len(mlps) == 2 and sorted(map(id, reads)) == sorted(map(id, mlps))  # actor and critic, once
    assert forwards == []
    assert rollout.env_steps == config.rollout.rollout_steps * config.rollout.copies


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("critic", ["state", "state+obs", "obs", "team"])
def test_a_sequence_of_one_step_chunks_gives_each_row_the_numbers_of_a_step(critic, shared):
    """Feed-forward networks learn on chunks of one step: any minibatch of them, `(1, n, A, ...)`,
    gives bit for bit the log-probabilities and values of acting on those rows as one step."""
    model, _ = _model(critic, share_critic=shared or critic == "team", share_actor=shared)
    state, obs = _inputs(batch=64)
    actor, network, _ = model.group("agent")
    rows = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:16]
    actions = torch.randint(0, 5, (16, 3))
    flags = torch.zeros(1, 16, 3, dtype=torch.bool)
    mask = torch.ones(1, 16, 3, 0, dtype=torch.bool)
    empty = torch.zeros(16, 3, 0)
    one_step, carry = actor(obs[rows].unsqueeze(0), mask, empty, flags, ~flags)
    assert carry is empty  # a feed-forward carry passes through
    whole, _ = actor(
        obs.unsqueeze(0),
        torch.ones(1, 64, 3, 0, dtype=torch.bool),
        torch.zeros(64, 3, 0),
        flags[:, :1].expand(1, 64, 3),
        ~flags[:, :1].expand(1, 64, 3),
    )
    assert torch.equal(
        one_step.log_prob(actions.unsqueeze(0)),
        whole.log_prob(torch.zeros(1, 64, 3, dtype=torch.long).index_copy(1, rows, actions.unsqueeze(0)))[
            :, rows
        ],
    )
    critic_carry = torch.zeros(16, network.carry_rows, 0)
    values, _ = network(state[rows].unsqueeze(0), obs[rows].unsqueeze(0), critic_carry, flags, ~flags)
    assert torch.equal(values[0], values_of(model, state, {"agent": obs})["agent"][rows])


def test_team_critic_is_one_mlp_of_the_state_broadcast_to_the_agents():
    """`ppo.critic: team` is V(state): one network without an agent id, run once per env step, its value given
    to every agent. Outputs and gradients equal the textbook MLP on the state, whose one value receives
    the sum of the agents' gradients."""
    model, _ = _model("team")
    critic = model.group("agent").critic
    net = critic.net
    assert net.layers[0].weight.shape == (1, 64, 54)  # the state alone: no agent-id columns
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # break the init symmetry of LayerNorm affine and biases
    state, obs = _inputs(batch=6)
    weights = torch.randn(6, 3)
    flags = torch.zeros(1, 6, 3, dtype=torch.bool)
    values, _ = critic(state.unsqueeze(0), obs.unsqueeze(0), torch.zeros(6, 1, 0), flags, ~flags)
    values = values[0]
    assert values.shape == (6, 3)

    h = F.layer_norm(state, (54,)) * net.norm_weight[0] + net.norm_bias[0]
    for k, layer in enumerate(net.layers):
        h = h @ layer.weight[0].T + layer.bias[0]
        if k < len(net.layers) - 1:
            h = torch.tanh(h)
    textbook = h.squeeze(-1)
    torch.testing.assert_close(values, textbook.unsqueeze(-1).expand(6, 3), rtol=1e-5, atol=1e-6)
    params = list(net.parameters())
    got = torch.autograd.grad((values * weights).sum(), params)
    want = torch.autograd.grad((textbook * weights.sum(-1)).sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_team_critic_trains_and_values_stay_equal_across_agents():
    """With `ppo.critic: team` a rollout's acting-time values are the same for every agent of the group,
    and one update moves every critic parameter."""
    config = load_config(
        None,
        [
            f"env.id={SPREAD}",
            "rollout.num_envs=2",
            "rollout.rollout_steps=25",
            "ppo.critic=team",
            "ppo.num_minibatches=1",
        ],
    )
    model, buffer, rollout = collect_rollout(config)
    values = buffer.groups["agent"].values
    assert torch.equal(values, values[..., :1].expand_as(values))
    trainer = Trainer(
        model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    )
    before = copy.deepcopy(model.critics.state_dict())
    stats = trainer.update(
        rollout_batches(
            buffer,
            rollout.last_values,
            rollout.last_alive,
            gamma=config.ppo.gamma,
            lam=config.ppo.gae_lambda,
            team=True,
        )
    )
    assert torch.isfinite(torch.tensor(stats.loss_v))
    for name, param in model.critics.named_parameters():
        assert not torch.equal(before[name], param.detach()), f"critic {name} did not change"


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("common", [False, True])
def test_hidden_activations_keep_their_features_innermost(shared, common):
    """Every hidden layer receives `(rows, A, hidden)` with the features adjacent in memory (row-major
    for a shared network, agent-major for stacked ones). A transposed agent-id bias once gave the first
    layer's output an agent-innermost layout: the next layer copied it back, and the broadcast add and
    the tanh passes ran about 10% slower on a large VMAS batch."""
    net = _perturbed_mlp(shared, in_dim=10)
    seen = []
    for layer in net.layers[1:]:
        layer.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    x = torch.randn(64, 10) if common else torch.randn(64, 4, 10)
    common_twin(net)(x) if common else net(x)
    assert len(seen) == 2 and all(h.shape == (64, 4, 8) and h.stride(-1) == 1 for h in seen)


def test_one_update_moves_every_actor_and_the_critic():
    config = load_config(
        None,
        [
            f"env.id={SPREAD}",
            "rollout.num_envs=2",
            "rollout.rollout_steps=25",
            "model.share_actor=false",
            "model.share_critic=false",
            "ppo.train_pi_iters=1",
            "ppo.train_vf_iters=1",
            "ppo.num_minibatches=1",
            "ppo.target_kl=null",
        ],
    )
    model, buffer, rollout = collect_rollout(config)
    trainer = Trainer(
        model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    )
    batches = rollout_batches(buffer, rollout.last_values, gamma=config.ppo.gamma, lam=config.ppo.gae_lambda)
    before = copy.deepcopy(model.state_dict())
    grads: dict[str, torch.Tensor] = {}
    hooks = [
        p.register_hook(lambda g, n=n: grads.__setitem__(n, g.clone())) for n, p in model.named_parameters()
    ]
    stats = trainer.update(batches)
    for hook in hooks:
        hook.remove()
    for name, param in model.named_parameters():
        assert name in grads, f"{name} got no gradient"
        per_agent = grads[name].reshape(3, -1).abs().sum(dim=1)  # every weight is stacked on the agent axis
        assert (per_agent > 0).all(), f"{name}: an agent's slice got a zero gradient"
        assert not torch.equal(before[name], param.detach()), f"{name} did not change"
    for value in (stats.loss_pi, stats.loss_v, stats.kl, stats.entropy):
        assert torch.isfinite(torch.tensor(value))
    assert stats.stop_iter == 1


def test_linear_lr_schedule_decays_both_rates_to_zero():
    config = load_config(
        None, [f"env.id={SPREAD}", "ppo.lr_schedule=linear", "ppo.pi_lr=1e-3", "ppo.vf_lr=2e-3"]
    )
    model, _ = _model("state")
    trainer = Trainer(model, config.ppo.settled(convolutional=False), generator=torch.Generator())
    schedule = LrSchedule(config.ppo.lr_schedule, total_steps=400)
    for steps, scale in [(0, 1.0), (100, 0.75), (400, 0.0)]:
        trainer.set_lr_scale(schedule.scale(steps))
        assert trainer.actor_optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * scale)
        assert trainer.critic_optimizer.param_groups[0]["lr"] == pytest.approx(2e-3 * scale)
