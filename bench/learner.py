"""`python -m bench.learner`: one PPO update's time per minibatch step against its matrix products' time.

The update runs on a rollout-sized batch made here (random observations and advantages, the actions'
log-probabilities and values from the networks themselves, so the ratio starts at 1 as after a real
rollout), from the same weights and optimizer state in every repeat. The products are the update's
own: every matrix product it runs (forward and backward, the before/after diagnostics included) is
recorded once by torch's profiler with its shapes, then each is run alone as `torch.mm` / `torch.bmm`
of those shapes on contiguous tensors, in the same process. Both are timed in turn, on one torch
thread (as the learner beside a JAX env runs); medians and ranges over the repeats.

    python -m bench.learner [--repeats N] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SPREAD_YAML = ROOT / "experiments" / "mpe" / "simple_spread.yaml"

CASES: dict[str, tuple[Path, list[str]]] = {
    # JaxMARL's IPPO-FF settings on MPE simple_spread (3 agents, 18 observations, 5 actions): 16 copies x
    # 128 steps, 4 epochs of 4 minibatches of 512 env steps (1,536 agent rows), a 64-wide tanh MLP
    "learner_update_64": (
        SPREAD_YAML,
        [
            "rollout.num_envs=16",
            "rollout.rollout_steps=128",
            "ppo.critic=obs",
            "model.share_actor=true",
            "model.hidden_sizes=[64,64]",
            "ppo.train_pi_iters=4",
            "ppo.train_vf_iters=4",
            "ppo.num_minibatches=4",
        ],
    ),
    # the default experiment: 32 copies x 25 steps, a critic on the global state
    "learner_update_default": (SPREAD_YAML, []),
}
"""Name -> experiment file and overrides."""
CASES["learner_update_64_jax"] = CASES["learner_update_64"]

JAX_CASES = {"learner_update_64_jax"}
"""Cases whose update runs in the JAX learner (`fast.learner: jax`, `algo.jax_trainer`); their products
are those torch's update of the same batch runs (the profiler does not see inside XLA's program), the
same arithmetic. XLA runs on one thread for them, as the products and torch's update do."""

ONE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
"""XLA_FLAGS that keep XLA's CPU programs on one thread (read when JAX starts its CPU backend)."""

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
"""The profiler's names of the matrix products an update runs."""


@dataclass(frozen=True)
class Product:
    """One matrix product of the update: `(batch, m, k) @ (batch, k, n)` (batch 1: a plain `mm`)."""

    batch: int
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations."""
        return 2 * self.batch * self.m * self.k * self.n


def _product(name: str, shapes: list[list[int]]) -> Product:
    """The product an op of the profiler ran, from its input shapes (`addmm`/`baddbmm` lead with the bias)."""
    a, b = shapes[1:3] if name in ("aten::addmm", "aten::baddbmm") else shapes[:2]
    if len(a) == 3:
        return Product(a[0], a[1], a[2], b[2])
    return Product(1, a[0], a[1], b[1])


@dataclass
class Setup:
    """A trainer, its batch and the state every repeat starts from."""

    trainer: Any
    batches: dict[str, Any]
    start: tuple[dict[str, Any], dict[str, Any]]

    def reset(self) -> None:
        """Back to the start state: weights, optimizer moments, the minibatch generator."""
        self.trainer.model.load_state_dict(self.start[0])
        self.trainer.load_state_dict(self.start[1])

    def update(self) -> Any:
        """One update from the state it is in; its statistics."""
        return self.trainer.update(self.batches)


def setup(experiment: Path, overrides: list[str], seed: int = 0, *, learner: str = "torch") -> Setup:
    """The experiment's trainer (settled as a run settles it, feed-forward networks; `learner` jax: the
    JAX learner on the same networks) and a batch of its rollout's size."""
    import copy

    from marl_ppo.algo.trainer import Trainer

    trainer_class = Trainer
    if learner == "jax":
        from marl_ppo.algo.jax_trainer import JaxTrainer

        trainer_class = JaxTrainer
    from marl_ppo.config import load_config
    from marl_ppo.envs.spec import TeamSpec
    from marl_ppo.models.team import TeamModel
    from marl_ppo.plan.settle import plan_eval

    plan = plan_eval(load_config(experiment, [*overrides, f"seed={seed}", "log.progress=false"]))
    config, spec = plan.config, plan.layout
    assert isinstance(spec, TeamSpec), "a batched simulator's team is known once it is built"
    torch.manual_seed(seed)
    model = TeamModel(spec, config)
    if model.recurrent:
        raise ValueError("bench.learner makes batches for feed-forward networks; drop model.recurrent")
    generator = torch.Generator().manual_seed(seed)
    trainer = trainer_class(model, plan.ppo, generator=generator, optimizer=config.fast.optimizer)
    steps = config.rollout.rollout_steps
    state = torch.randn(steps * config.rollout.copies, spec.state_dim)
    batches = {group.name: _group_batch(model, group, state, steps) for group in spec.groups}
    start = (copy.deepcopy(model.state_dict()), copy.deepcopy(trainer.state_dict()))
    return Setup(trainer, batches, start)


