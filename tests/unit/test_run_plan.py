"""The run settled once (`marl_ppo.plan`): one probe env copy, one `resolve_vector`, every `auto` settled and
recorded, the trainer refusing what is not settled, and an evaluation planned from its checkpoint."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
import yaml

import marl_ppo.envs.factory as factory
import marl_ppo.plan.host as host
import marl_ppo.run.loop as loop
from marl_ppo.algo.trainer import Trainer
from marl_ppo.config import SettledPPO, config_to_dict, load_config
from marl_ppo.envs.spec import BatchedLayout, TeamSpec
from marl_ppo.eval.from_checkpoint import evaluate_checkpoint
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_run
from marl_ppo.run.resume import resume_config
from tests.helpers import ROOT

SPREAD_YAML = ROOT / "experiments/mpe/simple_spread.yaml"
NUM_ENVS = 4
TINY = [
    f"rollout.num_envs={NUM_ENVS}",
    "rollout.rollout_steps=25",
    "total_steps=100",
    "rollout.num_workers=2",
    "log.progress=false",
    "ppo.num_minibatches=2",
    "model.hidden_sizes=[16,16]",
]


class Counts:
    """Calls in this process of the env factory, `resolve_vector` and the team-layout reader, and their
    numbers when the run's first update starts (before its first env step)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = {"env copies": 0, "resolve_vector": 0, "team layouts": 0}
        self.at_first_update: dict[str, int] | None = None
        monkeypatch.setattr(factory, "make_env", self._counting("env copies", factory.make_env))
        monkeypatch.setattr(
            factory, "build_team_spec", self._counting("team layouts", factory.build_team_spec)
        )
        resolve = factory.resolve_vector
        counted = self._counting("resolve_vector", resolve)
        for module in list(sys.modules.values()):  # every module that imported the name
            if module.__name__.startswith("marl_ppo") and getattr(module, "resolve_vector", None) is resolve:
                monkeypatch.setattr(module, "resolve_vector", counted)
        one_update = loop._one_update

        def first_update(*args, **kwargs):
            if self.at_first_update is None:
                self.at_first_update = dict(self.calls)
            return one_update(*args, **kwargs)

        monkeypatch.setattr(loop, "_one_update", first_update)

    def _counting(self, name, function):
        @functools.wraps(function)
        def counted(*args, **kwargs):
            self.calls[name] += 1
            return function(*args, **kwargs)

        return counted


def _training_copies(run_dir) -> int:
    """Env copies training builds in this process: E for a synchronous run, none when workers hold them."""
    vector = yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["vector"]
    return NUM_ENVS if vector == "sync" else 0


@pytest.mark.parametrize(
    "vector",
    [
        "sync",
        "auto",
        "workers",
        "subprocess",
    ],
)
def test_a_run_builds_one_probe_copy_and_settles_vector_once(vector, tmp_path, monkeypatch):
    monkeypatch.setattr(factory, "usable_cores", lambda: 2)  # `auto` times the probe's steps
    counts = Counts(monkeypatch)
    loop.train(load_config(SPREAD_YAML, [*TINY, f"rollout.vector={vector}"]), tmp_path / "run")
    probes = 1
    assert counts.at_first_update == {
        "env copies": probes + _training_copies(tmp_path / "run"),
        "resolve_vector": 1,
        "team layouts": 1,
    }


def test_a_resumed_run_builds_one_probe_copy_too(tmp_path, monkeypatch):
    loop.train(load_config(SPREAD_YAML, [*TINY, "rollout.vector=sync"]), tmp_path / "run")
    config = resume_config(tmp_path / "run", ["total_steps=200"])
    counts = Counts(monkeypatch)
    result = loop.train(config, tmp_path / "run", resume=True)
    assert result.env_steps == 200
    assert counts.at_first_update == {"env copies": 1 + NUM_ENVS, "resolve_vector": 1, "team layouts": 1}


