"""FlatAdam computes what torch's per-parameter Adam and clip_grad_norm_ compute, and speaks its state dict."""

import copy
import math

import pytest
import torch
from torch import nn

from marl_ppo.fast.adam import FlatAdam


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3), nn.LayerNorm(3))


def _loss(net: nn.Module, step: int) -> torch.Tensor:
    x = torch.randn(11, 5, generator=torch.Generator().manual_seed(step))
    return (net(x) ** 2).sum() * (1.0 if step % 2 else 0.01)  # odd steps clip, even ones do not


def _reference_steps(
    net: nn.Module, optimizer: torch.optim.Adam, steps: range, max_norm: float
) -> list[float]:
    norms = []
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        _loss(net, step).backward()
        norms.append(float(nn.utils.clip_grad_norm_(net.parameters(), max_norm)))
        optimizer.step()
    return norms


def _flat_steps(net: nn.Module, optimizer: FlatAdam, steps: range, max_norm: float) -> list[float]:
    norms = []
    for step in steps:
        optimizer.zero_grad()
        _loss(net, step).backward()
        norms.append(float(optimizer.clip_grad_norm(max_norm)))
        optimizer.step()
    return norms


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)


def test_flat_adam_equals_per_parameter_adam_with_clipping():
    reference, flat = _net(), _net()
    reference_norms = _reference_steps(
        reference, torch.optim.Adam(reference.parameters(), lr=3e-3, eps=1e-5, foreach=True), range(8), 1.0
    )
    flat_norms = _flat_steps(flat, FlatAdam(flat.parameters(), lr=3e-3, eps=1e-5), range(8), 1.0)
    assert flat_norms == pytest.approx(reference_norms, rel=1e-5)
    assert max(reference_norms) > 1.0 > min(reference_norms)  # both branches of the clip ran
    _assert_same_weights(reference, flat)


def test_parameters_and_gradients_are_views_of_the_flat_buffers():
    net = _net()
    optimizer = FlatAdam(net.parameters(), lr=1e-3, eps=1e-5)
    _loss(net, 0).backward()
    offset = 0
    for p in net.parameters():
        n = p.numel()
        assert torch.equal(optimizer.data[offset : offset + n], p.detach().reshape(-1))
        assert torch.equal(optimizer.grad[offset : offset + n], p.grad.reshape(-1))
        assert p.grad.abs().sum() > 0
        offset += n
    assert offset == optimizer.data.numel()


def test_bind_recovers_dropped_gradients_and_replaced_weights():
    net = _net()
    optimizer = FlatAdam(net.parameters(), lr=1e-3, eps=1e-5)
    net.zero_grad(set_to_none=True)  # what a user's code might do between updates
    first = next(net.parameters())
    first.data = torch.full_like(first, 0.5)  # and a replaced tensor (e.g. module.to)
    optimizer.bind()
    assert torch.all(optimizer.data[: first.numel()] == 0.5)
    optimizer.zero_grad()
    _loss(net, 0).backward()
    assert optimizer.grad.abs().sum() > 0
    before = first.detach().clone()
    optimizer.step()
    assert not torch.equal(first.detach(), before)  # the step reached the module's own parameter


def test_state_dict_round_trips_through_torch_adam_both_ways():
    # a checkpoint written by torch.optim.Adam resumes in FlatAdam, and FlatAdam's resumes in torch's
    reference = _net()
    adam = torch.optim.Adam(reference.parameters(), lr=3e-3, eps=1e-5, foreach=True)
    _reference_steps(reference, adam, range(3), 1.0)
    flat = copy.deepcopy(reference)
    flat_adam = FlatAdam(flat.parameters(), lr=3e-3, eps=1e-5)
    flat_adam.load_state_dict(adam.state_dict())

    saved = flat_adam.state_dict()
    assert saved["param_groups"][0]["params"] == list(range(len(list(reference.parameters()))))
    for i, entry in adam.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(saved["state"][i][key], entry[key])

    _reference_steps(reference, adam, range(3, 6), 1.0)
    _flat_steps(flat, flat_adam, range(3, 6), 1.0)
    _assert_same_weights(reference, flat)

    back = copy.deepcopy(flat)
    back_adam = torch.optim.Adam(back.parameters(), lr=3e-3, eps=1e-5, foreach=True)
    back_adam.load_state_dict(flat_adam.state_dict())
    _reference_steps(back, back_adam, range(6, 8), 1.0)
    _flat_steps(flat, flat_adam, range(6, 8), 1.0)
    _assert_same_weights(back, flat)