def _group_batch(model: Any, group: Any, state: torch.Tensor, steps: int) -> Any:
    """A group's batch of random observations and advantages, with the actions, log-probabilities and
    values of its networks as they are (every agent alive, no episode starts)."""
    from marl_ppo.algo.batch import AgentBatch

    rows, agents = state.shape[0], group.num_agents
    actor, critic, _ = model.group(group.name)
    obs = torch.randn(rows, agents, group.obs_dim)
    if group.obs_dtype == np.uint8:  # frames as the buffer stores them
        obs = torch.randint(0, 256, obs.shape, dtype=torch.uint8)
    empty = torch.zeros(rows, agents, 0)
    first = torch.zeros(rows, agents, dtype=torch.bool)
    acted = torch.ones(rows, agents, dtype=torch.bool)
    with torch.no_grad():  # the acting policy is the current one, as after a rollout
        masks = torch.zeros(1, rows, agents, 0)
        dist, _ = actor(obs.unsqueeze(0), masks, empty, first[None], acted[None])
        actions = dist.sample()
        values = critic(state.unsqueeze(0), obs.unsqueeze(0), empty, first[None], acted[None])[0][0]
    advantages = torch.randn(rows, agents)
    return AgentBatch(
        steps=steps,
        obs=obs,
        state=state,
        action_mask=torch.zeros(rows, agents, 0, dtype=torch.bool),
        actions=actions[0],
        logp_old=dist.log_prob(actions)[0],
        values_old=values,
        advantages=advantages,
        returns=advantages + values,
        alive=acted.clone(),
        is_first=first,
        acted=acted,
        actor_carry=empty,
        critic_carry=torch.zeros(rows, critic.carry_rows, 0),
    )


def recorded_products(update: Callable[[], Any]) -> list[Product]:
    """Every matrix product one call of `update` runs, forward and backward, with its shapes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        update()
    return [_product(event.name, event.input_shapes) for event in prof.events() if event.name in PRODUCTS]


def products_body(products: list[Product]) -> Callable[[], None]:
    """A timed body running each product alone on contiguous operands (made once, beforehand)."""
    operands = []
    for p in products:
        if p.batch == 1:
            operands.append((torch.mm, torch.randn(p.m, p.k), torch.randn(p.k, p.n)))
        else:
            operands.append((torch.bmm, torch.randn(p.batch, p.m, p.k), torch.randn(p.batch, p.k, p.n)))

    def run() -> None:
        for op, a, b in operands:
            op(a, b)

    return run


@dataclass(frozen=True)
class Measured:
    """A case's medians and ranges per minibatch step."""

    name: str
    steps: int
    flops: int
    update_ms: list[float]
    products_ms: list[float]

    def ratios(self) -> list[float]:
        """Update over products, per repeat (the two timed one after the other)."""
        return [u / p for u, p in zip(self.update_ms, self.products_ms, strict=True)]

    def line(self) -> str:
        """The case's line of the report."""
        update, products, ratios = self.update_ms, self.products_ms, self.ratios()
        gflops = self.flops / self.steps / (statistics.median(products) * 1e-3) / 1e9
        return (
            f"{self.name:24s} {self.steps:5d} {statistics.median(update):8.2f} ({min(update):.2f}-{max(update):.2f}) "
            f"{statistics.median(products):8.2f} ({min(products):.2f}-{max(products):.2f}) "
            f"{self.flops / self.steps / 1e6:8.1f} {gflops:6.1f} "
            f"{statistics.median(ratios):6.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        )


HEADER = (
    f"{'case':24s} {'steps':>5s} {'update ms/step (range)':>22s} {'products ms/step (range)':>24s} "
    f"{'MFLOP/step':>10s} {'GFLOP/s':>7s} {'ratio (range)':>15s}"
)


REPEATS = 7
"""Timings of each (update, products) by default: the case's line in `make bench` takes under 30 s."""


def measure(name: str, repeats: int = REPEATS) -> Measured:
    """Time the case's update and its products in turn, `repeats` times each, after one warm-up of
    each, on one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(name, repeats)
    finally:
        torch.set_num_threads(threads)


def _measure(name: str, repeats: int) -> Measured:
    experiment, overrides = CASES[name]
    if name in JAX_CASES:
        _one_thread_xla()
    case = setup(experiment, overrides, learner="jax" if name in JAX_CASES else "torch")
    case.reset()
    steps = case.update().pi_steps  # warm-up (the JAX learner compiles here); the same steps every repeat
    case.reset()
    products = recorded_products(setup(experiment, overrides).update if name in JAX_CASES else case.update)
    run_products = products_body(products)
    run_products()
    update_ms: list[float] = []
    products_ms: list[float] = []
    for k in range(repeats):
        for which, body in (("update", case.update), ("products", run_products))[:: 1 if k % 2 == 0 else -1]:
            case.reset()
            started = time.perf_counter()
            body()
            elapsed = (time.perf_counter() - started) * 1e3 / steps
            (update_ms if which == "update" else products_ms).append(elapsed)
    return Measured(name, steps, sum(p.flops for p in products), update_ms, products_ms)


def _one_thread_xla() -> None:
    """Keep XLA's CPU programs on one thread (ONE_THREAD_XLA), or say why they are not: the flags are
    read once, when JAX starts its backend."""
    import os

    if ONE_THREAD_XLA in os.environ.get("XLA_FLAGS", ""):
        return
    if "jax" in sys.modules:
        print(
            "note: JAX started before the JAX learner's case, so XLA may use every core; run "
            "`python -m bench.learner --only learner_update_64_jax` for its one-thread figure",
            flush=True,
        )
        return
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {ONE_THREAD_XLA}".strip()


def main(argv: list[str] | None = None) -> int:
    """Print one line per case: update and products per minibatch step, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--only", nargs="*", help=f"cases to run, of {', '.join(CASES)} (default: all)")
    options = parser.parse_args(argv)
    unknown = [name for name in options.only or [] if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    print(HEADER)
    for name in options.only or list(CASES):
        print(measure(name, options.repeats).line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
