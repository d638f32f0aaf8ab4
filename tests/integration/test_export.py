"""`marl-ppo export`: ONNX and TorchScript files that act as `marl-ppo eval --deterministic` does.

Each case trains a tiny run, evaluates it with the CLI, exports it in both formats and plays the same
seeds with the files: at every step the files' logits (means, for Box) agree with the networks'
within PARITY (1e-5) and their actions are the same, so the episodes' returns equal eval.json's.
"""

import json
from typing import Any

import numpy as np
import pytest
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import build_config, load_config
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.eval.evaluate import eval_config, eval_seed, play_episodes
from marl_ppo.export.runtime import FileActing, file_steps, read_sidecar
from marl_ppo.export.writer import float32_policy
from marl_ppo.plan.settle import plan_eval
from marl_ppo.rollout.stepper import PolicyActing, to_tensor
from marl_ppo.run.loop import train
from tests.helpers import ROOT

pytest.importorskip("onnxruntime")

PARITY = 1e-5
"""Largest difference allowed between an exported file's logits (or Box means) and the networks'."""

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
    "mlp": (ROOT / "experiments/mpe/simple_spread.yaml", ["rollout.rollout_steps=25", "total_steps=50"], 4),
    "gru": (ROOT / "experiments/envs/cue_recall.yaml", ["ppo.chunk_length=5", "model.recurrent_size=8"], 20),
    "lstm": (
        ROOT / "experiments/envs/cue_recall.yaml",
        ["ppo.chunk_length=5", "model.recurrent=lstm", "model.recurrent_size=8"],
        20,
    ),
    "masked": (None, ["env.id=envs/masked_guess_v0", "model.share_actor=true"], 4),
    "masked_multi": (None, ["env.id=envs/masked_guess_v0", "env.kwargs.multi=true"], 4),
    "cnn": (None, ["env.id=envs/pixel_signal_v0", "model.cnn_features=16"], 20),
    "box": (None, ["env.id=envs/mixed_actions_v0"], 4),
}
"""Per case: the experiment, its overrides and the evaluation's episodes (the GRU's 20 episodes of 5
steps on 2 env copies step each copy's carry 50 times, through 10 episode starts)."""


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    """(run dir, its `eval --deterministic` eval.json, {format: export dir}) of one case."""
    experiment, overrides, episodes = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    run_dir = root / "run"
    train(load_config(experiment, [*TINY, *overrides]), run_dir)
    assert (
        main(["eval", str(run_dir), "--deterministic", "--episodes", str(episodes), "--out", str(root)]) == 0
    )
    report = json.loads((root / "eval.json").read_text())
    directories = {}
    for fmt in ("onnx", "torchscript"):
        for sample in (False, True):
            key = f"{fmt}-sample" if sample else fmt
            directories[key] = root / key
            flags = ["--sample"] if sample else []
            assert (
                main(["export", str(run_dir), "--format", fmt, "--out", str(directories[key]), *flags]) == 0
            )
    return run_dir, report, directories


class Parity:
    """Acts with the exported files and, on the same inputs, with the networks as evaluation does;
    records the largest difference of their logits (or means) and every disagreement of actions."""

    def __init__(self, model, copies, files: FileActing, *, sample: bool = False) -> None:
        self.networks = PolicyActing(model, copies, torch.device("cpu"), deterministic=True)
        self.files, self.sample = files, sample
        self.largest = 0.0
        self.steps = 0
        self.disagreements = 0

    @torch.no_grad()
    def act(self, arrays):
        ours = self.files.act(arrays)
        groups = arrays.groups
        cpu = torch.device("cpu")
        obs = {name: to_tensor(group.obs, cpu) for name, group in groups.items()}
        masks = {name: to_tensor(group.action_mask, cpu) for name, group in groups.items()}
        alive = {name: to_tensor(group.alive, cpu) for name, group in groups.items()}
        dists = self.networks.memory.distributions(self.networks.policy, obs, masks, alive)
        for name, dist in dists.items():
            outputs = self.files.outputs[name]
            if "mean" in outputs:
                expected = _parts(dist)[0].mean[0].numpy()
                self.largest = max(self.largest, float(np.abs(outputs["mean"] - expected).max()))
            else:
                self._compare_logits(dist, outputs["logits"], masks[name].numpy())
            theirs, mine = dist.mode().numpy(), ours[name].numpy()
            if self.sample:
                theirs = _sampled(dist, self.files.inputs[name]["noise"], self.networks.policy, name)
            if mine.dtype == np.float32:  # Box: the mean itself, compared as the means are
                self.largest = max(self.largest, float(np.abs(mine - theirs).max()))
            else:
                self.disagreements += int((mine != theirs).sum())
        self.steps += 1
        return ours

    def _compare_logits(self, dist, logits, mask):
        # torch's Categorical holds log-probabilities: the files' logits, log-softmaxed per part
        offset = 0
        for part in _parts(dist):
            expected = part.logits[0].numpy()
            size = expected.shape[-1]
            mine = torch.log_softmax(torch.from_numpy(logits[..., offset : offset + size]), -1).numpy()
            allowed = mask[..., offset : offset + size] if mask.shape[-1] else np.ones_like(mine, bool)
            self.largest = max(self.largest, float(np.abs(mine - expected)[allowed].max()))
            offset += size

    def advance(self, arrays, episode_over):
        self.networks.advance(arrays, episode_over)
        self.files.advance(arrays, episode_over)


