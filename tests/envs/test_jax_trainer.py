"""The compiled learner (`fast.learner: jax`, `algo.jax_trainer.JaxTrainer`): one whole update from the
same weights, optimizer state and generator equals torch's `Trainer` (every weight, Adam moment and step
count, the statistics, the KL stop's epochs and steps, the generator's state after it) on the issue's
MPE setting and a per-agent one; a short run repeats bit for bit and resumes exactly; the runs it does
not cover are refused in one line."""

import copy

import pytest
import torch

from marl_ppo.algo.batch import AgentBatch
from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import ConfigError, load_config
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_run
from marl_ppo.run.loop import train
from marl_ppo.run.resume import resume_config
from tests.helpers import K, Killed, assert_identical, crash_at_update, run_state_only, scalars, vector_env

pytestmark = pytest.mark.jax  # JAX is imported inside the tests, so that collecting them loads nothing

MPE = [
    "env.id=jaxmarl/mpe_simple_spread_v3",
    "rollout.num_envs=16",
    "rollout.rollout_steps=128",
    "model.hidden_sizes=[64,64]",
    "ppo.train_pi_iters=4",
    "ppo.num_minibatches=4",
]
"""The issue's MPE case: JaxMARL's IPPO-FF settings (16 copies x 128 steps, 4 epochs x 4 minibatches of
512 env rows, 1,536 agent rows, through 64-wide tanh MLPs)."""

WEIGHTS = 2e-5
"""Two whole updates' weights against torch's: the largest difference within 2e-5 of the tensor's
largest entry (the settings below stay within a fifth of this and of MOMENTS). One step's gradients agree to about 1e-6 of their scale (the
products and sums in another order); over the update's steps the differences grow where a sample's
ratio or value sits at its clip's edge and falls on either side with the rounding, and Adam divides
each coordinate by its own small second moment."""
MOMENTS = 1e-3
"""The Adam moments after each update against torch's, of the tensor's largest entry (as for WEIGHTS;
the last steps' gradients carry the grown differences undamped)."""


def _config(*extra):
    return load_config(None, [*MPE, *extra])


def _batches(model, spec, seed=5):
    """A rollout's worth of rows with the shapes of the env's: random observations and states, actions
    drawn near the policy's own (log-probabilities a little off, so the ratios start away from 1), a few
    dead samples, random advantages and values."""
    steps, copies = 128, 16
    rows = steps * copies
    generator = torch.Generator().manual_seed(seed)
    batches = {}
    for group in spec.groups:
        agents = group.num_agents
        obs = torch.randn(rows, agents, group.obs_dim, generator=generator)
        actions = torch.randint(0, int(group.action_space.n), (rows, agents), generator=generator)
        ones = torch.ones(1, rows, agents, dtype=torch.bool)
        no_mask = torch.zeros(rows, agents, 0, dtype=torch.bool)
        with torch.no_grad():
            dist, _ = model.group(group.name).actor(
                obs[None], no_mask[None], torch.zeros(rows, agents, 0), ones, ones
            )
            logp = dist.log_prob(actions[None])[0] + 0.05 * torch.randn(rows, agents, generator=generator)
        values = torch.randn(rows, agents, generator=generator)
        advantages = torch.randn(rows, agents, generator=generator)
        batches[group.name] = AgentBatch(
            steps=steps,
            obs=obs,
            state=torch.randn(rows, spec.state_dim, generator=generator),
            action_mask=no_mask,
            actions=actions,
            logp_old=logp,
            values_old=values,
            advantages=advantages,
            returns=advantages + values,
            alive=torch.rand(rows, agents, generator=generator) > 0.05,
            is_first=torch.zeros(rows, agents, dtype=torch.bool),
            acted=torch.ones(rows, agents, dtype=torch.bool),
            actor_carry=torch.zeros(rows, agents, 0),
            critic_carry=torch.zeros(rows, agents, 0),
        )
    return batches


def _close(ours, theirs, tolerance):
    scale = float(theirs.abs().max())
    assert float((ours - theirs).abs().max()) <= tolerance * scale + 1e-12, (ours.shape, scale)


