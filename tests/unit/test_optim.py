"""FlatAdam is a torch.optim.Adam: it computes what torch's per-parameter Adam and clip_grad_norm_ compute, and
speaks its state dict."""

import copy
import math
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from marl_ppo.algo.optim import clip_grad_norms, group_parts, make_agent_optimizer, make_optimizer
from marl_ppo.fast.adam import FlatAdam, missing_torch_internals
from tests.helpers import grad_of


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


def test_flat_adam_is_a_torch_adam_with_its_param_groups():
    net = _net()
    optimizer = FlatAdam(net.parameters(), lr=1e-3, eps=1e-5)
    reference = torch.optim.Adam(_net().parameters(), lr=1e-3, eps=1e-5, foreach=False)
    assert isinstance(optimizer, torch.optim.Optimizer)
    ours, theirs = optimizer.param_groups, reference.param_groups
    assert len(ours) == 1 and {k: v for k, v in ours[0].items() if k != "params"} == {
        k: v for k, v in theirs[0].items() if k != "params"
    }
    assert ours[0]["params"] == list(net.parameters())
    assert optimizer.state_dict() == {"state": {}, "param_groups": reference.state_dict()["param_groups"]}


def test_step_hooks_and_the_profiler_see_a_flat_step_as_any_optimizers_step():
    hooked, plain = _net(), _net()
    calls: list[str] = []
    optimizer = FlatAdam(hooked.parameters(), lr=3e-3, eps=1e-5)
    optimizer.register_step_pre_hook(lambda *_: calls.append("pre"))
    post = register_optimizer_step_post_hook(lambda *_: calls.append("global post"))
    try:
        _flat_steps(hooked, optimizer, range(2), 1.0)
    finally:
        post.remove()
    assert calls == ["pre", "global post"] * 2
    with torch.profiler.profile() as profile:
        _flat_steps(plain, FlatAdam(plain.parameters(), lr=3e-3, eps=1e-5), range(2), 1.0)
    assert [e.count for e in profile.key_averages() if e.key == "Optimizer.step#FlatAdam.step"] == [2]
    _assert_same_weights(hooked, plain)  # the same steps, with or without hooks and profiler


def test_parameters_and_gradients_are_views_of_the_flat_buffers():
    net = _net()
    optimizer = FlatAdam(net.parameters(), lr=1e-3, eps=1e-5)
    _loss(net, 0).backward()
    offset = 0
    for p in net.parameters():
        n = p.numel()
        assert p.data_ptr() == optimizer.flat_data[offset:].data_ptr()
        assert torch.equal(optimizer.flat_grad[offset : offset + n], grad_of(p).reshape(-1))
        assert grad_of(p).abs().sum() > 0
        offset += n
    assert offset == optimizer.flat_data.numel() == 7 * 5 + 7 + 3 * 7 + 3 + 3 + 3


def test_replaced_weights_and_gradients_are_gathered_at_the_next_step():
    """Code outside that drops the gradients or replaces a weight tensor steps as with torch's Adam."""
    nets = {"flat": _net(), "torch": _net()}
    optimizers = {
        "flat": FlatAdam(nets["flat"].parameters(), lr=1e-3, eps=1e-5),
        "torch": torch.optim.Adam(nets["torch"].parameters(), lr=1e-3, eps=1e-5, foreach=False),
    }
    for name, net in nets.items():
        first = next(net.parameters())
        first.data = torch.full_like(first, 0.5)  # a replaced tensor (what module.to() does)
        net.zero_grad(set_to_none=True)  # dropped gradients: backward makes new tensors
        _loss(net, 0).backward()
        optimizers[name].step()
    flat = optimizers["flat"]
    assert isinstance(flat, FlatAdam)
    assert next(nets["flat"].parameters()).data_ptr() == flat.flat_data.data_ptr()
    for p in nets["flat"].parameters():
        assert grad_of(p).data_ptr() >= flat.flat_grad.data_ptr()  # a view of the flat gradient again
    for ours, theirs in zip(nets["flat"].parameters(), nets["torch"].parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_a_weight_replaced_after_a_clip_and_zero_grad_is_gathered_at_the_step():
    """The step skips its own check only right after a clip; `zero_grad` ends that, so a tensor replaced
    between a skipped step (clip, zero_grad) and the next step without a clip is still gathered."""
    net = _net()
    optimizer = FlatAdam(net.parameters(), lr=1e-3, eps=1e-5)
    _loss(net, 0).backward()
    optimizer.clip_grad_norm(1.0)
    optimizer.zero_grad()  # a step dropped after its clip, as the trainer does for a non-finite loss
    first = next(net.parameters())
    first.data = torch.full_like(first, 0.5)
    reference = _net()
    next(reference.parameters()).data = torch.full_like(first, 0.5)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-3, eps=1e-5, foreach=False)
    for model, opt in ((net, optimizer), (reference, reference_optimizer)):
        _loss(model, 1).backward()
        opt.step()
    assert next(net.parameters()).data_ptr() == optimizer.flat_data.data_ptr()
    for ours, theirs in zip(net.parameters(), reference.parameters(), strict=True):
        assert torch.equal(ours, theirs)


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
    with pytest.raises(ValueError, match=r"holds 2 parameters in 1 group\(s\) but the model has 6"):
        FlatAdam(net.parameters(), lr=1e-3, eps=1e-5).load_state_dict(adam.state_dict())