def test_a_state_dict_for_another_model_is_refused_with_the_reason():
    net = _net()
    other = nn.Linear(5, 3)
    adam = torch.optim.Adam(other.parameters())
    with pytest.raises(ValueError, match="holds 2 parameters but the model has 6"):
        FlatAdam(net.parameters(), lr=1e-3, eps=1e-5).load_state_dict(adam.state_dict())


def test_a_model_converted_after_the_optimizer_was_built_is_named():
    net = _net()
    optimizer = FlatAdam(net.parameters(), lr=1e-3, eps=1e-5)
    net.double()
    with pytest.raises(RuntimeError, match="move the model before building the Trainer"):
        optimizer.bind()


def test_flat_adam_step_is_torch_adams_step_bit_for_bit():
    """The hand-written step does torch.optim.Adam's arithmetic in the same order: identical weights and state."""
    net = _net()
    ours = FlatAdam(net.parameters(), lr=1e-2, eps=1e-5)
    reference = copy.deepcopy(net)
    theirs = FlatAdam(reference.parameters(), lr=1e-2, eps=1e-5)
    for step in range(6):
        for model, optimizer, run in ((net, ours, ours.step), (reference, theirs, theirs.optimizer.step)):
            optimizer.zero_grad()
            _loss(model, step).backward()
            optimizer.clip_grad_norm(0.5)
            run()
    assert torch.equal(ours.data, theirs.data)
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(ours.optimizer.state[ours._flat][key], theirs.optimizer.state[theirs._flat][key])


@pytest.mark.parametrize("kind", ["flat_adam", "adam_foreach"])
def test_per_part_clipping_bounds_each_part_and_global_clipping_the_total(kind):
    """Two parts of two parameters each, gradient norms 3 and 0.5, max_norm 1.

    per part: the first is scaled to norm 1, the second (below the bound) left as it is;
    global: one norm sqrt(9 + 0.25) = 3.0414, both scaled by 1 / 3.0414 (norms 0.9864 and 0.1644).
    """
    from marl_ppo.algo.optim import make_optimizer

    def clipped(method: str) -> tuple[list[float], list[float]]:
        parts = [nn.Linear(4, 3), nn.Linear(2, 5)]
        params = [p for part in parts for p in part.parameters()]
        optimizer = make_optimizer(params, lr=1e-3, kind=kind, parts=[2, 2])
        optimizer.zero_grad()
        for part, norm in zip(parts, (3.0, 0.5), strict=True):
            size = sum(p.numel() for p in part.parameters())  # every element's gradient is norm / sqrt(size)
            (sum(p.sum() for p in part.parameters()) * (norm / math.sqrt(size))).backward()
        before = getattr(optimizer, method)(1.0)
        after = [float(nn.utils.get_total_norm([p.grad for p in part.parameters()])) for part in parts]
        return before.reshape(-1).tolist(), after

    before, after = clipped("clip_grad_norms")
    assert before == pytest.approx([3.0, 0.5], rel=1e-6)
    assert after == pytest.approx([1.0, 0.5], rel=1e-5)
    before, after = clipped("clip_grad_norm")
    total = math.sqrt(9.25)
    assert before == pytest.approx([total], rel=1e-6)
    assert after == pytest.approx([3.0 / total, 0.5 / total], rel=1e-5)


def test_parts_must_cover_the_parameters():
    with pytest.raises(ValueError, match=r"parts \[2, 3\] must be positive and add up to the 6 parameters"):
        FlatAdam(_net().parameters(), lr=1e-3, eps=1e-5, parts=[2, 3])