def _parts(dist) -> list[Any]:
    """The torch distributions behind an acting step's distribution (`FirstStep` of a `TorchDistribution`)."""
    return dist.dist.parts


def _sampled(dist, noise, view, name):
    """The networks' action for `noise` as the files sample: mean + std * noise (Box), else the
    Gumbel-max `argmax(log p - log(-log u))` per categorical."""
    parts = _parts(dist)
    if hasattr(parts[0], "base_dist"):  # Box: an Independent Normal
        return (parts[0].mean[0] + parts[0].stddev[0] * torch.from_numpy(noise)).numpy()
    actions, offset = [], 0
    for part in parts:
        size = part.logits.shape[-1]
        gumbel = -torch.log(-torch.log(torch.from_numpy(noise[..., offset : offset + size])))
        actions.append((part.logits[0] + gumbel).argmax(-1))
        offset += size
    return (actions[0] if len(actions) == 1 else torch.stack(actions, -1)).numpy()


def _play(run_dir, directory, episodes, *, check, sample=False):
    """The eval's seeds played by an export's files (with `check`, beside the networks)."""
    payload = load_checkpoint(run_dir / "checkpoints" / "final.pt")
    config, _, model = float32_policy(payload)
    plan = plan_eval(build_config(payload["config"]))
    venv = build_vector_env(eval_config(plan.config, episodes), plan.layout, torch.device("cpu"))
    sidecar = read_sidecar(directory)
    steps = file_steps(directory, sidecar)
    made = []

    def acting():
        files = FileActing(steps, sidecar, venv.num_envs)
        made.append(Parity(model, venv.num_envs, files, sample=sample) if check else files)
        return made[-1]

    try:
        result = play_episodes(
            venv, acting, torch.device("cpu"), episodes=episodes, seed=eval_seed(config), deterministic=True
        )
    finally:
        venv.close()
    return result, made[-1]


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_exported_files_act_as_deterministic_eval_does(exported, fmt):
    run_dir, report, directories = exported
    episodes = report["episodes"]
    result, parity = _play(run_dir, directories[fmt], episodes, check=True)
    assert parity.steps > 0 and parity.disagreements == 0
    assert parity.largest <= PARITY
    expected = np.array(report["per_episode"]["agent_returns"])
    boxes = [
        g for g in read_sidecar(directories[fmt])["groups"].values() if g["action_space"]["kind"] == "Box"
    ]
    if boxes:  # Box actions within PARITY of evaluation's: returns as close as the env's rewards make them
        np.testing.assert_allclose(result.agent_returns, expected, rtol=0, atol=1e-4)
    else:  # the same discrete actions: the same episodes
        np.testing.assert_array_equal(result.agent_returns, expected)
    np.testing.assert_array_equal(result.lengths, report["per_episode"]["length"])


def test_sampling_files_sample_as_the_networks_do_with_the_same_noise(exported):
    """Sampled actions from the same seeded noise: ONNX, TorchScript and the networks' distributions
    (Gumbel-max on their log-probabilities, mean + std * noise for Box) agree, episode after episode."""
    run_dir, report, directories = exported
    results = {}
    for fmt in ("onnx", "torchscript"):
        results[fmt], parity = _play(
            run_dir, directories[f"{fmt}-sample"], report["episodes"], check=True, sample=True
        )
        assert parity.steps > 0 and parity.disagreements == 0 and parity.largest <= PARITY
    np.testing.assert_allclose(results["onnx"].agent_returns, results["torchscript"].agent_returns, atol=1e-4)


def test_the_sidecar_names_every_group_its_agents_and_shapes(exported):
    run_dir, _, directories = exported
    sidecar = read_sidecar(directories["onnx"])
    payload = load_checkpoint(run_dir / "checkpoints" / "final.pt")
    assert sidecar["agents"] == payload["agents"]
    assert {name: g["agents"] for name, g in sidecar["groups"].items()} == payload["groups"]
    assert sidecar["precision"] == "float32" and sidecar["actions"] == "mode"
    for record in sidecar["groups"].values():
        assert record["inputs"]["obs"]["shape"][0] == "B"
        assert record["inputs"]["obs"]["shape"][1] == len(record["agents"])
        assert (directories["onnx"] / record["file"]).is_file()
        assert ("carry" in record["inputs"]) == (record["carry_size"] > 0)


def test_a_bfloat16_run_exports_float32_files_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    train(load_config(None, [*TINY, "env.id=envs/masked_guess_v0", "model.precision=bf16"]), run_dir)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "onnx")]) == 0
    sidecar = read_sidecar(tmp_path / "onnx")
    assert sidecar["precision"] == "float32" and sidecar["trained_precision"] == "bf16"
    import onnx

    graph = onnx.load(str(tmp_path / "onnx" / sidecar["groups"]["player"]["file"])).graph
    float_type = onnx.TensorProto.FLOAT
    assert {i.name: i.type.tensor_type.elem_type for i in graph.input}["obs"] == float_type
    assert {o.name: o.type.tensor_type.elem_type for o in graph.output}["logits"] == float_type


def test_a_directory_without_a_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: run directory") and "has no checkpoints/final.pt" in error
    assert "\n" not in error
