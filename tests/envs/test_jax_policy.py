"""The JAX forward of the team's networks (`rollout.jax_policy`) computes acting's numbers: on real
observations of JaxMARL's MPE and SMAX, its logits, log-probabilities and critic values equal
`ActingView`'s to 1e-6, for feed-forward networks and for GRU ones stepped through episode starts
(their carries too), masked actions get probability 0, and the networks it does not cover are refused
in one line."""

import numpy as np
import pytest
import torch

from marl_ppo.config import load_config
from marl_ppo.models.acting import ActingView
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.copies import settle_copies
from tests.helpers import vector_env

pytestmark = pytest.mark.jax  # JAX is imported inside the tests, so that collecting them loads nothing

COPIES = 4
STEPS = 6
TOLERANCE = 1e-6
"""Of the outputs' scale (their largest magnitude, at least 1): XLA's float32 tanh on a CPU is up to
about 2e-7 from torch's (a few units in the last place), which two layers carry into the logits."""


def _assert_close(got, expected):
    scale = max(1.0, float(np.abs(expected).max()))
    worst = float(np.abs(np.asarray(got) - expected).max())
    assert worst <= TOLERANCE * scale, f"max difference {worst:.3g} over {TOLERANCE:g} x scale {scale:.3g}"


def _config(env, *overrides):
    return settle_copies(
        load_config(
            None,
            [f"env.id=jaxmarl/{env}", f"rollout.num_envs={COPIES}", "model.hidden_sizes=[32,32]", *overrides],
        )
    )


def _random_allowed(mask, n, generator):
    if mask.shape[-1] == 0:
        mask = torch.ones((*mask.shape[:-1], n), dtype=torch.bool)
    logits = torch.where(mask, 0.0, -1e9)
    return torch.distributions.Categorical(logits=logits).sample()


def _batch(venv):
    """`STEPS` steps of every copy under random allowed actions, stacked `(STEPS, E, ...)`: per group
    obs and masks, and the team state."""
    generator = torch.Generator().manual_seed(0)
    arrays = venv.reset(3)
    obs: dict[str, list[torch.Tensor]] = {g.name: [] for g in venv.spec.groups}
    masks: dict[str, list[torch.Tensor]] = {g.name: [] for g in venv.spec.groups}
    states = []
    for _ in range(STEPS):
        states.append(arrays.state.clone())
        actions = {}
        for g in venv.spec.groups:
            group = arrays.groups[g.name]
            obs[g.name].append(group.obs.clone())
            masks[g.name].append(group.action_mask.clone())
            actions[g.name] = _random_allowed(group.action_mask, g.action_space.n, generator)
        arrays = venv.step(actions)
    stack = {name: torch.stack(v) for name, v in obs.items()}
    return stack, {name: torch.stack(v) for name, v in masks.items()}, torch.stack(states)


