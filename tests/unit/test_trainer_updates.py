"""What one PPO update does, step by step: gradient clipping and advantage normalization switches,
the value clip's centre, the KL early stop, and decoupled PPO under policy lag (ratio, weights,
KL stop, logged statistics; nothing of it without lag)."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.losses import approx_kl
from marl_ppo.algo.sequences import policy as _policy
from marl_ppo.algo.trainer import Trainer
from marl_ppo.algo.turns import everyone
from marl_ppo.config import load_config
from tests.helpers import ROOT, collect_rollout, grad_of

TWO_GROUPS = "env.groups={first: [agent_0], rest: [agent_1, agent_2]}"


def _config(*overrides):
    return load_config(
        ROOT / "experiments/mpe/simple_spread.yaml",
        [
            "rollout.num_envs=2",
            "rollout.rollout_steps=25",
            "rollout.vector=sync",
            "rollout.policy_lag=0",
            "ppo.train_pi_iters=2",
            "ppo.train_vf_iters=2",
            "ppo.num_minibatches=2",
            "model.hidden_sizes=[16,16]",
            *overrides,
        ],
    )


def _rollout(config, seed=0):
    """A fresh model, its trainer and the batches of one rollout."""
    model, buffer, rollout = collect_rollout(config, seed)
    batches = rollout_batches(buffer, rollout.last_values, gamma=config.ppo.gamma, lam=config.ppo.gae_lambda)
    return (
        model,
        Trainer(model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)),
        batches,
    )


def _norm(network: nn.Module) -> float:
    return float(nn.utils.get_total_norm([grad_of(p) for p in network.parameters()]))


@pytest.mark.parametrize("grad_clip", ["global", "per_group"])
def test_grad_clip_bounds_each_groups_networks_or_all_of_them(grad_clip):
    """At every optimizer step of an update with max_grad_norm 1e-3 (far below the gradients' norms):
    per_group, each group's actor and each group's critic has norm 1e-3; global, the norm over both
    groups' actors (and over both critics) is 1e-3 and each group's own is less."""
    model, trainer, batches = _rollout(
        _config(TWO_GROUPS, f"ppo.grad_clip={grad_clip}", "ppo.max_grad_norm=1e-3")
    )
    seen: dict[str, list[list[float]]] = {"actors": [], "critics": []}
    for kind, optimizer, networks in (
        ("actors", trainer.actor_optimizer, model.actors),
        ("critics", trainer.critic_optimizer, model.critics),
    ):

        def step(original=optimizer.step, kind=kind, networks=networks):
            seen[kind].append([_norm(network) for network in networks])
            original()

        optimizer.step = step
    trainer.update(batches)
    assert len(seen["actors"]) >= 1 and len(seen["critics"]) == 4  # 2 epochs x 2 minibatches
    for norms in seen["actors"] + seen["critics"]:
        if grad_clip == "per_group":
            assert norms == pytest.approx([1e-3, 1e-3], rel=1e-4)
        else:
            assert sum(n * n for n in norms) ** 0.5 == pytest.approx(1e-3, rel=1e-4)
            assert max(norms) < 0.999e-3


@pytest.mark.parametrize("advantage_norm", ["group", "agent"])
def test_advantage_norm_standardizes_over_the_group_or_each_agent(advantage_norm):
    _, trainer, batches = _rollout(_config(f"ppo.advantage_norm={advantage_norm}"))
    advantages = trainer.prepare(batches)["agent"].advantages[
        0
    ]  # one-step chunks; every agent acts every step
    assert advantages.flatten().mean().item() == pytest.approx(0.0, abs=1e-6)
    assert advantages.flatten().var(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    per_agent_means = advantages.mean(0)
    per_agent_vars = advantages.var(0, unbiased=False)
    if advantage_norm == "agent":
        torch.testing.assert_close(per_agent_means, torch.zeros(3), atol=1e-6, rtol=0)
        torch.testing.assert_close(per_agent_vars, torch.ones(3), atol=1e-5, rtol=0)
    else:  # the agents' own statistics differ
        assert per_agent_means.abs().max() > 1e-3 or (per_agent_vars - 1).abs().max() > 1e-3


class _Rollouts:
    """One model collecting rollout after rollout from its env copies, as the training loop does."""

    def __init__(self, config, seed=0):
        from marl_ppo.models.team import TeamModel
        from marl_ppo.rollout.buffer import RolloutBuffer
        from marl_ppo.rollout.collector import Collector
        from tests.helpers import vector_env

        torch.manual_seed(seed)
        self.config = config
        venv = vector_env(config)
        self.model = TeamModel(venv.spec, config)
        self.buffer = RolloutBuffer(venv.spec, config.rollout.rollout_steps, config.rollout.copies)
        self.collector = Collector(venv, self.model, torch.device("cpu"))
        self.collector.start(seed)
        self.trainer = Trainer(
            self.model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
        )

    def batches(self):
        self.buffer.reset()
        rollout = self.collector.collect(self.buffer)
        return rollout_batches(
            self.buffer, rollout.last_values, gamma=self.config.ppo.gamma, lam=self.config.ppo.gae_lambda
        )


@pytest.mark.parametrize("lagged", [False, True])
def test_the_value_clip_is_centred_on_the_critics_output_at_the_first_step(monkeypatch, lagged):
    """With value_norm on and returns that shift by 10 per update, the centre the first minibatch step
    of the fourth update clips around equals the critic's output there: the acting-time values in the
    units before the update's statistics change, or under decoupled lag the critic's start outputs.
    Normalized with the statistics after, the acting-time values would start off-centre by more than
    the 0.2 clip."""
    import marl_ppo.algo.trainer as trainer_module

    run = _Rollouts(_config("ppo.value_clip=0.2", "ppo.value_norm=true"))

    def shifted(batches, shift):
        return {
            name: dataclasses.replace(batch, returns=batch.returns + shift) for name, batch in batches.items()
        }

    for update in range(3):
        run.trainer.update(shifted(run.batches(), 10.0 * update), lagged=lagged)
    calls = []
    original = trainer_module.value_loss

    def recording(values, centre, *args, **kwargs):
        if values.requires_grad:  # a step's loss, not the diagnostics' before and after
            calls.append((values.detach().clone(), centre.clone()))
        return original(values, centre, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "value_loss", recording)
    batches = shifted(run.batches(), 30.0)
    agents = batches["agent"]
    critic = run.model.group("agent").critic
    flags = torch.zeros((1, *agents.alive.shape), dtype=torch.bool)
    empty = torch.zeros(agents.alive.shape[0], critic.carry_rows, 0)
    with torch.no_grad():
        start_output = critic(agents.state.unsqueeze(0), agents.obs.unsqueeze(0), empty, flags, ~flags)[0][0]
    norm = run.model.group("agent").value_norm
    run.trainer.update(batches, lagged=lagged)
    values, centre = calls[0]
    torch.testing.assert_close(centre, values, rtol=0, atol=1e-5)
    off_centre = norm.normalize(agents.values_old) - start_output  # the statistics after the update
    assert off_centre.abs().min() > 0.2


def _run_recording_kl(model, config, batches):
    """One update. At each KL check (before every actor step but the first): the KL the stop reads,
    recomputed here from the minibatch about to be stepped on (largest over groups); the actors'
    weights after each actor step; and the number of critic steps."""
    trainer = Trainer(
        model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    )
    kls, weights, critic_steps, seen = [], [], [], []
    check, losses = trainer._kl_exceeded, trainer._losses

    def recording_losses(minibatch, learners):
        seen.append(minibatch)
        return losses(minibatch, learners)

    def recording_check(diagnostics):
        with torch.no_grad():
            own = max(
                float(approx_kl(_logp(model, name, batch), batch.logp_old, batch.alive))
                for name, batch in seen[-1].items()
            )
        assert own == pytest.approx(max(float(d["kl"]) for d in diagnostics.values()), rel=1e-5, abs=1e-9)
        kls.append(own)
        return check(diagnostics)

    trainer._losses, trainer._kl_exceeded = recording_losses, recording_check  # type: ignore[method-assign]  # spies
    actor_step, critic_step = trainer.actor_optimizer.step, trainer.critic_optimizer.step

    def recording_actor_step():
        actor_step()
        weights.append({k: v.clone() for k, v in model.actors.state_dict().items()})

    trainer.actor_optimizer.step = recording_actor_step  # type: ignore[method-assign, assignment]  # a spy
    trainer.critic_optimizer.step = lambda: (critic_steps.append(1), critic_step())  # type: ignore[method-assign, assignment, func-returns-value]
    stats = trainer.update(batches)
    return stats, kls, weights, len(critic_steps)


def _logp(model, name, batch):
    return _policy(model.group(name).actor, batch).log_prob(batch.actions)


def test_the_kl_stop_ends_the_actors_at_the_step_that_crosses_the_bound():
    """Unbounded, the update's six actor steps are checked before steps 2..6, at KLs c_1..c_5 from the
    start policy (c_i: after i steps, on the minibatch of step i + 1). With the bound 1.5 * target_kl
    between the largest KL before check j and c_j, the actors take exactly j steps, the last one being
    the step that crossed the bound, and end with the weights it left; the critic takes all six steps."""
    config = _config("ppo.train_pi_iters=3", "ppo.train_vf_iters=3", "ppo.target_kl=1e9")
    model, _, batches = _rollout(config)
    start = copy.deepcopy(model)
    stats, kls, weights, critic_steps = _run_recording_kl(model, config, batches)
    assert (stats.pi_steps, stats.stop_iter, len(kls), len(weights), critic_steps) == (6, 3, 5, 6, 6)
    j = max(i for i in range(2, 5) if kls[i - 1] > max(kls[: i - 1]))  # a check that sees the KL rise
    bound = (max(kls[: j - 1]) + kls[j - 1]) / 2
    stopped = copy.deepcopy(start)
    limited = dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, target_kl=bound / 1.5))
    stats, kls_stopped, weights_stopped, critic_steps = _run_recording_kl(stopped, limited, batches)
    assert stats.pi_steps == j and stats.stop_iter == (j + 1) // 2 and critic_steps == 6
    assert kls_stopped == kls[:j]
    final = stopped.actors.state_dict()
    assert all(torch.equal(final[k], weights[j - 1][k]) for k in final)
    assert not all(torch.equal(final[k], weights[j][k]) for k in final)


def test_a_tiny_target_kl_stops_the_actors_after_their_first_step():
    model, trainer, batches = _rollout(_config("ppo.target_kl=1e-9"))
    stats = trainer.update(batches)
    assert (stats.pi_steps, stats.stop_iter) == (1, 1)


def test_critic_only_steps_skip_the_actors_forward_and_train_the_critic_as_before():
    """With 1 actor epoch and 3 critic epochs (2 minibatches), the actors' forward runs in the two
    actor steps and the two diagnostic evaluations only; the weights after the update equal those of
    a trainer whose every step also computes the (unused) actor loss."""
    config = _config("ppo.train_pi_iters=1", "ppo.train_vf_iters=3")
    model, trainer, batches = _rollout(config)
    reference_model = copy.deepcopy(model)
    reference = Trainer(
        reference_model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    )
    losses = reference._losses
    reference._losses = lambda minibatch, learners: losses(  # type: ignore[method-assign, assignment]
        minibatch, everyone(minibatch)
    )  # actors in every step
    actor = model.group(model.group_names()[0]).actor
    calls = []
    forward = actor.forward
    actor.forward = lambda *args, **kwargs: (calls.append(1), forward(*args, **kwargs))[1]  # type: ignore[func-returns-value]  # a spy
    stats = trainer.update(batches)
    reference.update(batches)
    assert (stats.pi_steps, len(calls)) == (2, 4)
    ours, theirs = model.state_dict(), reference_model.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def _lagged(batches, seed=1):
    """The batches as if a policy one update behind had acted: each logp_old moved by U(-0.5, 0.5)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: dataclasses.replace(
            batch, logp_old=batch.logp_old + torch.rand(batch.logp_old.shape, generator=generator) - 0.5
        )
        for name, batch in batches.items()
    }


