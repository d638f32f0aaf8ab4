"""`model.precision: bf16`: the layers compute in bfloat16, everything PPO reads stays float32."""

import copy
from typing import Any

import pytest
import torch
import yaml

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.sequences import policy as _policy
from marl_ppo.algo.trainer import Trainer
from marl_ppo.algo.turns import everyone
from marl_ppo.config import load_config
from marl_ppo.models import layers
from marl_ppo.models.layers import AgentMLP
from marl_ppo.run.loop import train
from tests.helpers import ROOT, common_twin, grad_of, values_of


def _pair(shared: bool, in_dim: int = 10) -> tuple[AgentMLP, AgentMLP]:
    """The same perturbed weights as an fp32 and a bf16 network."""
    torch.manual_seed(1)
    kwargs: dict[str, Any] = dict(
        num_agents=4, in_dim=in_dim, out_dim=3, hidden_sizes=(64, 64), activation="tanh"
    )
    net = AgentMLP(**kwargs, input_layer_norm=True, shared=shared, orthogonal_init=True, head_gain=1.0)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    half = copy.deepcopy(net)
    half.precision = "bf16"
    return net, half


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("common", [False, True])
def test_bf16_layers_return_float32_close_to_fp32_with_float32_gradients(shared, common):
    net, half = _pair(shared)
    x = torch.randn(256, 10) if common else torch.randn(256, 4, 10)
    weights = torch.randn(256, 4, 3)
    outputs = {}
    for name, model in (("fp32", net), ("bf16", half)):
        seen: list[torch.Tensor] = []
        hook = model.layers[1].register_forward_pre_hook(lambda module, args, seen=seen: seen.append(args[0]))
        out = common_twin(model)(x) if common else model(x)
        hook.remove()
        (out * weights).sum().backward()
        assert out.dtype == torch.float32
        assert seen[0].dtype == (torch.bfloat16 if name == "bf16" else torch.float32)  # activations
        assert all(p.dtype == torch.float32 and grad_of(p).dtype == torch.float32 for p in model.parameters())
        outputs[name] = out.detach()
    # bfloat16 keeps 8 significant bits: outputs of order 1 agree to about 1%
    torch.testing.assert_close(outputs["bf16"], outputs["fp32"], rtol=0.05, atol=0.05)
    for p, q in zip(net.parameters(), half.parameters(), strict=True):
        cosine = torch.nn.functional.cosine_similarity(grad_of(p).flatten(), grad_of(q).flatten(), dim=0)
        assert cosine > 0.99


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("critic", ["state", "team"])
def test_bf16_acting_and_learning_agree_so_every_first_ratio_is_one(critic, device):
    """Acting and the update's losses run the same bfloat16 layers on the same rows: before the first
    step every log-probability equals the one recorded while acting, and every value its `values_old`,
    so PPO's ratio starts at 1 and nothing is clipped for rounding. On a GPU bit for bit; a CPU acts
    with float32 products on bfloat16's grid (`models.acting.ActingMLP`), whose sums may run in another
    order than the update's bfloat16 products: there an entry may differ by one bfloat16 rounding."""
    pytest.importorskip("vmas")
    from marl_ppo.models.team import TeamModel
    from marl_ppo.rollout.buffer import RolloutBuffer
    from marl_ppo.rollout.collector import Collector
    from tests.helpers import vector_env

    overrides = [
        "env.id=vmas/navigation",
        "rollout.num_envs=64",
        "rollout.rollout_steps=20",
        f"ppo.critic={critic}",
    ]
    config = load_config(None, [*overrides, "model.precision=bf16"])
    where = torch.device(device)
    torch.manual_seed(0)
    venv = vector_env(config, where)
    model = TeamModel(venv.spec, config).to(where)
    buffer = RolloutBuffer(venv.spec, config.rollout.rollout_steps, config.rollout.copies, where)
    collector = Collector(venv, model, where)
    collector.start(0)
    rollout = collector.collect(buffer)
    batches = rollout_batches(buffer, rollout.last_values, gamma=0.99, lam=0.95)
    agents = batches["agent"]
    values = values_of(model, agents.state, {"agent": agents.obs})  # before an update moves the value norm
    _agree(values["agent"], agents.values_old, exact=device == "cuda")
    probe = Trainer(
        copy.deepcopy(model),
        config.ppo.settled(convolutional=False),
        generator=torch.Generator().manual_seed(0),
    )
    batch = probe.prepare(batches)["agent"]
    actor = model.group("agent").actor
    log_ratio = _policy(actor, batch).log_prob(batch.actions) - batch.logp_old
    _agree(batch.logp_old + log_ratio, batch.logp_old, exact=device == "cuda")
    _, _, diagnostics = probe._losses({"agent": batch}, everyone({"agent": batch}))
    assert diagnostics["agent"]["clipfrac"] == 0 and diagnostics["agent"]["kl"] < 1e-6
    stats = Trainer(
        model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    ).update(batches)
    assert stats.nonfinite_skips == 0 and 0 < stats.kl < 0.05