SETTINGS = {
    # no value clip: the rows' acting values differ per agent while a team critic has one value per
    # row, so most rows sit beyond the clip and the rest decide the step, each row that crosses its
    # edge with the rounding (values agree to 5e-7) moving it by a part in a few hundred
    "team_critic": [
        "ppo.critic=team",
        "model.input_layer_norm=false",
        "ppo.grad_clip=per_group",
        "ppo.value_clip=null",
    ],
    "ippo_shared": [
        "ppo.critic=obs",
        "model.share_actor=true",
        "ppo.huber_delta=null",
        "ppo.value_clip=null",
    ],
    "mappo_per_agent": [
        "ppo.critic=state",
        "model.share_actor=false",
        "model.share_critic=false",
        "ppo.huber_delta=0.5",
        "ppo.max_grad_norm=0.05",  # below the gradients' norms: every step clips
    ],
    "kl_stop": ["ppo.critic=obs", "ppo.target_kl=0.006", "ppo.pi_lr=0.001", "ppo.train_vf_iters=2"],
    "value_clip_huber": [
        "ppo.critic=state+obs",
        "ppo.huber_delta=0.3",
        "ppo.value_clip=0.05",
        "ppo.vf_lr=0.003",
    ],
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_one_update_equals_torchs(setting):
    from marl_ppo.algo.jax_trainer import JaxTrainer

    torch.set_num_threads(1)
    plan = plan_run(_config(*SETTINGS[setting], "fast.learner=jax"))
    spec = vector_env(plan.config).spec
    torch.manual_seed(0)
    model = TeamModel(spec, plan.config)
    with torch.no_grad():  # weights away from their initialisation
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
    reference = Trainer(theirs, plan.ppo, generator=torch.Generator().manual_seed(3))
    learner = JaxTrainer(ours, plan.ppo, generator=torch.Generator().manual_seed(3))
    for update in range(2):  # the second from Adam moments and step counts the first wrote back
        batches = _batches(model, spec, seed=5 + update)
        expected, got = reference.update(batches), learner.update(batches)
        assert (got.stop_iter, got.pi_steps) == (expected.stop_iter, expected.pi_steps)
        if setting == "kl_stop":
            assert expected.pi_steps < 16  # the stop fired (in the first update, in the third epoch: past
            # the critic's two, so the generator drew three orders)
        else:
            assert expected.pi_steps == 16
        for key in ("loss_pi", "delta_loss_pi", "loss_v", "delta_loss_v", "kl", "entropy", "clipfrac"):
            assert getattr(got, key) == pytest.approx(getattr(expected, key), rel=2e-3, abs=1e-4), key
        for key in ("explained_variance", "value_mean", "return_mean", "nonfinite_skips"):
            assert getattr(got, key) == getattr(expected, key)
        assert torch.equal(learner.generator.get_state(), reference.generator.get_state())
        for mine, their in zip(ours.parameters(), theirs.parameters(), strict=True):
            _close(mine.detach(), their.detach(), WEIGHTS)
        assert torch.equal(ours.state_dict()["value_norms.0.mean"], theirs.state_dict()["value_norms.0.mean"])
        for mine_opt, their_opt in (
            (learner.actor_optimizer, reference.actor_optimizer),
            (learner.critic_optimizer, reference.critic_optimizer),
        ):
            params = zip(mine_opt.param_groups[0]["params"], their_opt.param_groups[0]["params"], strict=True)
            for mine, their in params:
                mine_state, their_state = mine_opt.state[mine], their_opt.state[their]
                assert float(mine_state["step"]) == float(their_state["step"]) > 0
                assert mine_state["step"].dtype == their_state["step"].dtype
                _close(mine_state["exp_avg"], their_state["exp_avg"], MOMENTS)
                _close(mine_state["exp_avg_sq"], their_state["exp_avg_sq"], MOMENTS)
        # the torch state dicts load into a torch trainer as they are (switching learners)
        Trainer(copy.deepcopy(ours), plan.ppo, generator=torch.Generator()).load_state_dict(
            learner.state_dict()
        )


@pytest.mark.parametrize("setting", ["ippo_shared", "kl_stop"])
def test_minibatch_stats_equal_torchs_and_leave_the_jax_learners_update_as_it_was(setting):
    # `ppo.update_stats: minibatches`: the means over the steps the actors (and the critic) took,
    # gathered by torch step by step and by the JAX program's trace, agree; the JAX learner's weights
    # and moments are bit for bit those of its batch mode
    from marl_ppo.algo.jax_trainer import JaxTrainer

    torch.set_num_threads(1)
    plans = {
        mode: plan_run(_config(*SETTINGS[setting], "fast.learner=jax", f"ppo.update_stats={mode}"))
        for mode in ("batch", "minibatches")
    }
    spec = vector_env(plans["batch"].config).spec
    torch.manual_seed(0)
    model = TeamModel(spec, plans["batch"].config)
    with torch.no_grad():  # weights away from their initialisation, as above
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    ours, theirs, by_batch = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    reference = Trainer(theirs, plans["minibatches"].ppo, generator=torch.Generator().manual_seed(3))
    learner = JaxTrainer(ours, plans["minibatches"].ppo, generator=torch.Generator().manual_seed(3))
    batch_learner = JaxTrainer(by_batch, plans["batch"].ppo, generator=torch.Generator().manual_seed(3))
    for update in range(2):
        batches = _batches(model, spec, seed=5 + update)
        expected, got, batch_stats = (
            reference.update(batches),
            learner.update(batches),
            batch_learner.update(batches),
        )
        assert got.delta_loss_pi is None and got.delta_loss_v is None and expected.delta_loss_v is None
        assert (got.pi_steps, got.stop_iter) == (expected.pi_steps, expected.stop_iter)
        assert (got.pi_steps, got.stop_iter) == (batch_stats.pi_steps, batch_stats.stop_iter)
        if setting == "kl_stop":
            assert got.pi_steps < 16  # the stopping step's terms are left out of the actors' means
        for key in ("loss_pi", "loss_v", "kl", "entropy", "clipfrac"):
            assert getattr(got, key) == pytest.approx(getattr(expected, key), rel=2e-3, abs=1e-4), key
        assert got.loss_v != pytest.approx(batch_stats.loss_v, rel=1e-3)  # not the batch's after value
        assert_identical(ours.state_dict(), by_batch.state_dict())
        assert_identical(learner.state_dict(), batch_learner.state_dict())


def test_weights_kept_in_jax_between_updates_are_bitwise_reading_them_back_and_torchs_changes_are_seen():
    # the update starts from the arrays the last one wrote back while no torch tensor has changed; a
    # trainer that reads the torch tensors every time ends bit for bit where it does, through a
    # checkpoint's load (new optimizer state tensors) and an in-place change of one weight
    from marl_ppo.algo.jax_trainer import JaxTrainer

    plan = plan_run(_config("ppo.critic=obs", "fast.learner=jax"))
    spec = vector_env(plan.config).spec
    torch.manual_seed(0)
    model = TeamModel(spec, plan.config)
    kept, read = copy.deepcopy(model), copy.deepcopy(model)
    keeping = JaxTrainer(kept, plan.ppo, generator=torch.Generator().manual_seed(3))
    reading = JaxTrainer(read, plan.ppo, generator=torch.Generator().manual_seed(3))
    saved_model, saved_trainer = {}, {}
    for update in range(5):
        batches = _batches(model, spec, seed=5 + update)
        if update in (1, 3):  # untouched since the last update: its arrays are taken as they are
            assert keeping._kept is not None and keeping._inputs() is keeping._kept[0]
        if update == 2:
            saved_model, saved_trainer = copy.deepcopy(kept.state_dict()), copy.deepcopy(keeping.state_dict())
        if update == 4:  # back to update 2's state as a resume loads it, and one weight nudged in place
            for network, trainer in ((kept, keeping), (read, reading)):
                network.load_state_dict(saved_model)
                trainer.load_state_dict(copy.deepcopy(saved_trainer))  # torch's load keeps its tensors
                with torch.no_grad():
                    next(network.parameters())[0].add_(0.01)
            assert keeping._kept is not None
            before = keeping._kept[0]
            assert keeping._inputs() is not before and keeping._kept is None
        reading._kept = None
        stats = keeping.update(batches), reading.update(batches)
        assert stats[0] == stats[1]
        assert_identical(kept.state_dict(), read.state_dict())
        assert_identical(keeping.state_dict(), reading.state_dict())


def test_one_step_equals_torchs_to_float_rounding():
    """One minibatch step of the whole batch: the Adam moments are 0.1 and 0.001 times the gradient and
    its square, equal to torch's to 2e-6 and 4e-6 of their scale (the sums in another order). The
    weights moved by lr * m / (sqrt(v) + 1e-5), about lr * sign(gradient): equal to 2e-4 of lr, the
    most where a gradient entry is of eps's size and its rounding goes into the step undamped."""
    from marl_ppo.algo.jax_trainer import JaxTrainer

    torch.set_num_threads(1)
    one = ["ppo.train_pi_iters=1", "ppo.train_vf_iters=1", "ppo.num_minibatches=1", "ppo.critic=obs"]
    plan = plan_run(_config(*one, "model.share_actor=true"))
    spec = vector_env(plan.config).spec
    torch.manual_seed(1)
    model = TeamModel(spec, plan.config)
    theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
    reference = Trainer(theirs, plan.ppo, generator=torch.Generator().manual_seed(3))
    learner = JaxTrainer(ours, plan.ppo, generator=torch.Generator().manual_seed(3))
    batches = _batches(model, spec)
    reference.update(batches)
    learner.update(batches)
    for optimizer, their_optimizer in (
        (learner.actor_optimizer, reference.actor_optimizer),
        (learner.critic_optimizer, reference.critic_optimizer),
    ):
        pairs = list(
            zip(optimizer.param_groups[0]["params"], their_optimizer.param_groups[0]["params"], strict=True)
        )
        for key, tolerance in (("exp_avg", 2e-6), ("exp_avg_sq", 4e-6)):
            # of the optimizer's largest entry: a bias's gradient, a sum of terms that nearly cancel,
            # holds the rounding of the terms, not of itself
            scale = max(float(their_optimizer.state[their][key].abs().max()) for _, their in pairs)
            for mine, their in pairs:
                difference = optimizer.state[mine][key] - their_optimizer.state[their][key]
                assert float(difference.abs().max()) <= tolerance * scale, key
        for mine, their in pairs:  # the weights
            assert float((mine - their).detach().abs().max()) <= 2e-4 * max(plan.ppo.pi_lr, plan.ppo.vf_lr)


RUN = [
    "env.id=jaxmarl/mpe_simple_spread_v3",
    "rollout.num_envs=4",
    "rollout.rollout_steps=12",
    "env.kwargs={max_steps: 5}",
    "model.hidden_sizes=[16,16]",
    f"total_steps={2 * K * 48}",
    f"log.checkpoint_every={K}",
    "ppo.train_pi_iters=2",
    "ppo.train_vf_iters=2",
    "ppo.num_minibatches=3",
    "log.progress=false",
    "fast.learner=jax",
]


def test_a_run_with_the_jax_learner_repeats_and_resumes_exactly(tmp_path, monkeypatch):
    config = load_config(None, RUN)
    assert (
        plan_run(config)
        .describe()
        .endswith(
            "; rollout: compiled (lax.scan over 12 steps); learner: compiled (one JAX program per update)"
        )
    )
    straight = train(config, tmp_path / "straight")
    from marl_ppo.rollout.jax_scan import CompiledRollout

    calls = {"run": 0, "land": 0}

    def counted(method):
        real = getattr(CompiledRollout, method)

        def call(self, *args):
            calls[method] += 1
            return real(self, *args)

        return call

    for method in calls:
        monkeypatch.setattr(CompiledRollout, method, counted(method))
    again = train(config, tmp_path / "again")
    monkeypatch.undo()
    # the first rollout runs when collected (`run` lands it too); each later one was launched by the
    # update before it and landed when collected
    assert calls == {"run": 1, "land": 2 * K}, calls
    assert again.episodes == straight.episodes
    recorded = load_checkpoint(tmp_path / "straight/checkpoints/final.pt")
    assert recorded["config"]["fast"]["learner"] == "jax"
    assert_identical(
        run_state_only(recorded), run_state_only(load_checkpoint(tmp_path / "again/checkpoints/final.pt"))
    )

    crash_at_update(monkeypatch, K + 2)
    with pytest.raises(Killed):
        train(config, tmp_path / "resumed")
    monkeypatch.undo()
    resumed = train(config, tmp_path / "resumed", resume=True)
    assert (resumed.updates, resumed.episodes) == (2 * K, straight.episodes)
    assert_identical(
        run_state_only(recorded), run_state_only(load_checkpoint(tmp_path / "resumed/checkpoints/final.pt"))
    )
    assert scalars(tmp_path / "resumed") == scalars(tmp_path / "straight")

    # each update launched the next rollout on its new weights, and each was taken up: the same run as
    # one whose rollouts all run when collected
    import marl_ppo.run.loop as loop_module

    monkeypatch.setattr(loop_module, "_launch_ahead", lambda *args: None)
    train(config, tmp_path / "unlaunched")
    monkeypatch.undo()
    assert_identical(
        run_state_only(recorded),
        run_state_only(load_checkpoint(tmp_path / "unlaunched/checkpoints/final.pt")),
    )
    assert scalars(tmp_path / "unlaunched") == scalars(tmp_path / "straight")

    # the learner may change when resuming: torch's learns on from the JAX learner's weights and Adam state
    crash_at_update(monkeypatch, K + 1)
    with pytest.raises(Killed):
        train(config, tmp_path / "switched")
    monkeypatch.undo()
    switched = resume_config(tmp_path / "switched", ["fast.learner=torch"])
    assert plan_run(switched).learner_path is None
    assert train(switched, tmp_path / "switched", resume=True).updates == 2 * K
    final = load_checkpoint(tmp_path / "switched/checkpoints/final.pt")
    assert final["config"]["fast"]["learner"] == "torch"
    for group in final["trainer"]["critic_optimizer"]["state"].values():
        assert float(group["step"]) == float(recorded["trainer"]["critic_optimizer"]["state"][0]["step"])


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["env.id=mpe2/simple_spread_v3", "rollout.vector=sync"],
            "fast.learner=jax: env 'mpe2/simple_spread_v3' is not a JaxMARL env, and the JAX learner needs a "
            "compiled rollout; set fast.learner=torch",
        ),
        (
            [*RUN[:5], "model.recurrent=gru"],
            "fast.learner=jax: model.recurrent=gru; the JAX learner covers feed-forward networks; "
            "set fast.learner=torch",
        ),
        (
            [*RUN[:5], "model.recurrent=lstm"],
            "fast.learner=jax: the rollout is per-step (group 'agent' has an LSTM network; the compiled "
            "rollout covers GRU and feed-forward ones), and the JAX learner needs a compiled rollout; "
            "set fast.learner=torch",
        ),
        (
            [*RUN[:5], "rollout.compiled=false"],
            "fast.learner=jax: the rollout is per-step (rollout.compiled=false), and the JAX learner needs a "
            "compiled rollout; set fast.learner=torch",
        ),
        (
            [*RUN[:5], "ppo.actor_update=sequential"],
            "fast.learner=jax: ppo.actor_update=sequential (HAPPO's turns); the JAX learner updates every "
            "actor at once; set fast.learner=torch",
        ),
    ],
)
def test_the_runs_the_jax_learner_does_not_cover_are_refused_in_one_line(overrides, line):
    with pytest.raises(ConfigError) as refused:
        plan_run(load_config(None, [*overrides, "fast.learner=jax"]))
    assert str(refused.value) == line


