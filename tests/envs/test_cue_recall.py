"""envs/cue_recall_v0: a cue at the first step, its name asked at the last; only memory solves it."""

import numpy as np
import pytest
from marl_ppo_examples.cue_recall import CueRecallEnv
from pettingzoo.test import parallel_api_test

from marl_ppo.config import load_config
from marl_ppo.eval.from_checkpoint import evaluate_checkpoint
from marl_ppo.run.loop import train
from tests.helpers import ROOT

EXPERIMENT = ROOT / "experiments/envs/cue_recall.yaml"


def test_cue_recall_passes_the_api_test():
    parallel_api_test(CueRecallEnv(), num_cycles=20)


def _episode(env, seed, policy):
    """Team return of one episode where `policy(agent, first_obs, obs)` picks each action."""
    observations, _ = env.reset(seed=seed)
    first, total = dict(observations), 0.0
    while env.agents:
        actions = {agent: policy(agent, first[agent], observations[agent]) for agent in env.agents}
        observations, rewards, terminations, _, _ = env.step(actions)
        total += sum(rewards.values())
    return total, terminations


def test_the_cue_is_seen_once_and_only_the_last_answer_pays():
    env = CueRecallEnv(num_cues=4, length=5)
    observations, _ = env.reset(seed=3)
    cues = {agent: int(np.argmax(obs[:4])) for agent, obs in observations.items()}
    assert all(obs[:4].sum() == 1.0 and obs[4] == 0.0 for obs in observations.values())
    for t in range(1, 5):
        observations, rewards, terminations, truncations, _ = env.step(dict.fromkeys(cues, 0))
        assert all(obs.sum() == float(t == 4) for obs in observations.values())  # only "answer now"
        assert all(r == 0.0 for r in rewards.values()) and not any(terminations.values())
    _, rewards, terminations, truncations, _ = env.step(dict(cues))
    assert rewards == {"agent_0": 1.0, "agent_1": 1.0} and all(terminations.values())
    assert not any(truncations.values()) and env.agents == []


def test_remembering_scores_2_and_guessing_scores_chance():
    env = CueRecallEnv(num_cues=4, length=5)
    remember = [_episode(env, s, lambda agent, first, obs: int(np.argmax(first[:4])))[0] for s in range(50)]
    assert remember == [2.0] * 50 and env.optimum == 2.0
    guess = np.mean([_episode(env, s, lambda agent, first, obs: 0)[0] for s in range(2000)])
    assert env.chance == 0.5 and abs(guess - 0.5) < 0.06  # 2000 episodes: std of the mean ~0.015


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recurrent", "low", "high"), [("gru", 1.8, 2.0), ("lstm", 1.8, 2.0), ("null", 0.3, 0.75)]
)
def test_only_the_recurrent_policy_learns_the_cue(tmp_path, recurrent, low, high):
    # measured on a 2-core CPU: gru solves it by about 4k env steps, lstm too; feed-forward stays at chance 0.5
    config = load_config(
        EXPERIMENT, [f"model.recurrent={recurrent}", "total_steps=12000", "log.progress=false"]
    )
    result = train(config, tmp_path)
    assert low <= result.team_return_mean <= high, f"team return {result.team_return_mean:.2f}"
    # the evaluation carries the states too: its deterministic episodes score as training did
    evaluated = evaluate_checkpoint(tmp_path, episodes=100, deterministic=True, out=tmp_path / "eval")
    team = float(evaluated.result.team_returns.mean())
    assert low <= team <= high, f"evaluated team return {team:.2f}"