def _first_step_policy_terms(monkeypatch, trainer, batches, lagged):
    """Run an update; the policy loss's inputs and terms at its first minibatch step."""
    import marl_ppo.algo.trainer as trainer_module

    calls = []
    original = trainer_module.policy_loss

    def recording(logp, reference, *args, **kwargs):
        terms = original(logp, reference, *args, **kwargs)
        if logp.requires_grad:  # a step's loss, not the diagnostics' before and after
            calls.append((logp.detach().clone(), reference.clone(), terms))
        return terms

    monkeypatch.setattr(trainer_module, "policy_loss", recording)
    stats = trainer.update(batches, lagged=lagged)
    monkeypatch.undo()
    return stats, calls[0]


def test_decoupled_lag_takes_the_ratio_against_the_start_policy(monkeypatch):
    """On a batch whose acting log-probabilities differ from the current policy's by U(-0.5, 0.5), the
    first step's ratio is exactly 1 and nothing is clipped; the advantages' weights are start / acting
    policy (truncated at 1 here). Against the acting policy (`behaviour`) most samples start clipped."""
    model, trainer, batches = _rollout(_config("ppo.behaviour_weight_max=1.0"))
    behind = _lagged(batches)
    start = copy.deepcopy(model)
    stats, (logp, reference, terms) = _first_step_policy_terms(monkeypatch, trainer, behind, lagged=True)
    assert torch.equal(logp, reference)
    assert terms.clipfrac.item() == 0.0 and terms.approx_kl.item() == 0.0
    delta = batches["agent"].logp_old - behind["agent"].logp_old  # log(start / acting) per sample
    assert stats.kl_behaviour_start == pytest.approx((delta.exp() - 1 - delta).mean().item(), rel=1e-5)
    assert stats.behaviour_weight_mean == pytest.approx(delta.exp().clamp(max=1).mean().item(), rel=1e-5)

    config = _config("ppo.lagged_ratio=behaviour")
    trainer = Trainer(
        start, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    )
    stats, (logp, reference, terms) = _first_step_policy_terms(monkeypatch, trainer, behind, lagged=True)
    assert (logp - reference).abs().max() > 0.4  # the ratio starts where the lag put it
    assert terms.clipfrac.item() > 0.45  # |log ratio| above about 0.2 for about 60% of U(-0.5, 0.5)
    assert stats.kl_behaviour_start == pytest.approx((delta.exp() - 1 - delta).mean().item(), rel=1e-5)
    assert stats.behaviour_weight_mean is None


