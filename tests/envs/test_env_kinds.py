"""Teams of different shapes train: Box and MultiDiscrete heads, heterogeneous groups, agents that
leave (and get no loss afterwards), and envs given as `path/to/file.py:callable`."""

import copy
import dataclasses

import pytest
import torch
from marl_ppo_examples.mixed_actions import MixedActionsEnv
from pettingzoo.test import parallel_api_test

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.run.loop import train
from tests.helpers import collect_rollout, vector_env

TINY = [
    "rollout.num_envs=2",
    "rollout.rollout_steps=10",
    "total_steps=40",
    "log.progress=false",
    "ppo.num_minibatches=2",
    "ppo.train_pi_iters=2",
    "ppo.train_vf_iters=2",
    "model.hidden_sizes=[8]",
]


@pytest.mark.parametrize("leaves_at", [None, 3])
def test_mixed_actions_env_passes_the_pettingzoo_api_test(leaves_at):
    parallel_api_test(MixedActionsEnv(signaller_leaves_at=leaves_at), num_cycles=30)


def test_heterogeneous_team_with_a_leaver_trains(tmp_path):
    config = load_config(None, ["env.id=envs/mixed_actions_v0", "env.kwargs={signaller_leaves_at: 4}", *TINY])
    result = train(config, tmp_path)
    assert result.updates == 2 and result.episodes == 4


@pytest.mark.parametrize("share_actor", [False, True])
def test_box_and_multidiscrete_agents_train_together(tmp_path, share_actor):
    config = load_config(None, ["env.id=envs/mixed_actions_v0", f"model.share_actor={share_actor}", *TINY])
    venv = vector_env(config)
    assert [(g.name, g.action_shape) for g in venv.spec.groups] == [("mover", (2,)), ("signaller", (2,))]
    result = train(config, tmp_path)
    assert result.updates == 2 and result.episodes == 4


def test_continuous_mpe_trains(tmp_path):
    config = load_config(
        None, ["env.id=mpe2/simple_spread_v3", "env.kwargs={continuous_actions: true}", *TINY]
    )
    assert train(config, tmp_path).updates == 2


def test_env_from_a_python_file(tmp_path, capsys):
    source = tmp_path / "my_env.py"
    source.write_text(
        "from marl_ppo_examples.early_leaver import EarlyLeaverEnv\n\n"
        "def make(leave_at=2):\n    return EarlyLeaverEnv(leave_at=leave_at, max_steps=5)\n"
    )
    run_dir = tmp_path / "run"
    args = ["train", f"env.id={source}:make", "env.kwargs={leave_at: 1}", *TINY, "--run-dir", str(run_dir)]
    assert main(args) == 0
    assert "done: 40 env steps, 8 episodes" in capsys.readouterr().out
    assert main(["train", f"env.id={source}:missing", "--run-dir", str(tmp_path / "r2")]) == 2
    assert "defines no callable 'missing'" in capsys.readouterr().err


def test_an_agent_that_left_gets_no_loss():
    config = load_config(
        None, ["env.id=envs/early_leaver_v0", "env.kwargs={leave_at: 2, max_steps: 6}", *TINY]
    )
    model, buffer, rollout = collect_rollout(config)
    batch = rollout_batches(buffer, rollout.last_values, gamma=0.99, lam=0.95)["agent"]
    gone = ~batch.alive
    assert gone[:, 1].sum() > 0 and not gone[:, [0, 2]].any()  # only agent_1 is ever absent

    def garbage(tensor):
        noise = torch.full_like(tensor, 1e6) if tensor.is_floating_point() else torch.full_like(tensor, 2)
        mask = gone.reshape(*gone.shape, *([1] * (tensor.dim() - 2)))
        return torch.where(mask, noise, tensor)

    poisoned = dataclasses.replace(
        batch,
        **{
            name: garbage(getattr(batch, name))
            for name in ("obs", "actions", "logp_old", "values_old", "advantages", "returns")
        },
    )
    results = []
    for candidate in (batch, poisoned):
        twin = copy.deepcopy(model)
        Trainer(
            twin, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
        ).update({"agent": candidate})
        results.append(twin.state_dict())
    for name, tensor in results[0].items():
        torch.testing.assert_close(results[1][name], tensor, msg=name)


def test_a_gymnasium_env_trains_as_a_one_agent_team(tmp_path, capsys):
    run_dir = tmp_path / "cartpole"
    assert main(["train", "env.id=gymnasium/CartPole-v1", *TINY, "--run-dir", str(run_dir)]) == 0
    assert "done: 40 env steps" in capsys.readouterr().out
    saved = load_checkpoint(run_dir / "checkpoints/final.pt")
    assert saved["agents"] == ["agent_0"]
    assert main(["train", "env.id=gymnasium/CartPol-v1", "--run-dir", str(tmp_path / "typo")]) == 2
    assert "Did you mean" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists(), "a bad env id leaves no run directory behind"
