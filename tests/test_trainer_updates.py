"""What one PPO update does, step by step: the KL early stop, the value clip's centre, and the
gradient clipping and advantage normalization switches."""

import copy
import dataclasses

import pytest
import torch
from conftest import ROOT, collect_rollout
from torch import nn

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.losses import approx_kl
from marl_ppo.algo.trainer import Trainer
from marl_ppo.config import load_config

TWO_GROUPS = "env.groups={first: [agent_0], rest: [agent_1, agent_2]}"


def _config(*overrides):
    return load_config(
        ROOT / "experiments/mpe/simple_spread.yaml",
        [
            "num_envs=2",
            "rollout_steps=25",
            "vector=sync",
            "policy_lag=0",
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
    batches = rollout_batches(buffer, rollout.last_values, gamma=config.gamma, lam=config.gae_lambda)
    return model, Trainer(model, config.ppo, generator=torch.Generator().manual_seed(0)), batches


def _norm(network: nn.Module) -> float:
    return float(nn.utils.get_total_norm([p.grad for p in network.parameters()]))


@pytest.mark.parametrize("grad_clip", ["global", "per_group"])
def test_grad_clip_bounds_each_groups_networks_or_all_of_them(grad_clip):
    """At every optimizer step of an update with max_grad_norm 1e-3 (far below the gradients' norms):
    per_group, each group's actor and each group's critic has norm 1e-3; global, the norm over both
    groups' actors (and over both critics) is 1e-3 and each group's own is less."""
    model, trainer, batches = _rollout(
        _config(TWO_GROUPS, f"ppo.grad_clip={grad_clip}", "ppo.max_grad_norm=1e-3")
    )
    seen = {"actors": [], "critics": []}
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
    advantages = trainer.prepare(batches)["agent"].advantages  # simple_spread: every agent acts every step
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
        from marl_ppo.envs.factory import build_vector_env
        from marl_ppo.models.team import TeamModel
        from marl_ppo.rollout.buffer import RolloutBuffer
        from marl_ppo.rollout.collector import Collector

        torch.manual_seed(seed)
        self.config = config
        venv = build_vector_env(config)
        self.model = TeamModel(venv.spec, config)
        self.buffer = RolloutBuffer(venv.spec, config.rollout_steps, config.num_envs)
        self.collector = Collector(venv, self.model, torch.device("cpu"))
        self.collector.start(seed)
        self.trainer = Trainer(self.model, config.ppo, generator=torch.Generator().manual_seed(0))

    def batches(self):
        self.buffer.reset()
        rollout = self.collector.collect(self.buffer)
        return rollout_batches(
            self.buffer, rollout.last_values, gamma=self.config.gamma, lam=self.config.gae_lambda
        )


def test_the_value_clip_is_centred_on_the_critics_output_at_the_first_step(monkeypatch):
    """With value_norm on and returns that shift by 10 per update, the centre the first minibatch step
    of the fourth update clips around equals the critic's output there (the acting-time values in the
    units before the update's statistics change); normalized with the statistics after, they would
    start off-centre by more than the 0.2 clip."""
    import marl_ppo.algo.trainer as trainer_module

    run = _Rollouts(_config("ppo.value_clip=0.2", "ppo.value_norm=true"))

    def shifted(batches, shift):
        return {
            name: dataclasses.replace(batch, returns=batch.returns + shift) for name, batch in batches.items()
        }

    for update in range(3):
        run.trainer.update(shifted(run.batches(), 10.0 * update))
    calls = []
    original = trainer_module.value_loss

    def recording(values, centre, *args, **kwargs):
        if values.requires_grad:  # a step's loss, not the diagnostics' before and after
            calls.append((values.detach().clone(), centre.clone()))
        return original(values, centre, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "value_loss", recording)
    batches = shifted(run.batches(), 30.0)
    agents = batches["agent"]
    start_output = run.model.raw_values(agents.state, {"agent": agents.obs})["agent"].detach()
    norm = run.model.group("agent").value_norm
    run.trainer.update(batches)
    values, centre = calls[0]
    torch.testing.assert_close(centre, values, rtol=0, atol=1e-5)
    off_centre = norm.normalize(agents.values_old) - start_output  # the statistics after the update
    assert off_centre.abs().min() > 0.2


def _run_recording_kl(model, config, batches):
    """One update; after each actor step, the KL the stop reads (largest over groups) and the actors' weights."""
    trainer = Trainer(model, config.ppo, generator=torch.Generator().manual_seed(0))
    kls, weights, critic_steps = [], [], []
    check = trainer._kl_exceeded

    def recording(minibatch):
        with torch.no_grad():
            kls.append(
                max(
                    float(approx_kl(_logp(model, name, batch), batch.logp_old, batch.alive))
                    for name, batch in minibatch.items()
                )
            )
        weights.append({k: v.clone() for k, v in model.actors.state_dict().items()})
        return check(minibatch)

    trainer._kl_exceeded = recording
    step = trainer.critic_optimizer.step
    trainer.critic_optimizer.step = lambda: (critic_steps.append(1), step())
    stats = trainer.update(batches)
    return stats, kls, weights, len(critic_steps)


def _logp(model, name, batch):
    actor = model.group(name).actor
    return actor.forward_encoded(batch.actor_input, batch.action_mask).log_prob(batch.actions)


def test_the_kl_stop_ends_the_actors_at_the_step_that_crosses_the_bound():
    """Unbounded, the update's six actor steps reach KLs k_1..k_6 from the start policy. With the bound
    1.5 * target_kl between the largest KL before step j and k_j, the actors take exactly j steps and
    end with the weights step j left; the critic still takes all its six steps."""
    config = _config("ppo.train_pi_iters=3", "ppo.train_vf_iters=3", "ppo.target_kl=1e9")
    model, _, batches = _rollout(config)
    start = copy.deepcopy(model)
    stats, kls, weights, critic_steps = _run_recording_kl(model, config, batches)
    assert (stats.pi_steps, stats.stop_iter, len(kls), critic_steps) == (6, 3, 6, 6)
    j = max(i for i in range(1, 5) if kls[i] > max(kls[:i]))  # a step that raises the KL, not the last
    bound = (max(kls[:j]) + kls[j]) / 2
    stopped = copy.deepcopy(start)
    limited = dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, target_kl=bound / 1.5))
    stats, kls_stopped, _, critic_steps = _run_recording_kl(stopped, limited, batches)
    assert stats.pi_steps == j + 1 and stats.stop_iter == j // 2 + 1 and critic_steps == 6
    assert kls_stopped == kls[: j + 1]
    final = stopped.actors.state_dict()
    assert all(torch.equal(final[k], weights[j][k]) for k in final)
    assert not all(torch.equal(final[k], weights[j + 1][k]) for k in final)


def test_a_tiny_target_kl_stops_the_actors_after_their_first_step():
    model, trainer, batches = _rollout(_config("ppo.target_kl=1e-9"))
    stats = trainer.update(batches)
    assert (stats.pi_steps, stats.stop_iter) == (1, 1)