def test_a_model_converted_after_the_optimizer_was_built_is_named():
    net = _net()
    optimizer = FlatAdam(net.parameters(), lr=1e-3, eps=1e-5)
    net.double()
    with pytest.raises(RuntimeError, match="move the model before building the optimizer"):
        optimizer.step()


def test_flat_adam_step_is_torch_adams_step_bit_for_bit():
    """The hand-written step does torch.optim.Adam's single-tensor arithmetic in the same order, element
    for element: identical weights and state, through a learning-rate change as the trainer makes one."""
    net = _net()
    ours = FlatAdam(net.parameters(), lr=1e-2, eps=1e-5)
    reference = copy.deepcopy(net)
    theirs = torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    for step in range(6):
        for optimizer in (ours, theirs):
            optimizer.param_groups[0]["lr"] = 1e-2 / (step + 1)
        for model, optimizer in ((net, ours), (reference, theirs)):
            optimizer.zero_grad()
            _loss(model, step).backward()
            optimizer.step()
    for a, b in zip(net.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
    for (i, state), reference_state in zip(
        ours.state_dict()["state"].items(), theirs.state_dict()["state"].values(), strict=True
    ):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[key], reference_state[key]), (i, key)


@pytest.mark.parametrize("kind", ["flat_adam", "adam_foreach"])
def test_per_part_clipping_bounds_each_part_and_global_clipping_the_total(kind):
    """Two parts of two parameters each, gradient norms 3 and 0.5, max_norm 1.

    per part: the first is scaled to norm 1, the second (below the bound) left as it is;
    global: one norm sqrt(9 + 0.25) = 3.0414, both scaled by 1 / 3.0414 (norms 0.9864 and 0.1644).
    """

    def clipped(counts: list[int]) -> tuple[list[float], list[float]]:
        parts = [nn.Linear(4, 3), nn.Linear(2, 5)]
        params = [p for part in parts for p in part.parameters()]
        optimizer = make_optimizer(params, lr=1e-3, kind=kind)
        optimizer.zero_grad()
        for part, norm in zip(parts, (3.0, 0.5), strict=True):
            size = sum(p.numel() for p in part.parameters())  # every element's gradient is norm / sqrt(size)
            (sum(p.sum() for p in part.parameters()) * (norm / math.sqrt(size))).backward()  # type: ignore[union-attr]  # a sum of tensors
        before = clip_grad_norms(optimizer, 1.0, parts=counts)
        after = [float(nn.utils.get_total_norm([grad_of(p) for p in part.parameters()])) for part in parts]
        return before.reshape(-1).tolist(), after

    before, after = clipped([2, 2])
    assert before == pytest.approx([3.0, 0.5], rel=1e-6)
    assert after == pytest.approx([1.0, 0.5], rel=1e-5)
    before, after = clipped([])
    total = math.sqrt(9.25)
    assert before == pytest.approx([total], rel=1e-6)
    assert after == pytest.approx([3.0 / total, 0.5 / total], rel=1e-5)


def test_parts_must_cover_the_parameters():
    optimizer = FlatAdam(_net().parameters(), lr=1e-3, eps=1e-5)
    with pytest.raises(ValueError, match=r"parts \[2, 3\] must be positive and add up to the 6 parameters"):
        clip_grad_norms(optimizer, 1.0, parts=[2, 3])


def test_flat_adam_finds_the_torch_internals_its_step_reads():
    """FlatAdam's step skips torch's step wrapper by reading private torch names; a torch that renames one
    makes FlatAdam keep the wrapper (slower, same numbers): this names what to update in fast/adam.py."""
    missing = missing_torch_internals()
    assert not missing, f"torch {torch.__version__} lacks {missing}; FlatAdam keeps torch's step wrapper"
    step = FlatAdam.__dict__["step"]
    FlatAdam(_net().parameters(), lr=1e-3, eps=1e-5)
    assert FlatAdam.__dict__["step"] is step, "torch re-wrapped FlatAdam.step: it no longer reads `hooked`"


