"""`marl_ppo.load_policy`: a run's policy acting on a PettingZoo env's observations by agent plays
`marl-ppo eval --deterministic`'s episodes exactly, from the run and from its ONNX export."""

import json

import numpy as np
import pytest

import marl_ppo
from marl_ppo.checkpoint import CheckpointError, load_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import build_config, load_config
from marl_ppo.envs.factory import make_team_env
from marl_ppo.eval.evaluate import eval_config, eval_seed
from marl_ppo.plan.settle import plan_eval
from marl_ppo.run.loop import train
from tests.helpers import ROOT

TINY = [
    "rollout.num_envs=2",
    "rollout.rollout_steps=10",
    "total_steps=20",
    "rollout.vector=sync",
    "log.progress=false",
    "ppo.train_pi_iters=2",
    "ppo.train_vf_iters=2",
    "ppo.num_minibatches=1",
    "model.hidden_sizes=[16,16]",
]

CASES = {
    "gru": (ROOT / "experiments/envs/cue_recall.yaml", ["ppo.chunk_length=5", "model.recurrent_size=8"], 8),
    "masked": (None, ["env.id=envs/masked_guess_v0", "model.share_actor=true"], 4),
    "mlp": (ROOT / "experiments/mpe/simple_spread.yaml", ["rollout.rollout_steps=25", "total_steps=50"], 4),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def evaluated(request, tmp_path_factory):
    """(run dir, its `eval --deterministic` eval.json, its ONNX export directory)."""
    experiment, overrides, episodes = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    run_dir = root / "run"
    train(load_config(experiment, [*TINY, *overrides]), run_dir)
    assert (
        main(["eval", str(run_dir), "--deterministic", "--episodes", str(episodes), "--out", str(root)]) == 0
    )
    assert main(["export", str(run_dir), "--out", str(root / "onnx")]) == 0
    return run_dir, json.loads((root / "eval.json").read_text()), root / "onnx"


def _play(policy, run_dir, episodes):
    """Evaluation's episodes played by hand: copy i reset with the eval seed + i, then auto-reset;
    each copy its share of the episodes, in evaluation's order (copy, then episode)."""
    config = plan_eval(_config(run_dir)).config
    evaluated = eval_config(config, episodes)
    copies = evaluated.rollout.copies
    quota = [episodes // copies + (i < episodes % copies) for i in range(copies)]
    returns = []
    for copy, share in enumerate(quota):
        env = make_team_env(evaluated)
        observations, infos = env.reset(seed=eval_seed(config) + copy)
        for _ in range(share):
            state, totals = policy.initial_state(), dict.fromkeys(env.possible_agents, 0.0)
            while env.agents:
                actions, state = policy.act(observations, state)
                observations, rewards, terminated, truncated, infos = env.step(actions)
                for agent, reward in rewards.items():
                    totals[agent] += float(np.float32(reward))  # stored as float32, summed in float64
            returns.append([totals[agent] for agent in env.possible_agents])
            observations, infos = env.reset()
        env.close()
    return np.array(returns)


def _config(run_dir):
    return build_config(load_checkpoint(run_dir / "checkpoints" / "final.pt")["config"])


def test_a_loaded_policy_plays_deterministic_eval_episodes_exactly(evaluated):
    run_dir, report, _ = evaluated
    returns = _play(marl_ppo.load_policy(run_dir), run_dir, report["episodes"])
    np.testing.assert_array_equal(returns, np.array(report["per_episode"]["agent_returns"]))


def test_a_loaded_onnx_export_plays_the_same_episodes(evaluated):
    run_dir, report, onnx_dir = evaluated
    returns = _play(marl_ppo.load_policy(onnx_dir / "policy.json"), run_dir, report["episodes"])
    np.testing.assert_array_equal(returns, np.array(report["per_episode"]["agent_returns"]))


def test_an_observation_of_a_stranger_is_refused_in_one_line(evaluated):
    run_dir, _, _ = evaluated
    policy = marl_ppo.load_policy(run_dir)
    with pytest.raises(
        CheckpointError, match=r"observations of \['nobody'\], who are not in this policy's team"
    ):
        policy.act({"nobody": np.zeros(3)})


def test_a_sampling_policy_repeats_itself_with_its_seed(evaluated):
    run_dir, report, _ = evaluated
    if report["per_episode"]["length"][0] == 1:
        pytest.skip("one-step episodes")
    played = [
        _play(marl_ppo.load_policy(run_dir, deterministic=False, seed=seed), run_dir, 2) for seed in (1, 1, 2)
    ]
    np.testing.assert_array_equal(played[0], played[1])
    assert not np.array_equal(played[0], played[2])
