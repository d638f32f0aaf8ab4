"""Settings that do not apply to a batched simulator are refused, and a JAX env's compile is announced."""

from pathlib import Path

import pytest

from marl_ppo.config import ConfigError, load_config
from marl_ppo.plan.settle import plan_run
from marl_ppo.run.loop import _start_line


@pytest.mark.parametrize("vector", ["workers", "subprocess", "ray"])
def test_a_batched_simulator_refuses_a_vector_mode_it_would_ignore(vector):
    config = load_config(None, ["env.id=jaxmarl/smax_3m", f"rollout.vector={vector}"])
    with pytest.raises(ConfigError) as caught:
        plan_run(config)
    assert str(caught.value) == (
        f"rollout.vector={vector} does not apply to 'jaxmarl/smax_3m': a batched simulator steps every env "
        "copy at once in this process; drop rollout.vector or set rollout.vector=sync"
    )


def test_a_jax_envs_start_line_says_it_compiles_first_and_a_vmas_one_does_not():
    plan = plan_run(load_config(None, ["env.id=jaxmarl/smax_3m", "total_steps=1000"]))
    assert plan.config.rollout.vector == "sync"
    line = _start_line(plan, Path("runs/x"), None)
    assert line.endswith(
        "1000 env steps, logs and checkpoints in runs/x; JAX compiles the env first (a minute or so unless "
        "its compilation cache holds it)"
    )
    vmas = plan_run(load_config(None, ["env.id=vmas/navigation", "total_steps=1000"]))
    assert _start_line(vmas, Path("runs/x"), None).endswith("logs and checkpoints in runs/x")