def test_the_plan_settles_every_auto_and_config_yaml_records_its_config(tmp_path):
    overrides = [
        *TINY,
        "rollout.vector=sync",
        "rollout.policy_lag=1",
        "model.precision=auto",
        "host.device=auto",
    ]
    config = load_config(SPREAD_YAML, overrides)
    assert (config.ppo.train_pi_iters, config.ppo.train_vf_iters, config.host.torch_threads) == ("auto",) * 3
    plan = plan_run(config)
    settled = plan.config
    assert (settled.rollout.vector, settled.rollout.policy_lag, settled.rollout.num_workers) == ("sync", 0, 2)
    assert settled.model.precision in ("fp32", "bf16")
    assert (settled.ppo.train_pi_iters, settled.ppo.train_vf_iters) == (10, 10)
    # where this process runs is settled beside the config, which keeps it as written
    assert (settled.host.device, settled.host.torch_threads) == ("auto", "auto")
    assert plan.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert (plan.threads, plan.build_threads, plan.convolutional) == (1, 1, False)
    assert isinstance(plan.layout, TeamSpec) and [g.name for g in plan.layout.groups] == ["agent"]
    assert plan.layout.groups[0].agents == ("agent_0", "agent_1", "agent_2")
    loop.train(config, tmp_path / "run")
    recorded = yaml.safe_load((tmp_path / "run/config.yaml").read_text())
    assert recorded == config_to_dict(settled)


def test_a_cnn_plan_runs_4_epochs_learns_on_every_core_and_builds_on_one(monkeypatch):
    monkeypatch.setattr(host, "usable_cores", lambda: 6)
    plan = plan_run(
        load_config(None, ["env.id=envs/pixel_signal_v0", "rollout.vector=sync", "rollout.num_envs=2"])
    )
    assert plan.convolutional
    assert (plan.config.ppo.train_pi_iters, plan.config.ppo.train_vf_iters) == (4, 4)
    assert (plan.threads, plan.build_threads) == (6, 1)


def test_a_batched_simulator_is_planned_without_a_probe_copy(monkeypatch):
    pytest.importorskip("vmas")
    counts = Counts(monkeypatch)
    plan = plan_run(
        load_config(None, ["env.id=vmas/navigation", "rollout.num_envs=4", "rollout.vector=auto"])
    )
    assert plan.layout == BatchedLayout() and plan.config.rollout.vector == "sync"
    assert counts.calls == {"env copies": 0, "resolve_vector": 1, "team layouts": 0}


def test_the_trainer_takes_the_plans_settled_ppo_whose_epochs_are_numbers():
    config = load_config(SPREAD_YAML, [*TINY, "ppo.train_vf_iters=3"])
    assert config.ppo.train_pi_iters == "auto" and not isinstance(config.ppo, SettledPPO)
    plan = plan_run(config)
    assert isinstance(plan.ppo, SettledPPO) and plan.config.ppo == plan.ppo
    assert (plan.ppo.train_pi_iters, plan.ppo.train_vf_iters) == (10, 3)
    # a settled config records the same keys and values as any other
    assert config_to_dict(plan.config)["ppo"] == {**config_to_dict(config)["ppo"], "train_pi_iters": 10}
    assert isinstance(plan.layout, TeamSpec)
    trainer = Trainer(TeamModel(plan.layout, plan.config), plan.ppo, generator=torch.Generator())
    assert trainer.ppo.train_vf_iters == 3


def test_an_evaluation_reads_its_layout_from_one_probe_copy_of_its_own(tmp_path, monkeypatch):
    loop.train(load_config(SPREAD_YAML, [*TINY, "rollout.vector=sync"]), tmp_path / "run")
    counts = Counts(monkeypatch)
    evaluate_checkpoint(tmp_path / "run", episodes=3)
    assert counts.calls == {"env copies": 1 + 3, "resolve_vector": 0, "team layouts": 1}