def test_behaviour_weight_max_truncates_the_weights_or_not():
    assert _config().ppo.behaviour_weight_max is None  # untruncated by default, as in the paper
    _, trainer, batches = _rollout(_config("ppo.behaviour_weight_max=null"))
    behind = _lagged(batches)
    delta = batches["agent"].logp_old - behind["agent"].logp_old
    prepared = trainer.prepare(behind, decoupled=True)["agent"]
    torch.testing.assert_close(prepared.weight[0], delta.exp(), rtol=1e-6, atol=0)
    assert prepared.weight.max() > 1.5
    _, trainer, batches = _rollout(_config("ppo.behaviour_weight_max=1.2"))
    prepared = trainer.prepare(_lagged(batches), decoupled=True)["agent"]
    assert prepared.weight.max().item() == pytest.approx(1.2)


def test_without_lag_no_start_policy_is_computed_and_nothing_of_it_is_logged(monkeypatch):
    """Not lagged, or lagged with `lagged_ratio: behaviour`, the update never runs the start-of-update
    forward; the ratio's reference is the acting policy, every weight is 1, and without lag the lag's
    statistics are None."""

    def refuse(*args, **kwargs):
        raise AssertionError("the start policy was computed")

    monkeypatch.setattr(Trainer, "_start_of_update", refuse)
    _, trainer, batches = _rollout(_config())
    prepared = trainer.prepare(batches)["agent"]
    assert torch.equal(prepared.logp_ref, prepared.logp_old) and bool((prepared.weight == 1).all())
    stats = trainer.update(batches)
    assert stats.kl_behaviour_start is None and stats.behaviour_weight_mean is None
    _, trainer, batches = _rollout(_config("ppo.lagged_ratio=behaviour"))
    assert trainer.update(_lagged(batches), lagged=True).kl_behaviour_start > 0.03


