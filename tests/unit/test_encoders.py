"""Image and Dict observations: layouts, uint8 frames end to end, the CNN encoders, and learning."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from marl_ppo.algo.trainer import Trainer
from marl_ppo.config import ConfigError, PPOConfig, load_config
from marl_ppo.envs.factory import probe_spec
from marl_ppo.envs.layout import InputLayout, InputPart, auto_pool, channels_last, layout_of, pool_frame
from marl_ppo.models.encoders import CnnShape, FeatureEncoder, ImageEncoder, conv_activation_floats
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.run.build import build_collector
from marl_ppo.run.loop import train
from tests.helpers import collect_rollout, values_of, vector_env

SIGNAL, COMPASS = "envs/pixel_signal_v0", "envs/pixel_compass_v0"
FAST = [
    "rollout.num_envs=4",
    "rollout.rollout_steps=4",
    "total_steps=32",
    "log.progress=false",
    "ppo.train_pi_iters=2",
    "ppo.train_vf_iters=2",
    "ppo.num_minibatches=2",
    "model.hidden_sizes=[16,16]",
]


def _config(env_id: str, *extra: str):
    return load_config(None, [f"env.id={env_id}", *FAST, *extra])


def test_auto_pool_bounds_each_side_and_the_pixels_of_a_step():
    pistons = gym.spaces.Box(0, 255, (457, 120, 3), np.uint8)
    screen = gym.spaces.Box(0, 255, (560, 880, 3), np.uint8)
    # 20 pistons: 15 leaves 20 x 30 x 8 = 4,800 pixels a step, 16 leaves 20 x 28 x 7 = 3,920 <= 64 x 64
    assert auto_pool([pistons] * 20, screen) == 16
    # one piston: ceil(457 / 64) = 8 bounds the side, and 57 x 15 pixels are within the budget
    assert auto_pool([pistons], screen) == 8
    # cooperative_pong's two 280 x 480 screens: 8 leaves 2 x 35 x 60 = 4,200 pixels, 9 leaves 3,286
    assert auto_pool([gym.spaces.Box(0, 255, (280, 480, 3), np.uint8)] * 2, None) == 9
    # no image observation: the state's side alone, ceil(880 / 64)
    assert auto_pool([gym.spaces.Box(0, 1, (18,), np.float32)], screen) == 14
    assert auto_pool([gym.spaces.Box(0, 255, (3, 64, 64), np.uint8)], None) == 1
    # 81 agents' 13 x 13 views exceed the budget, but pooling would take their side below 16 pixels
    assert auto_pool([gym.spaces.Box(0, 1, (13, 13, 5), np.float32)] * 81, None) == 1
    # 50 agents' 100 x 100 views: the budget stops at a 16-pixel side (factor 6), not at 64 x 64 pixels
    assert auto_pool([gym.spaces.Box(0, 255, (100, 100, 3), np.uint8)] * 50, None) == 6
    assert auto_pool([gym.spaces.Box(0, 1, (18,), np.float32)], None) == 1


def test_auto_epochs_are_4_for_a_cnn_model_and_10_without_and_the_run_records_them(tmp_path):
    assert PPOConfig().settled(convolutional=True).train_pi_iters == 4
    assert PPOConfig().settled(convolutional=False).train_vf_iters == 10
    explicit = PPOConfig(train_pi_iters=7, train_vf_iters=3).settled(convolutional=True)
    assert (explicit.train_pi_iters, explicit.train_vf_iters) == (7, 3)
    for env_id, extra, epochs in (
        (SIGNAL, [], 4),
        (SIGNAL, ["model.encoder=mlp"], 10),
        ("envs/matrix_game_v0", [], 10),
    ):
        args = [f"env.id={env_id}", *(a for a in FAST if "_iters" not in a), *extra]
        config = load_config(None, args)
        settled = plan_run(config).config.ppo
        assert (settled.train_pi_iters, settled.train_vf_iters) == (epochs, epochs), (env_id, extra)
        run_dir = tmp_path / f"{env_id.replace('/', '_')}-{len(extra)}"
        train(config, run_dir)
        recorded = yaml.safe_load((run_dir / "config.yaml").read_text())["ppo"]
        assert (recorded["train_pi_iters"], recorded["train_vf_iters"]) == (epochs, epochs), (env_id, extra)


def test_axis_order_and_pooled_frames_stay_uint8():
    assert channels_last((457, 120, 3)) and channels_last((84, 84, 4)) and not channels_last((4, 84, 84))
    image = np.arange(4 * 6 * 2, dtype=np.uint8).reshape(4, 6, 2) * 5
    pooled = pool_frame(image, 2, last=True)
    assert pooled.dtype == np.uint8 and pooled.shape == (2, 3, 2)
    assert pooled[1, 2, 1] == np.rint(image[2:4, 4:6, 1].mean())
    chw = pool_frame(np.moveaxis(image, -1, 0), 2, last=False)
    np.testing.assert_array_equal(chw, np.moveaxis(pooled, -1, 0))


def test_layout_of_an_image_a_dict_and_a_vector():
    pixels = gym.spaces.Box(0, 255, (457, 120, 3), np.uint8)
    (part,) = layout_of(pixels, pool=8, frames=True).parts
    assert (part.shape, part.chw, part.size, part.frames) == ((57, 15, 3), (3, 57, 15), 2565, True)
    assert layout_of(pixels, pool=8, frames=True).dtype == np.uint8
    assert layout_of(pixels, pool=8, frames=False) == InputLayout((InputPart(0, 2565, pool=8),))
    from marl_ppo_examples.pixel_compass import PixelCompassEnv

    layout = layout_of(PixelCompassEnv().observation_space("scout_0"), pool=1, frames=True)
    assert [(p.key, p.offset, p.size, p.is_image) for p in layout.parts] == [  # gymnasium sorts the keys
        ("flip", 0, 2, False),
        ("image", 2, 64, True),
    ]
    assert layout.dtype == np.float32  # a float vector beside the frame


def test_image_env_frames_are_stored_as_uint8_pixels_end_to_end():
    config = _config(SIGNAL)
    spec = probe_spec(config)
    (group,) = spec.groups
    assert group.obs_dtype == np.uint8 and group.obs_dim == 144
    assert spec.state_layout is not None
    assert spec.state_dtype == np.uint8 and spec.state_layout.parts[0].chw == (2, 12, 12)
    model, buffer, _ = collect_rollout(config)
    assert buffer.groups["seer"].obs.dtype == torch.uint8 and buffer.state.dtype == torch.uint8
    # the stored pixels are the env's grey levels: 20 background, 230 for the quadrant's square
    assert set(torch.unique(buffer.groups["seer"].obs).tolist()) == {20, 230}
    assert int((buffer.groups["seer"].obs == 230).sum(-1).unique().item()) == 36  # a 6 x 6 square
    assert isinstance(model.group("seer").actor.features, FeatureEncoder)


def test_subprocess_shared_memory_carries_the_frames_bit_for_bit():
    arrays = {}
    for vector in ("sync", "subprocess"):
        venv = vector_env(_config(SIGNAL, f"rollout.vector={vector}"))
        try:
            venv.reset(seed=5)
            venv.step({"seer": np.array([[0, 1]] * 4)})
            arrays[vector] = (venv.arrays.groups["seer"].obs.copy(), venv.arrays.state.copy())
        finally:
            venv.close()
    for sync, shared in zip(arrays["sync"], arrays["subprocess"], strict=True):
        assert shared.dtype == np.uint8
        np.testing.assert_array_equal(sync, shared)


def test_training_on_frames_gives_the_same_weights_in_sync_and_subprocess_envs(tmp_path):
    weights = {}
    for mode in ("sync", "subprocess"):
        # one learner thread in both: under auto a sync run's CNN learner takes the cores that the
        # subprocess run leaves to its env workers, and thread counts change a convolution's last bits
        train(
            _config(SIGNAL, f"rollout.vector={mode}", "rollout.num_workers=2", "host.torch_threads=1"),
            tmp_path / mode,
        )
        weights[mode] = torch.load(tmp_path / mode / "checkpoints/final.pt", weights_only=False)["model"]
    assert weights["sync"].keys() == weights["subprocess"].keys()
    for key, value in weights["sync"].items():
        assert torch.equal(value, weights["subprocess"][key]), key


def test_rollout_workers_fill_the_buffer_with_frames_their_policy_acted_on():
    config = _config(SIGNAL, "rollout.vector=workers", "rollout.num_workers=2")
    collector, model = build_collector(plan_run(config))
    try:
        collector.start(seed=1)
        buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, config.rollout.copies)
        collector.collect(buffer)
    finally:
        collector.close()
    storage = buffer.groups["seer"]
    assert storage.obs.dtype == torch.uint8 and set(torch.unique(storage.obs).tolist()) == {20, 230}
    with (
        torch.no_grad()
    ):  # the learner's copy of the policy, on the stored frames, gives the acting log-probs
        flags = torch.zeros(storage.alive.shape, dtype=torch.bool)  # (T, E, A): one sequence per env copy
        carry = torch.zeros(flags.shape[1], flags.shape[2], 0)
        dist, _ = model.group("seer").actor(storage.obs, storage.action_mask, carry, flags, ~flags)
        logp = dist.log_prob(storage.actions)
    torch.testing.assert_close(logp, storage.logp)


def test_mlp_encoder_keeps_the_flat_float_input():
    config = _config(SIGNAL, "model.encoder=mlp")
    spec = probe_spec(config)
    assert spec.groups[0].obs_dtype == np.float32 and spec.state_dtype == np.float32
    model = TeamModel(spec, config)
    assert model.group("seer").actor.features is None and model.group("seer").critic.images is None
    assert model.group("seer").actor.net.in_dim == 144


def test_cnn_encoder_refuses_an_env_without_images():
    with pytest.raises(ConfigError, match="model.encoder=cnn but no observation or state .* is an image"):
        probe_spec(load_config(None, ["env.id=envs/matrix_game_v0", "model.encoder=cnn"]))


def test_cnn_layer_lists_must_have_one_value_per_layer():
    with pytest.raises(ConfigError, match="give each one value per layer"):
        load_config(None, ["model.cnn_channels=[8,8]", "model.cnn_kernels=[3]", "model.cnn_strides=[1]"])


def test_valid_padding_is_the_nature_cnn_and_too_small_a_frame_names_the_key():
    """84x84 frames through kernels 8/4/3, strides 4/2/1: 7x7 maps unpadded (SB3's NatureCNN flattens
    3136 features at 64 channels), 12x12 padded by half the kernel."""
    part = InputPart(0, 3 * 84 * 84, shape=(3, 84, 84), frames=True)
    shapes = {
        padding: CnnShape((32, 64, 64), (8, 4, 3), (4, 2, 1), features=512, padding=padding)
        for padding in ("same", "valid")
    }
    assert ImageEncoder(part, copies=1, cnn=shapes["valid"]).flat_dim == 64 * 7 * 7 == 3136
    assert ImageEncoder(part, copies=1, cnn=shapes["same"]).flat_dim == 64 * 12 * 12
    layout = InputLayout((part,))
    assert conv_activation_floats(layout, shapes["valid"]) < conv_activation_floats(layout, shapes["same"])
    small = InputPart(0, 2 * 6 * 6, shape=(2, 6, 6), frames=True)
    with pytest.raises(ConfigError, match=r"\(6x6\) is too small .* set model.cnn_padding=same"):
        ImageEncoder(small, copies=1, cnn=shapes["valid"])
    assert load_config(None, ["model.cnn_padding=valid"]).model.cnn_padding == "valid"


def _encoder(layout: InputLayout, copies: int) -> FeatureEncoder:
    torch.manual_seed(0)
    return FeatureEncoder(
        layout, copies=copies, cnn=CnnShape(channels=(4, 8), kernels=(3, 3), strides=(2, 1), features=5)
    )


def test_per_agent_cnns_are_each_agents_own_network():
    layout = InputLayout((InputPart(0, 2 * 6 * 6, shape=(6, 6, 2), frames=True), InputPart(72, 3)))
    stacked = _encoder(layout, copies=3)
    rows = torch.randint(0, 256, (7, 3, 75)).float()
    rows[..., 72:] = torch.randn(7, 3, 3)
    out = stacked(rows)
    assert out.shape == (7, 3, 5 + 3)
    torch.testing.assert_close(out[..., 5:], rows[..., 72:])  # the vector part passes through
    image = rows[..., :72].unflatten(-1, (6, 6, 2)).permute(0, 1, 4, 2, 3) / 255.0
    encoder = stacked.images["0"]
    assert isinstance(encoder, ImageEncoder)
    for agent in range(3):
        h = image[:, agent]
        for conv in encoder.convs:
            assert isinstance(conv, torch.nn.Conv2d) and conv.bias is not None
            w = conv.weight.chunk(3)[agent]
            b = conv.bias.chunk(3)[agent]
            h = torch.relu(torch.nn.functional.conv2d(h, w, b, conv.stride, conv.padding))
        h = torch.relu(h.flatten(1) @ encoder.linear.weight[agent].T + encoder.linear.bias[agent])
        torch.testing.assert_close(out[:, agent, :5], h)


def test_frames_are_scaled_inside_the_model_and_chw_equals_hwc():
    hwc = InputLayout((InputPart(0, 48, shape=(4, 4, 3), frames=True),))
    chw = InputLayout((InputPart(0, 48, shape=(3, 4, 4), frames=False),))
    pixels = torch.randint(0, 256, (5, 1, 4, 4, 3), dtype=torch.uint8)
    from_frames = _encoder(hwc, copies=1)(pixels.flatten(-3))
    as_floats = _encoder(chw, copies=1)(pixels.permute(0, 1, 4, 2, 3).flatten(-3).float() / 255.0)
    torch.testing.assert_close(from_frames, as_floats)


def test_state_critic_reads_the_image_state():
    config = _config(SIGNAL)
    spec = probe_spec(config)
    model = TeamModel(spec, config)
    state = torch.full((2, spec.state_dim), 20, dtype=torch.uint8)
    obs = torch.full((2, 2, spec.groups[0].obs_dim), 20, dtype=torch.uint8)
    before = values_of(model, state, {"seer": obs})["seer"]
    state[1, :72] = 230  # the first channel's top half: another quadrant for agent 0
    after = values_of(model, state, {"seer": obs})["seer"]
    assert torch.equal(before[0], after[0]) and not torch.equal(before[1], after[1])
    assert after.shape == (2, 2)


@pytest.mark.parametrize("critic", ["state+obs", "obs", "team"])
def test_every_critic_input_kind_takes_frames(critic):
    config = _config(SIGNAL, f"ppo.critic={critic}", "model.share_critic=true")
    model, buffer, _ = collect_rollout(config)
    storage = buffer.groups["seer"]
    critic_net = model.group("seer").critic
    steps, envs = storage.values.shape[:2]
    flags = torch.zeros(storage.alive.shape, dtype=torch.bool)  # (T, E, A): one sequence per env copy
    carry = torch.zeros(envs, critic_net.carry_rows, 0)
    values, _ = critic_net(buffer.state, storage.obs, carry, flags, ~flags)
    assert values.shape == storage.values.shape
    torch.testing.assert_close(model.group("seer").value_norm.denormalize(values), storage.values)


def test_dict_observation_masks_and_stores_its_image_beside_the_vector():
    config = _config(COMPASS)
    spec = probe_spec(config)
    (group,) = spec.groups
    assert group.mask_source == "obs" and group.mask_dim == 3 and group.obs_dim == 66
    model, buffer, _ = collect_rollout(config)
    storage = buffer.groups["scout"]
    assert not bool((storage.actions == 2).any())  # the masked action is never taken
    assert set(torch.unique(storage.obs[..., 2:]).tolist()) == {0.0, 255.0}
    assert torch.equal(storage.obs[..., :2].sum(-1), torch.ones(storage.obs.shape[:-1]))
    actor = model.group("scout").actor
    assert actor.net.in_dim == 2 + 128  # the vector, then the image's CNN features


@pytest.mark.slow
@pytest.mark.parametrize("env_id", [SIGNAL, COMPASS])
def test_cnn_encoder_learns_the_pixel_envs_to_their_optimum(tmp_path, env_id):
    # random: 0.5 (pixel_signal, 4 quadrants) and 1.0 (pixel_compass, 2 allowed actions); optimum 2
    config = load_config(
        None,
        [
            f"env.id={env_id}",
            "rollout.num_envs=16",
            "rollout.rollout_steps=8",
            "total_steps=30000",
            "log.progress=false",
            "log.return_window=200",
        ],
    )
    result = train(config, tmp_path)
    assert result.team_return_mean > 1.9, f"team return {result.team_return_mean:.2f}, optimum 2"


@pytest.mark.parametrize("env_id", [SIGNAL, COMPASS])
def test_a_recurrent_policy_behind_the_cnn_recomputes_its_acting_log_probs(env_id):
    """Encoder -> MLP trunk -> GRU: before the first update the chunked replay of a rollout gives the
    log-probabilities it acted with (ratio 1), frames and all."""
    from marl_ppo.algo.batch import rollout_batches
    from marl_ppo.algo.sequences import policy as _policy
    from marl_ppo.algo.sequences import unchunk

    config = _config(
        env_id,
        "model.recurrent=gru",
        "model.recurrent_size=8",
        "rollout.rollout_steps=6",
        "rollout.vector=sync",
        "ppo.chunk_length=3",
    )
    torch.manual_seed(0)
    collector, model = build_collector(plan_run(config))
    try:
        collector.start(0)
        buffer = RolloutBuffer(
            model.spec, config.rollout.rollout_steps, config.rollout.copies, memory=model.memory_layout()
        )
        result = collector.collect(buffer)
    finally:
        collector.close()
    group = model.spec.groups[0].name
    assert model.group(group).actor.features is not None  # the CNN reads the frames
    batches = rollout_batches(buffer, result.last_values, result.last_alive, gamma=0.9, lam=0.9)
    prepared = Trainer(model, config.ppo.settled(convolutional=True), generator=torch.Generator()).prepare(
        batches
    )[group]
    with torch.no_grad():
        actor = model.group(group).actor
        logp = unchunk(
            _policy(actor, prepared).log_prob(prepared.actions), steps=config.rollout.rollout_steps
        )
    stored = buffer.groups[group]
    torch.testing.assert_close(logp, stored.logp, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "factor"), [((457, 120, 3), 8), ((560, 880, 3), 14), ((3, 64, 64), 2), ((7, 9, 1), 3)]
)
def test_pooled_frames_equal_the_rounded_float_mean_of_each_block(shape, factor):
    """The integer pooling equals rint(mean) of each block exactly, ties (x.5) rounded to even included."""
    rng = np.random.default_rng(0)
    last = channels_last(shape)
    image = rng.integers(0, 256, shape, dtype=np.uint8)
    hwc = image if last else np.moveaxis(image, 0, -1)
    h, w = hwc.shape[0] // factor, hwc.shape[1] // factor
    blocks = hwc[: h * factor, : w * factor].reshape(h, factor, w, factor, -1).astype(np.float64)
    expected = np.rint(blocks.mean(axis=(1, 3))).astype(np.uint8)
    pooled = pool_frame(image, factor, last)
    np.testing.assert_array_equal(pooled if last else np.moveaxis(pooled, 0, -1), expected)
    ties = np.zeros((2, 2, 1), np.uint8)
    for value in range(255):  # blocks of mean value + 0.5: even neighbour chosen
        ties[0], ties[1] = value, value + 1
        assert pool_frame(ties, 2, True)[0, 0, 0] == np.rint(value + 0.5)


def test_a_column_major_frame_pools_as_its_contiguous_copy():
    """Pistonball's state is a transposed view; pooling it in memory order gives the same frame."""
    rng = np.random.default_rng(1)
    stored = rng.integers(0, 256, (880, 560, 3), dtype=np.uint8)
    view = stored.transpose(1, 0, 2)  # (560, 880, 3), column-major
    np.testing.assert_array_equal(
        pool_frame(view, 14, True), pool_frame(np.ascontiguousarray(view), 14, True)
    )
    chw = np.moveaxis(view, -1, 0)
    np.testing.assert_array_equal(pool_frame(chw, 14, False), np.moveaxis(pool_frame(view, 14, True), -1, 0))
