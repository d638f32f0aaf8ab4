"""Frame preprocessing (`env.greyscale`, `env.resize`, `env.frame_stack`): values computed by hand."""

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo import ParallelEnv

from marl_ppo.config import ConfigError, load_config
from marl_ppo.envs.frames import FrameOptions, FramePreprocess, with_frame_options
from marl_ppo.envs.grouping import build_team_spec


class FrameEnv(ParallelEnv):
    """Two agents seeing `frames[t]` at step t (HWC, or CHW with `chw`); agent `b` ends at step 2."""

    metadata = {"name": "frame_env"}

    def __init__(self, frames, chw=False):
        self.frames = [f.transpose(2, 0, 1) if chw else f for f in frames]
        self.possible_agents = ["a", "b"]
        self.state_space = gym.spaces.Box(0, 255, (64, 96, 3), np.uint8)
        self._space = gym.spaces.Box(0, 255, self.frames[0].shape, np.uint8)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def state(self):
        return np.zeros((64, 96, 3), np.uint8)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: self.frames[0] for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        obs = {a: self.frames[self.t] for a in self.agents}
        done = {a: a == "b" and self.t == 2 for a in self.agents}
        self.agents = [a for a in self.agents if not done[a]]
        return obs, {a: 0.0 for a in obs}, done, {a: False for a in obs}, {a: {} for a in obs}


def _solid(r, g, b, side=4):
    return np.broadcast_to(np.array([r, g, b], np.uint8), (side, side, 3)).copy()


def test_greyscale_is_the_rounded_luma_of_each_pixel():
    env = FramePreprocess(FrameEnv([_solid(200, 100, 50)] * 3), FrameOptions(greyscale=True))
    obs, _ = env.reset()
    # 0.299 * 200 + 0.587 * 100 + 0.114 * 50 = 59.8 + 58.7 + 5.7 = 124.2
    assert obs["a"].shape == (4, 4, 1) and obs["a"].dtype == np.uint8
    assert np.all(obs["a"] == 124)
    assert env.observation_space("a") == gym.spaces.Box(0, 255, (4, 4, 1), np.uint8)


def test_shrinking_averages_each_block_and_rounds():
    frame = np.zeros((4, 4, 3), np.uint8)
    frame[:2, :2] = [[[10, 0, 0], [11, 0, 0]], [[12, 0, 0], [14, 0, 0]]]  # mean 11.75 -> 12
    frame[2:, 2:] = 255
    env = FramePreprocess(FrameEnv([frame] * 3), FrameOptions(resize=(2, 2)))
    obs, _ = env.reset()
    assert obs["a"].shape == (2, 2, 3)
    assert obs["a"][0, 0].tolist() == [12, 0, 0]
    assert obs["a"][1, 1].tolist() == [255, 255, 255]
    assert obs["a"][0, 1].tolist() == [0, 0, 0]


def test_a_shrink_by_an_uneven_factor_gives_each_source_pixel_to_one_output_pixel():
    frame = np.zeros((2, 3, 1), np.uint8)
    frame[:, :, 0] = [0, 90, 180]  # 3 -> 2 columns: the first two pixels' centres fall in the first half
    env = FramePreprocess(FrameEnv([frame] * 3), FrameOptions(resize=(2, 2)))
    obs, _ = env.reset()
    assert obs["a"][..., 0].tolist() == [[45, 180], [45, 180]]


@pytest.mark.parametrize("chw", [False, True])
def test_stacks_hold_the_last_frames_newest_last_and_restart_from_zeros(chw):
    frames = [_solid(v, v, v) for v in (10, 20, 30, 40)]
    env = FramePreprocess(FrameEnv(frames, chw=chw), FrameOptions(greyscale=True, stack=3))
    channel = (lambda o: o[0, 0, :]) if not chw else (lambda o: o[:, 0, 0])
    obs, _ = env.reset()
    assert channel(obs["a"]).tolist() == [0, 0, 10]
    obs, *_ = env.step({"a": 0, "b": 0})
    assert channel(obs["a"]).tolist() == [0, 10, 20]
    obs, *_ = env.step({"a": 0, "b": 0})  # b's episode ends here
    assert channel(obs["a"]).tolist() == [10, 20, 30] == channel(obs["b"]).tolist()
    assert "b" not in env._stacks
    obs, _ = env.reset()
    assert channel(obs["b"]).tolist() == [0, 0, 10]
    expected = (4, 4, 3) if not chw else (3, 4, 4)
    assert env.observation_space("a").shape == expected


def test_a_resized_observation_keeps_its_size_under_auto_pooling_while_the_state_is_pooled():
    env = with_frame_options(FrameEnv([_solid(1, 2, 3, side=120)] * 3), FrameOptions(resize=(84, 84)))
    spec = build_team_spec(env, "frame_env", image_pool="auto", encoder="cnn", sized_obs=True)
    (group,) = spec.groups
    assert group.obs_layout is not None and spec.state_layout is not None
    assert group.obs_layout.parts[0].shape == (84, 84, 3) and group.obs_layout.parts[0].pool == 1
    assert spec.image_pool == 2 and spec.state_layout.parts[0].shape == (32, 48, 3)  # 96 / 64 -> 2


def test_options_come_from_the_env_config_and_bad_envs_are_refused_in_one_line():
    config = load_config(None, ["env.greyscale=true", "env.resize=[84,84]", "env.frame_stack=4"])
    assert FrameOptions.of(config.env) == FrameOptions(True, (84, 84), 4)
    assert not FrameOptions.of(load_config(None, []).env).active

    class VectorEnv(FrameEnv):
        def observation_space(self, agent):
            return gym.spaces.Box(-1, 1, (5,), np.float32)

    with pytest.raises(ConfigError, match="uint8 image observations.*agent 'a'"):
        with_frame_options(VectorEnv([_solid(0, 0, 0)] * 3), FrameOptions(stack=2))
    from pettingzoo.classic import tictactoe_v3

    with pytest.raises(ConfigError, match="turn-based"):
        with_frame_options(tictactoe_v3.env(), FrameOptions(stack=2))