def _final_weights(config, batches, lagged, model):
    Trainer(
        model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    ).update(batches, lagged=lagged)
    return model.state_dict()


@pytest.mark.usefixtures("one_thread")  # the acting and the batch forward agree bit for bit on one thread
@pytest.mark.parametrize("lagged_ratio", ["decoupled", "behaviour"])
def test_a_lagged_update_of_an_on_policy_batch_is_the_on_policy_update_bit_for_bit(lagged_ratio):
    """Where the acting policy is the start policy the decoupled ratio, weights (all 1) and KL stop are
    PPO's (value_clip is null in the default experiment, so the clip's centre does not enter); with
    `behaviour` a lagged batch is updated as an on-policy one, the lag ignored."""
    config = _config(f"ppo.lagged_ratio={lagged_ratio}")
    model, _, batches = _rollout(config)
    if lagged_ratio == "behaviour":
        batches = _lagged(batches)
    on_policy = _final_weights(config, batches, False, copy.deepcopy(model))
    lagged = _final_weights(config, batches, True, model)
    assert all(torch.equal(on_policy[k], lagged[k]) for k in on_policy)


@pytest.mark.parametrize(("lagged_ratio", "pi_steps"), [("decoupled", 4), ("behaviour", 1)])
def test_under_decoupled_lag_the_kl_stop_measures_the_updates_own_movement(lagged_ratio, pi_steps):
    """The lag puts the start policy at KL 0.04 from the acting one; an update's own movement here stays
    far below the bound 1.5 * 0.005. Measured from the acting policy, the first step already crosses it."""
    _, trainer, batches = _rollout(_config("ppo.target_kl=0.005", f"ppo.lagged_ratio={lagged_ratio}"))
    stats = trainer.update(_lagged(batches), lagged=True)
    assert stats.kl_behaviour_start == pytest.approx(0.04, abs=0.01)
    assert stats.pi_steps == pi_steps


