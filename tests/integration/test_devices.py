"""The learner and the batched rollout on every available device: CPU always, CUDA where a GPU is present.

On a machine without a GPU the CUDA cases are skipped and the CPU cases check the same code paths (the
update is deterministic, a run trains, checkpoints and resumes, its checkpoint evaluates elsewhere).
With a GPU, the CUDA cases prove that one update on the GPU computes what it computes on the CPU, that
a VMAS rollout stays on the GPU, and that a GPU run's checkpoint resumes there and evaluates on the CPU.
"""

import copy
import json

import pytest
import torch

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.trainer import Trainer
from marl_ppo.config import load_config
from marl_ppo.eval.from_checkpoint import evaluate_checkpoint
from marl_ppo.run.loop import train
from tests.helpers import DEVICES, ROOT, collect_rollout, vector_env


def _batches_on(batches, device):
    def to(value):
        return value.to(device) if isinstance(value, torch.Tensor) else value

    return {
        group: type(b)(**{name: to(getattr(b, name)) for name in b.__dataclass_fields__})
        for group, b in batches.items()
    }


@pytest.mark.parametrize("device", DEVICES)
def test_one_update_on_the_device_computes_what_it_computes_on_the_cpu(spread_config, device):
    model, buffer, rollout = collect_rollout(spread_config)
    batches = rollout_batches(
        buffer, rollout.last_values, gamma=spread_config.ppo.gamma, lam=spread_config.ppo.gae_lambda
    )
    weights = {}
    for where in ("cpu", device):
        moved = copy.deepcopy(model).to(where)
        trainer = Trainer(
            moved, spread_config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(3)
        )
        stats = trainer.update(_batches_on(batches, where))
        assert stats.kl == pytest.approx(stats.kl) and stats.loss_v > 0  # finite
        weights[where] = {k: v.cpu() for k, v in moved.state_dict().items()}
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, weights["cpu"][k])]
    assert changed  # the update moved weights, so equal results below are not vacuous
    for name, value in weights["cpu"].items():
        # the same arithmetic in another order on the GPU: float32 rounding, amplified a little by Adam
        torch.testing.assert_close(weights[device][name], value, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_a_vmas_rollout_and_its_batches_stay_on_the_device(device):
    pytest.importorskip("vmas")
    from marl_ppo.models.team import TeamModel
    from marl_ppo.rollout.buffer import RolloutBuffer
    from marl_ppo.rollout.collector import Collector

    config = load_config(None, ["env.id=vmas/navigation", "env.kwargs={max_steps: 4}", "rollout.num_envs=8"])
    where = torch.device(device)
    venv = vector_env(config, where)
    model = TeamModel(venv.spec, config).to(where)
    buffer = RolloutBuffer(venv.spec, 6, config.rollout.copies, where)
    collector = Collector(venv, model, where)
    collector.start(0)
    result = collector.collect(buffer)
    assert result.env_steps == 48 and result.episodes  # 4-step episodes ended inside the rollout
    for storage in buffer.groups.values():
        for name, tensor in vars(storage).items():
            if isinstance(tensor, torch.Tensor):
                assert tensor.device.type == where.type, name
    batches = rollout_batches(buffer, result.last_values, gamma=0.99, lam=0.95)
    assert all(
        b.advantages.device.type == where.type and b.state.device.type == where.type for b in batches.values()
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("experiment", "env"),
    [
        pytest.param("experiments/mpe/simple_spread.yaml", ["rollout.vector=sync"], id="spread-sync"),
        pytest.param(
            "experiments/mpe/simple_spread.yaml",
            ["rollout.vector=workers", "rollout.num_workers=2", "rollout.policy_lag=1"],
            id="spread-workers",
        ),
        pytest.param(None, ["env.id=vmas/navigation", "env.kwargs={max_steps: 10}"], id="vmas"),
    ],
)
def test_a_run_on_the_device_trains_resumes_and_evaluates_on_the_cpu(
    tiny_overrides, tmp_path, device, experiment, env
):
    if experiment is None:
        pytest.importorskip("vmas")
    experiment = experiment and ROOT / experiment
    # 2 env copies x 10 steps = 20 env steps per update
    overrides = [
        *tiny_overrides,
        "rollout.rollout_steps=10",
        "log.checkpoint_every=1",
        f"host.device={device}",
        *env,
    ]
    first = train(load_config(experiment, [*overrides, "total_steps=40"]), tmp_path)
    assert (first.updates, first.env_steps) == (2, 40)
    resumed = train(load_config(experiment, [*overrides, "total_steps=80"]), tmp_path, resume=True)
    assert (resumed.updates, resumed.env_steps) == (4, 80)
    saved = torch.load(tmp_path / "checkpoints/final.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(v).all() for v in saved["model"].values() if v.is_floating_point())
    output = evaluate_checkpoint(tmp_path, episodes=2, overrides=["host.device=cpu"], out=tmp_path / "eval")
    assert json.loads(output.eval_json.read_text())["episodes"] == 2