_WITHOUT_INTERNALS = """
import importlib, torch
internals = importlib.import_module("torch.optim.optimizer")
hooks = internals._global_optimizer_pre_hooks
del internals._global_optimizer_pre_hooks  # as FlatAdam finds a torch that renamed it
from marl_ppo.fast import adam
internals._global_optimizer_pre_hooks = hooks  # torch's own wrapper reads it
assert adam._HOOKED_FLAT_STEP is None and not hasattr(adam.FlatAdam.step, "hooked")
torch.manual_seed(0)
nets = [torch.nn.Linear(3, 2) for _ in range(2)]
nets[1].load_state_dict(nets[0].state_dict())
flat = adam.FlatAdam(nets[0].parameters(), lr=1e-2, eps=1e-5)
calls = []
flat.register_step_pre_hook(lambda *_: calls.append("pre"))
plain = torch.optim.Adam(nets[1].parameters(), lr=1e-2, eps=1e-5, foreach=False)
for optimizer, net in ((flat, nets[0]), (plain, nets[1])):
    for step in range(3):
        optimizer.zero_grad()
        net(torch.ones(4, 3) * step).pow(2).sum().backward()
        optimizer.step()
with torch.profiler.profile() as profile:
    flat.step()
events = [e.count for e in profile.key_averages() if e.key == "Optimizer.step#FlatAdam.step"]
plain.step()
assert calls == ["pre"] * 4 and events == [1], (calls, events)
assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters()))
"""


def test_without_the_torch_internals_flat_adam_steps_through_torchs_wrapper():
    """On a torch without one of the names, torch wraps FlatAdam's step as any optimizer's: hooks run
    once per step, the profiler sees it, the numbers are torch's Adam's."""
    result = subprocess.run([sys.executable, "-c", _WITHOUT_INTERNALS], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("kind", ["flat_adam", "adam", "adam_foreach", "adam_fused"])
def test_an_agents_adam_steps_its_rows_as_a_plain_adam_of_its_own(kind):
    """Three agents' weights stacked in each parameter, agent 1 and agent 2 stepping in turns with their
    own optimizers: each agent's rows are a plain Adam's over a clone of them, bit for bit, and the rows
    of an agent that did not step never move, though its rows' gradients are zero in the others' steps."""
    torch.manual_seed(0)
    stacked = [nn.Parameter(torch.randn(3 * 4, 5)), nn.Parameter(torch.randn(3, 2))]
    start = [p.detach().clone() for p in stacked]
    agents = {i: make_agent_optimizer(stacked, agent=i, agents=3, lr=1e-2, kind=kind) for i in (1, 2)}
    clones = {i: [optimizer.rows(p).detach().clone() for p in stacked] for i, optimizer in agents.items()}
    plain = {i: torch.optim.Adam(clones[i], lr=1e-2, eps=1e-5, foreach=False) for i in agents}
    for step in range(6):
        agent = 1 + step % 2
        optimizer = agents[agent]
        optimizer.zero_grad()
        grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(step)) for p in stacked]
        for p, grad in zip(stacked, grads, strict=True):
            p.grad = torch.zeros_like(p)
            optimizer.rows(p.grad).copy_(optimizer.rows(grad))
        for clone, grad in zip(clones[agent], grads, strict=True):
            clone.grad = optimizer.rows(grad).clone()
        optimizer.step()
        plain[agent].step()
    for agent, optimizer in agents.items():
        for p, clone in zip(stacked, clones[agent], strict=True):
            assert torch.equal(optimizer.rows(p), clone)
            assert optimizer.state[p]["exp_avg"].shape == clone.shape
            assert float(optimizer.state[p]["step"]) == 3.0
    for p, before in zip(stacked, start, strict=True):
        assert torch.equal(p.detach()[: p.shape[0] // 3], before[: p.shape[0] // 3])  # agent 0's rows


def test_an_agents_adam_refuses_a_parameter_that_does_not_stack_its_agents():
    with pytest.raises(ValueError, match=r"parameter of shape \(4, 5\) does not stack 3 agents"):
        make_agent_optimizer([nn.Parameter(torch.zeros(4, 5))], agent=0, agents=3, lr=1e-3, kind="adam")


def test_per_group_parts_are_the_runs_of_each_groups_parameters_in_the_optimizer():
    groups = nn.ModuleList([nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))])
    assert group_parts(make_optimizer(groups.parameters(), lr=1e-3, kind="adam"), groups) == [2, 4]
    second = make_agent_optimizer(groups[1].parameters(), agent=0, agents=1, lr=1e-3, kind="adam")
    assert group_parts(second, groups) == [4]  # a group holding none of its parameters has no part
    first, *rest = groups[1].parameters()
    shuffled = [first, *groups[0].parameters(), *rest]  # group 1's parameters on both sides of group 0's
    with pytest.raises(ValueError, match="not ordered group by group"):
        group_parts(torch.optim.Adam(shuffled), groups)
    with pytest.raises(ValueError, match="none of the groups' networks"):
        group_parts(torch.optim.Adam(nn.Linear(1, 1).parameters()), groups)