def _agree(ours, reference, *, exact):
    """Equal, or (`exact=False`) every entry within one bfloat16 rounding of the reference's and all
    but a few in a thousand equal."""
    if exact:
        assert torch.equal(ours, reference)
        return
    assert ((ours - reference).abs() <= reference.abs() * 2**-7 + 1e-6).all()  # bfloat16: 8 significant bits
    assert (ours == reference).float().mean() > 0.999


@pytest.mark.parametrize("native", [False, True])
def test_auto_precision_is_bf16_only_where_the_hardware_has_it_and_the_run_records_the_choice(
    native, monkeypatch, tmp_path, tiny_overrides
):
    monkeypatch.setattr(layers, "native_bf16", lambda device: native)
    chosen = "bf16" if native else "fp32"
    assert layers.resolve_precision("auto", torch.device("cpu")) == chosen
    assert layers.resolve_precision("fp32", torch.device("cpu")) == "fp32"  # explicit choices stand
    assert layers.resolve_precision("bf16", torch.device("cpu")) == "bf16"
    config = load_config(
        ROOT / "experiments/mpe/simple_spread.yaml", [*tiny_overrides, "model.precision=auto"]
    )
    train(config, tmp_path)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["precision"] == chosen
    model = torch.load(tmp_path / "checkpoints" / "final.pt", weights_only=False)
    assert model["config"]["model"]["precision"] == chosen


def test_native_bf16_answers_for_this_machine():
    """torch's probes exist in this torch, so `auto` is not silently fp32 on every CPU."""
    assert hasattr(torch.cpu, "_is_avx512_bf16_supported") and hasattr(torch.cpu, "_is_amx_tile_supported")
    assert isinstance(layers.native_bf16(torch.device("cpu")), bool)
    assert layers.native_bf16(torch.device("meta")) is False


@pytest.mark.parametrize("copies", [1, 2])
def test_bf16_cnn_reads_frames_as_bfloat16_and_returns_float32_close_to_fp32(copies):
    """uint8 frames enter the first convolution as bfloat16 (grey levels are exact there) with the 1/255
    scale in its filters; the features come back float32 and near the float32 network's, and every
    gradient is float32 and points the same way."""
    from marl_ppo.envs.layout import InputPart
    from marl_ppo.models.encoders import CnnShape, ImageEncoder

    part = InputPart(0, 36 * 36 * 3, shape=(36, 36, 3), frames=True)
    shape = CnnShape((16, 32), (8, 4), (4, 2), features=64, padding="valid")
    torch.manual_seed(0)
    net = ImageEncoder(part, copies=copies, cnn=shape)
    half = copy.deepcopy(net)
    half.precision = "bf16"
    frames = torch.randint(0, 256, (64, copies, part.size), dtype=torch.uint8)
    weights = torch.randn(64, copies, 64)
    outputs = {}
    for name, model in (("fp32", net), ("bf16", half)):
        seen: list[torch.Tensor] = []
        hook = model.convs[1].register_forward_pre_hook(lambda module, args, seen=seen: seen.append(args[0]))
        out = model(frames)
        hook.remove()
        (out * weights).sum().backward()
        assert out.dtype == torch.float32 and out.shape == (64, copies, 64)
        assert seen[0].dtype == (torch.bfloat16 if name == "bf16" else torch.float32)
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
        outputs[name] = out.detach()
    scale = outputs["fp32"].abs().max()
    torch.testing.assert_close(outputs["bf16"] / scale, outputs["fp32"] / scale, rtol=0, atol=0.03)
    for p, q in zip(net.parameters(), half.parameters(), strict=True):
        cosine = torch.nn.functional.cosine_similarity(grad_of(p).flatten(), grad_of(q).flatten(), dim=0)
        assert cosine > 0.99


def test_bf16_cnn_features_of_a_row_do_not_depend_on_the_rows_beside_it():
    """Acting evaluates frames in chunks of up to 1,024 rows, the update in minibatches: each row's
    bfloat16 features must be the same either way, or PPO's first ratio would not be 1."""
    from marl_ppo.envs.layout import InputPart
    from marl_ppo.models.encoders import CnnShape, ImageEncoder

    part = InputPart(0, 36 * 36 * 3, shape=(36, 36, 3), frames=True)
    torch.manual_seed(0)
    encoder = ImageEncoder(
        part, copies=1, cnn=CnnShape((16, 32), (8, 4), (4, 2), features=64, padding="valid")
    )
    encoder.precision = "bf16"
    frames = torch.randint(0, 256, (512, 1, part.size), dtype=torch.uint8)
    rows = torch.randperm(512, generator=torch.Generator().manual_seed(1))[:96]
    with torch.no_grad():
        whole = encoder(frames)
    assert torch.equal(whole[rows], encoder(frames[rows]).detach())
