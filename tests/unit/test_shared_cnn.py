"""`model.shared_cnn`: one CNN per group that the actor and the critic both read, run once for both."""

import pytest
import torch

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.trainer import Trainer
from marl_ppo.config import load_config
from marl_ppo.envs.factory import probe_spec
from marl_ppo.envs.layout import InputLayout, InputPart
from marl_ppo.models.encoders import CnnShape, FeatureEncoder, ReusedFeatures
from marl_ppo.models.team import TeamModel
from tests.helpers import collect_rollout

SIGNAL = "envs/pixel_signal_v0"
SHARED = [
    f"env.id={SIGNAL}",
    "ppo.critic=obs",
    "model.share_actor=true",
    "model.shared_cnn=true",
    "rollout.num_envs=4",
    "rollout.rollout_steps=4",
    "rollout.vector=sync",
    "ppo.train_pi_iters=2",
    "ppo.train_vf_iters=2",
    "ppo.num_minibatches=2",
    "ppo.target_kl=null",
    "model.hidden_sizes=[16,16]",
]


def test_the_critic_reads_the_actors_cnn_and_its_optimizer_leaves_it_to_the_actors():
    config = load_config(None, SHARED)
    model = TeamModel(probe_spec(config), config)
    actor, critic, _ = model.group("seer")
    assert critic.images is not None
    assert isinstance(actor.features, ReusedFeatures) and critic.images.obs is actor.features
    cnn = {id(p) for p in actor.features.parameters()}
    assert cnn and not cnn & {id(p) for p in model.critic_parameters()}
    separate = TeamModel(probe_spec(config), load_config(None, [*SHARED, "model.shared_cnn=false"]))
    own_images = separate.group("seer").critic.images
    assert own_images is not None
    own_cnn = sum(p.numel() for p in own_images.parameters())
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in separate.parameters()) - own_cnn


def test_an_update_runs_the_cnn_once_per_minibatch_and_both_losses_train_it():
    torch.manual_seed(0)
    config = load_config(None, SHARED)
    model, buffer, rollout = collect_rollout(config)
    batches = rollout_batches(buffer, rollout.last_values, rollout.last_alive, gamma=0.99, lam=0.95)
    reused = model.group("seer").actor.features
    trainer = Trainer(
        model, config.ppo.settled(convolutional=True), generator=torch.Generator().manual_seed(0)
    )
    before = [p.detach().clone() for p in reused.parameters()]
    runs = reused.runs
    trainer.update(batches)
    # 2 epochs x 2 minibatches with gradients, plus the statistics' forward before and after
    assert reused.runs - runs == 4 + 2
    assert all(not torch.equal(b, p) for b, p in zip(before, reused.parameters(), strict=True))
    actor_params = {id(p) for p in trainer.actor_optimizer.param_groups[0]["params"]}
    critic_params = {id(p) for p in trainer.critic_optimizer.param_groups[0]["params"]}
    assert {id(p) for p in reused.parameters()} <= actor_params - critic_params


def _rollout_values(obs_of=lambda obs: obs):
    """A rollout of the shared-CNN config, and the critic's raw values over it, each env copy's
    rollout as one sequence (`obs_of` gives the observations the critic reads)."""
    model, buffer, _ = collect_rollout(load_config(None, SHARED))
    _, critic, norm = model.group("seer")
    storage = buffer.groups["seer"]
    flags = torch.zeros(storage.alive.shape, dtype=torch.bool)
    carry = torch.zeros(flags.shape[1], 2, 0)
    values, _ = critic(buffer.state, obs_of(storage.obs), carry, flags, ~flags)
    return critic, norm, storage, values


def test_the_critics_loss_reaches_the_shared_cnn():
    critic, _, _, values = _rollout_values()
    values.square().sum().backward()
    conv = critic.images.obs.encoder.images["0"].convs[0]
    assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0


def test_acting_stores_the_values_the_critic_computes_afresh():
    with torch.no_grad():  # a copy of the observations: the features are computed anew, not reused
        _, norm, storage, values = _rollout_values(torch.clone)
    torch.testing.assert_close(norm.denormalize(values), storage.values)


def test_reuse_needs_the_same_unchanged_input_in_the_same_grad_mode():
    layout = InputLayout((InputPart(0, 3 * 8 * 8, shape=(8, 8, 3), frames=True),))
    reused = ReusedFeatures(FeatureEncoder(layout, copies=1, cnn=CnnShape((4,), (3,), (2,), 8)))
    x = torch.randint(0, 255, (5, 2, 192), dtype=torch.uint8)
    first = reused(x)
    assert reused(x) is first and reused(x.view(5, 2, 192)) is first and reused.runs == 1
    x[0, 0, 0] += 1  # changed in place: computed again
    changed = reused(x)
    assert reused.runs == 2 and not torch.equal(changed, first)
    with torch.no_grad():
        assert reused(x) is not changed and reused.runs == 3
    assert not torch.equal(reused(x.clone()), torch.zeros(())) and reused.runs == 4


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["ppo.critic=state"], "critic: obs"),
        (["ppo.critic=obs", "model.share_actor=false", "model.share_critic=true"], "critic: obs"),
        (["ppo.critic=obs", "model.share_critic=false", "ppo.actor_update=sequential"], "sequential"),
    ],
)
def test_shared_cnn_needs_an_obs_critic_with_the_actors_sharing_and_no_agent_turns(extra, named):
    with pytest.raises(ValueError, match=f"model.shared_cnn=true .*{named}"):
        load_config(None, [f"env.id={SIGNAL}", "model.shared_cnn=true", *extra])