def test_the_jax_learner_refuses_a_recurrent_model_itself():
    """A GRU model's rollout may be compiled, but the learner's forward is feed-forward: built on one
    directly, it names the group and the fix."""
    from marl_ppo.algo.jax_trainer import JaxTrainer

    plan = plan_run(_config("ppo.critic=obs"))
    gru = _config("ppo.critic=obs", "model.recurrent=gru", "model.recurrent_size=8")
    model = TeamModel(vector_env(gru).spec, gru)
    with pytest.raises(ConfigError) as refused:
        JaxTrainer(model, plan.ppo, generator=torch.Generator().manual_seed(3))
    assert str(refused.value) == (
        "fast.learner=jax: group 'agent' has a recurrent network; the JAX learner covers feed-forward "
        "ones; set fast.learner=torch"
    )


def test_non_finite_steps_are_skipped_as_torch_skips_them_or_raise_with_no_weight_changed():
    """A NaN observation in one row: the minibatch holding it in each epoch has a NaN loss. Under
    `ppo.on_nonfinite: skip` both learners drop the same steps and end alike; under `error` the JAX
    learner raises after the update and writes no weight."""
    from marl_ppo.algo.jax_trainer import JaxTrainer
    from marl_ppo.faults import NonFiniteError

    torch.set_num_threads(1)
    plan = plan_run(_config("ppo.critic=obs", "ppo.on_nonfinite=skip", "ppo.train_vf_iters=6"))
    spec = vector_env(plan.config).spec
    torch.manual_seed(0)
    model = TeamModel(spec, plan.config)
    batches = _batches(model, spec)
    batches["agent"].obs[100, 1, 3] = float("nan")
    theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
    expected = Trainer(theirs, plan.ppo, generator=torch.Generator().manual_seed(3)).update(batches)
    got = JaxTrainer(ours, plan.ppo, generator=torch.Generator().manual_seed(3)).update(batches)
    assert got.nonfinite_skips == expected.nonfinite_skips == 6  # one minibatch of each critic epoch
    assert got.pi_steps == expected.pi_steps == 12
    for mine, their in zip(ours.parameters(), theirs.parameters(), strict=True):
        _close(mine.detach(), their.detach(), WEIGHTS)

    strict = plan_run(_config("ppo.critic=obs"))
    ours = copy.deepcopy(model)
    with pytest.raises(
        NonFiniteError, match=r"non-finite loss or gradient at update 1 \(epoch 0, minibatch \d\)"
    ):
        JaxTrainer(ours, strict.ppo, generator=torch.Generator().manual_seed(3)).update(batches)
    for mine, start in zip(ours.parameters(), model.parameters(), strict=True):
        assert torch.equal(mine, start)