@pytest.mark.parametrize("vector", ["sync", "workers"])
def test_a_lagged_run_logs_the_lags_kl_and_weights_and_an_unlagged_one_does_not(
    tiny_overrides, tmp_path, vector
):
    """The default experiment with rollout workers runs with policy lag 1: every update logs
    KL(acting || start) and the mean weight (untruncated: 1 in expectation over the acting policy's
    actions, off 1 by sampling noise); in this process (lag 0) neither is logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from marl_ppo.run.loop import train

    config = load_config(
        ROOT / "experiments/mpe/simple_spread.yaml",
        [*tiny_overrides, f"rollout.vector={vector}", "total_steps=150"],
    )
    train(config, tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    lag_tags = {"train/kl_behaviour_start", "train/behaviour_weight_mean"}
    assert "train/pi_steps" in tags
    if vector == "sync":
        assert not lag_tags & tags
        return
    assert lag_tags <= tags
    kls = [e.value for e in events.Scalars("train/kl_behaviour_start")]
    weights = [e.value for e in events.Scalars("train/behaviour_weight_mean")]
    assert len(kls) == len(weights) == 3
    # the first rollout was collected by the start policy (in another process: equal up to rounding)
    assert kls[0] == pytest.approx(0.0, abs=1e-9) and weights[0] == pytest.approx(1.0, abs=1e-5)
    assert all(k > 1e-6 for k in kls[1:]) and all(abs(w - 1) < 0.1 and w != 1.0 for w in weights[1:])
