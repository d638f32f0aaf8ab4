"""The trainer's optimizers: torch's Adam on the code path `fast.optimizer` names, per-part gradient
clipping, and HAPPO's per-agent Adam over its rows of agent-stacked parameters."""

import math

import pytest
import torch
from torch import nn

from marl_ppo.algo.optim import clip_grad_norms, group_parts, make_agent_optimizer, make_optimizer
from tests.helpers import grad_of


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3), nn.LayerNorm(3))


def _loss(net: nn.Module, step: int) -> torch.Tensor:
    x = torch.randn(11, 5, generator=torch.Generator().manual_seed(step))
    return (net(x) ** 2).sum() * (1.0 if step % 2 else 0.01)  # odd steps clip, even ones do not


def _reference_steps(
    net: nn.Module, optimizer: torch.optim.Optimizer, steps: range, max_norm: float
) -> list[float]:
    norms = []
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        _loss(net, step).backward()
        norms.append(float(nn.utils.clip_grad_norm_(net.parameters(), max_norm)))
        optimizer.step()
    return norms


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", ["adam", "adam_foreach"])
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
            (torch.stack([p.sum() for p in part.parameters()]).sum() * (norm / math.sqrt(size))).backward()
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
    optimizer = make_optimizer(_net().parameters(), lr=1e-3, kind="adam")
    with pytest.raises(ValueError, match=r"parts \[2, 3\] must be positive and add up to the 6 parameters"):
        clip_grad_norms(optimizer, 1.0, parts=[2, 3])


@pytest.mark.parametrize("kind", ["adam", "adam_foreach", "adam_fused"])
def test_an_agents_adam_steps_its_rows_as_a_plain_adam_of_its_own(kind):
    """Three agents' weights stacked in each parameter, agent 1 and agent 2 stepping in turns with their
    own optimizers: each agent's rows are a plain Adam's (the same implementation) over a clone of
    them, bit for bit, and the rows
    of an agent that did not step never move, though its rows' gradients are zero in the others' steps."""
    torch.manual_seed(0)
    stacked = [nn.Parameter(torch.randn(3 * 4, 5)), nn.Parameter(torch.randn(3, 2))]
    start = [p.detach().clone() for p in stacked]
    agents = {i: make_agent_optimizer(stacked, agent=i, agents=3, lr=1e-2, kind=kind) for i in (1, 2)}
    clones = {i: [optimizer.rows(p).detach().clone() for p in stacked] for i, optimizer in agents.items()}
    # the same implementation over the clones: the fused kernel rounds a unit in the last place away
    # from the single-tensor one on some CPUs (seen on an AMD EPYC), so each is compared with its own
    foreach, fused = kind == "adam_foreach", kind == "adam_fused"
    plain = {i: torch.optim.Adam(clones[i], lr=1e-2, eps=1e-5, foreach=foreach, fused=fused) for i in agents}
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


def test_a_saved_state_resumes_on_the_loading_optimizers_own_code_path():
    """A state dict saved by one of torch's Adam implementations resumes in another: the moments and
    step count carry over, and the loader keeps its own code path (foreach, fused)."""
    saver_net, loader_net = _net(), _net()
    saver = make_optimizer(saver_net.parameters(), lr=1e-3, kind="adam_foreach")
    _reference_steps(saver_net, saver, range(3), 1.0)
    loader = make_optimizer(loader_net.parameters(), lr=1e-3, kind="adam")
    loader_net.load_state_dict(saver_net.state_dict())
    loader.load_state_dict(saver.state_dict())
    assert loader.param_groups[0]["foreach"] is False
    for p, q in zip(saver.param_groups[0]["params"], loader.param_groups[0]["params"], strict=True):
        assert torch.equal(saver.state[p]["exp_avg_sq"], loader.state[q]["exp_avg_sq"])
        assert float(loader.state[q]["step"]) == 3.0


def test_an_unknown_optimizer_is_refused_naming_the_choices():
    with pytest.raises(
        ValueError, match=r"unknown optimizer 'flat_adam'; expected one of adam, adam_foreach"
    ):
        make_optimizer(_net().parameters(), lr=1e-3, kind="flat_adam")