def _model(venv, config):
    """A model with every weight moved off its initial values (biases, LayerNorm gains and value-norm
    statistics included), so that every part of the forward shows in the outputs."""
    torch.manual_seed(1)
    model = TeamModel(venv.spec, config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _venvs():
    cache = {}

    def get(env):
        if env not in cache:
            cache[env] = vector_env(_config(env))
        return cache[env]

    return get


_VENV = _venvs()


def _setup(env, share_actor, critic, *overrides):
    """The vector env and a model on `env` with the sharing and critic input named, one batch of
    its inputs, torch's acting view of the model and the JAX policy with its parameters."""
    from marl_ppo.rollout.jax_policy import JaxPolicy

    config = _config(
        env,
        *overrides,
        f"model.share_actor={str(share_actor).lower()}",
        f"model.share_critic={str(share_actor or critic == 'team').lower()}",  # a team critic is shared
        f"ppo.critic={critic}",
    )
    venv = _VENV(env)
    model = _model(venv, config)
    obs, masks, state = _batch(venv)
    policy = JaxPolicy(model)
    return venv, model, obs, masks, state, ActingView(model), policy, policy.params()


@pytest.mark.parametrize("env", ["mpe_simple_spread_v3", "smax_2s3z"])
@pytest.mark.parametrize("critic", ["state", "obs", "state+obs", "team"])
@pytest.mark.parametrize("share_actor", [True, False])
def test_logits_log_probs_and_values_equal_acting_views(env, critic, share_actor):
    import jax
    import jax.numpy as jnp

    from marl_ppo.rollout.jax_policy import log_prob

    venv, model, obs, masks, state, view, policy, params = _setup(env, share_actor, critic)
    steps, copies = state.shape[:2]
    for g in venv.spec.groups:
        name, agents = g.name, g.num_agents
        flags = torch.ones((steps, copies, agents), dtype=torch.bool)
        carry = torch.zeros((copies, agents, 0))
        with torch.no_grad():
            dist, _ = view.actor(name, obs[name], masks[name], carry, flags, flags)
            values, _ = view.critic(name, state, obs[name], torch.zeros((copies, 0, 0)), flags, flags)
        mask = jnp.asarray(masks[name].numpy())
        empty, first = jnp.zeros((steps, copies, agents, 0)), jnp.asarray(flags.numpy())
        logits, _ = jax.jit(policy.logits, static_argnums=0)(
            name, params, jnp.asarray(obs[name].numpy()), mask, empty, first
        )
        logits = np.asarray(logits)
        expected = dist.parts[0].logits.numpy()
        allowed = np.ones(expected.shape, bool) if g.mask_dim == 0 else masks[name].numpy()
        _assert_close(logits[allowed], expected[allowed])
        assert (np.exp(logits[~allowed]) == 0).all() and (logits[~allowed] < -1e8).all()
        if g.mask_dim:
            assert (~allowed).any()  # SMAX: the test saw masked actions
        actions = _random_allowed(masks[name], g.action_space.n, torch.Generator().manual_seed(5))
        _assert_close(
            log_prob(jnp, jnp.asarray(logits), jnp.asarray(actions.numpy())), dist.log_prob(actions).numpy()
        )
        got, _ = policy.values(
            name, params, jnp.asarray(state.numpy()), jnp.asarray(obs[name].numpy()), empty, first
        )
        got = np.asarray(got)
        assert got.shape == values.shape == (steps, copies, agents)
        _assert_close(got, values.numpy())
        assert np.abs(values.numpy()).max() > 0.1  # the values are not trivially 0


def _episode_starts(steps, copies, agents):
    """`(steps, E, A)` flags: every agent starts at step 0, then copies start afresh mid-sequence (the
    same step for every agent of a copy, as a JaxMARL copy's episode ends for all its agents)."""
    starts = torch.zeros((steps, copies), dtype=torch.bool)
    starts[0] = True
    starts[2, 1] = starts[3, 0] = starts[3, 2] = starts[5, 1] = True
    return starts[..., None].expand(steps, copies, agents).contiguous()


@pytest.mark.parametrize("critic", ["state", "obs", "state+obs", "team"])
@pytest.mark.parametrize("share_actor", [True, False])
@pytest.mark.parametrize("library_cell", [False, True], ids=["stacked_cell", "torch_cell"])
def test_a_gru_policy_steps_its_carries_as_acting_does_through_episode_starts(
    critic, share_actor, library_cell
):
    """Step by step from zero carries, with episodes starting mid-sequence: the JAX GRU actor's logits
    and carries and the critic's values and carries equal `ActingView`'s (either of torch's cell paths)
    to 1e-6, and the resets matter (without them the outputs differ)."""
    import jax
    import jax.numpy as jnp

    env = "smax_2s3z"
    venv, model, obs, masks, state, view, policy, params = _setup(
        env,
        share_actor,
        critic,
        "model.recurrent=gru",
        "model.recurrent_size=16",
        f"fast.recurrent_cell={str(not library_cell).lower()}",
    )
    logits_of = jax.jit(policy.logits, static_argnums=0)
    values_of = jax.jit(policy.values, static_argnums=0)
    layout = model.memory_layout()
    steps, copies = state.shape[:2]
    for g in venv.spec.groups:
        name, agents = g.name, g.num_agents
        starts, acted = (
            _episode_starts(steps, copies, agents),
            torch.ones((1, copies, agents), dtype=torch.bool),
        )
        actor_carry = torch.zeros((copies, agents, layout[name].actor_size))
        critic_carry = torch.zeros((copies, layout[name].critic_rows, layout[name].critic_size))
        jax_actor, jax_critic = jnp.asarray(actor_carry.numpy()), jnp.asarray(critic_carry.numpy())
        assert actor_carry.shape[-1] == critic_carry.shape[-1] == 16
        for t in range(steps):
            step = slice(t, t + 1)
            with torch.no_grad():
                dist, actor_carry = view.actor(
                    name, obs[name][step], masks[name][step], actor_carry, starts[step], acted
                )
                values, critic_carry = view.critic(
                    name, state[step], obs[name][step], critic_carry, starts[step], acted
                )
            inputs = jnp.asarray(obs[name][t].numpy()), jnp.asarray(masks[name][t].numpy())
            first = jnp.asarray(starts[t].numpy())
            logits, next_actor = logits_of(name, params, *inputs, jax_actor, first)
            got, next_critic = values_of(
                name, params, jnp.asarray(state[t].numpy()), inputs[0], jax_critic, first
            )
            expected = dist.parts[0].logits[0].numpy()
            allowed = masks[name][t].numpy()
            _assert_close(np.asarray(logits)[allowed], expected[allowed])
            _assert_close(np.asarray(next_actor), actor_carry.numpy())
            _assert_close(np.asarray(got), values[0].numpy())
            _assert_close(np.asarray(next_critic), critic_carry.numpy())
            if t and starts[t].any():  # the carries reset there: without the reset, other numbers
                unreset, _ = logits_of(name, params, *inputs, jax_actor, jnp.zeros_like(first))
                unreset_values, _ = values_of(
                    name, params, jnp.asarray(state[t].numpy()), inputs[0], jax_critic, jnp.zeros_like(first)
                )
                assert np.abs(np.asarray(unreset)[allowed] - expected[allowed]).max() > 1e-3
                assert np.abs(np.asarray(unreset_values) - values[0].numpy()).max() > 1e-3
            jax_actor, jax_critic = next_actor, next_critic
        assert np.abs(actor_carry.numpy()).max() > 0.1 and np.abs(critic_carry.numpy()).max() > 0.1


def test_sampled_actions_follow_the_logits_and_never_take_a_masked_action():
    """Draws from `sample` land on allowed actions only, with frequencies within 4 standard errors of
    the probabilities, and carry their own log-probabilities."""
    import jax
    import jax.numpy as jnp

    from marl_ppo.rollout.jax_policy import JaxPolicy

    venv = _VENV("smax_2s3z")
    model = _model(venv, _config("smax_2s3z"))
    obs, masks, state = _batch(venv)
    policy = JaxPolicy(model)
    (group,) = venv.spec.groups
    logits, _ = policy.logits(
        group.name,
        policy.params(),
        jnp.asarray(obs[group.name][2:3].numpy()),
        jnp.asarray(masks[group.name][2:3].numpy()),
        jnp.zeros((1, COPIES, group.num_agents, 0)),
        jnp.ones((1, COPIES, group.num_agents), bool),
    )
    draws = 20_000
    keys = jax.random.split(jax.random.PRNGKey(0), draws)
    actions, logp = jax.vmap(policy.sample, in_axes=(0, None))(keys, logits)
    actions, logp = np.asarray(actions), np.asarray(logp)
    probs = np.exp(np.asarray(logits))[None]
    allowed = masks[group.name][2:3].numpy()[None]
    chosen = np.take_along_axis(allowed, actions[..., None], -1)[..., 0]
    assert chosen.all()
    np.testing.assert_allclose(
        logp, np.log(np.take_along_axis(probs, actions[..., None], -1)[..., 0]), atol=1e-5
    )
    frequency = (actions[..., None] == np.arange(probs.shape[-1])).mean(0)
    error = np.sqrt(probs[0] * (1 - probs[0]) / draws)
    assert (np.abs(frequency - probs[0]) <= 4 * error + 1e-9).all()


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        (
            "model.recurrent=lstm",
            "group 'agent' has an LSTM network; the compiled rollout covers GRU and feed-forward ones",
        ),
        ("model.precision=bf16", "model.precision=bf16; the compiled rollout computes in fp32"),
    ],
)
def test_networks_it_does_not_cover_are_refused_in_one_line(override, reason):
    from marl_ppo.rollout.jax_policy import JaxPolicy, NotCompilable, unsupported_reason

    venv = _VENV("mpe_simple_spread_v3")
    model = TeamModel(venv.spec, _config("mpe_simple_spread_v3", override))
    assert unsupported_reason(model) == reason
    with pytest.raises(NotCompilable, match=reason):
        JaxPolicy(model)
    assert unsupported_reason(TeamModel(venv.spec, _config("mpe_simple_spread_v3"))) is None
