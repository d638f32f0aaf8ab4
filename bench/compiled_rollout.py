"""`python -m bench.compiled_rollout`: one rollout of a JaxMARL env compiled as a `lax.scan` against the
collector's per-step path, in one process.

The per-step path is `Collector.collect` into a `RolloutBuffer` (a Python loop: the policy's torch
forward, `JaxVectorEnv.step`, the buffer's writes). The compiled path is `CompiledRollout.run` from
the weights read into JAX (`JaxPolicy.params`), then its records denormalized and copied into a
buffer of the same shape. Each path has its own copies of the env, from the same seed, and the two
alternate; the compile (first call) is timed apart. Medians and ranges over the repeats.

    python -m bench.compiled_rollout [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from marl_ppo.config import load_config
from marl_ppo.envs.factory import build_vector_env, probe_layout
from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.copies import settle_copies
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.jax_policy import JaxPolicy
from marl_ppo.rollout.jax_scan import CompiledRollout

ISSUE_SETTINGS = [
    # JaxMARL's IPPO-FF settings on its MPE simple_spread: 16 copies x 128 steps, a 64-wide tanh MLP
    "env.id=jaxmarl/mpe_simple_spread_v3",
    "rollout.num_envs=16",
    "rollout.rollout_steps=128",
    "ppo.critic=obs",
    "model.share_actor=true",
    "model.hidden_sizes=[64,64]",
]


def _store(records: dict[str, Any], model: TeamModel, buffer: RolloutBuffer) -> None:
    """The compiled rollout's records written into `buffer` as the collector writes its steps."""
    buffer.state.copy_(records["state"])
    buffer.episode_over.copy_(records["episode_over"])
    for name, storage in buffer.groups.items():
        group, norm = records["groups"][name], model.group(name).value_norm
        storage.values.copy_(norm.denormalize(group["values"]))
        storage.final_values.copy_(norm.denormalize(group["final_values"]))
        for field in ("obs", "actions", "logp", "rewards", "terminated", "truncated", "action_mask"):
            getattr(storage, field).copy_(group[field])
        storage.alive.fill_(True)


def main(argv: list[str] | None = None) -> None:
    """Time both paths in turn and print one line each, and their ratio."""
    parser = argparse.ArgumentParser(prog="python -m bench.compiled_rollout")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    import jax

    torch.set_num_threads(1)  # the learner's one thread beside JAX
    config = settle_copies(load_config(None, ISSUE_SETTINGS))
    layout = probe_layout(config)
    per_step_env, compiled_env = build_vector_env(config, layout), build_vector_env(config, layout)
    model = TeamModel(per_step_env.spec, config)
    steps, copies = config.rollout.rollout_steps, config.rollout.copies
    collector = Collector(per_step_env, model, torch.device("cpu"))
    collector.start(0)
    buffers = RolloutBuffer(per_step_env.spec, steps, copies), RolloutBuffer(per_step_env.spec, steps, copies)
    policy = JaxPolicy(model)
    assert isinstance(compiled_env, JaxVectorEnv)
    rollout = CompiledRollout(compiled_env, policy, steps)
    compiled_env.reset(0)
    key = jax.random.PRNGKey(0)
    start = time.perf_counter()
    _store(rollout.run(policy.params(), key), model, buffers[1])
    compile_s = time.perf_counter() - start
    per_step, compiled = [], []
    for _ in range(args.repeats):
        buffers[0].reset()
        start = time.perf_counter()
        collector.collect(buffers[0])
        per_step.append(time.perf_counter() - start)
        start = time.perf_counter()
        key, draw = jax.random.split(key)
        _store(rollout.run(policy.params(), draw), model, buffers[1])
        compiled.append(time.perf_counter() - start)
    env_steps = steps * copies
    for label, times in (("per-step collector", per_step), ("compiled scan", compiled)):
        median = statistics.median(times)
        print(
            f"{label:>19}: {median * 1e3:7.1f} ms per rollout ({min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}), "
            f"{env_steps / median:,.0f} env steps/s"
        )
    ratios = sorted(a / b for a, b in zip(per_step, compiled, strict=True))
    print(
        f"ratio {statistics.median(ratios):.1f} ({ratios[0]:.1f}-{ratios[-1]:.1f}); "
        f"first compiled call (compile or cache load) {compile_s:.2f} s"
    )


if __name__ == "__main__":
    main()
