"""Worker processes start in a way threaded libraries survive: spawn once JAX (or another library whose
threads do not survive a fork) is loaded, fork otherwise."""

import functools
import subprocess
import sys

import numpy as np
import pytest

from marl_ppo.config import load_config
from marl_ppo.envs.factory import make_adapter, probe_spec
from marl_ppo.envs.vector.pool import context, default_start_method, fork_unsafe_reason
from marl_ppo.envs.vector.subprocess import SubprocessVectorEnv
from marl_ppo.envs.vector.sync import SyncVectorEnv
from marl_ppo.run.loop import train
from tests.user_env_files import RENDEZVOUS

JAX_RENDEZVOUS = (
    RENDEZVOUS
    + """
import jax
import jax.numpy as jnp

_distance = jax.jit(lambda a, b: -jnp.abs(a - b).astype(jnp.float32))


class JaxRendezvous(Rendezvous):  # the reward computed by a jitted JAX function, as a user's wrapper does
    def step(self, actions):
        obs, rewards, terminations, truncations, infos = super().step(actions)
        reward = float(_distance(self.pos[0], self.pos[1]))
        return obs, {"a": reward, "b": reward}, terminations, truncations, infos
"""
)


def test_workers_fork_until_jax_is_loaded_then_spawn():
    code = (
        "from marl_ppo.envs.vector.pool import default_start_method, fork_unsafe_reason\n"
        "before = default_start_method()\n"
        "import jax\n"
        "print(before, default_start_method(), fork_unsafe_reason())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split(maxsplit=2) == [
        "fork",
        "spawn",
        "jax is loaded (its threads do not survive a fork)\n",
    ]


@pytest.mark.jax
def test_this_process_with_jax_loaded_starts_workers_with_spawn():
    import jax  # noqa: F401  (loaded here as a JAX env or a user's wrapper loads it)

    assert fork_unsafe_reason() is not None and default_start_method() == "spawn"
    assert context(None).get_start_method() == "spawn" and context("fork").get_start_method() == "fork"


@pytest.mark.jax
def test_a_jax_env_in_spawned_env_workers_steps_as_in_this_process(tmp_path):
    """A parent that has run JAX hands its env copies to spawned workers, whose steps equal the same
    copies stepped in this process (forked workers could hang on a lock of XLA's threads)."""
    import jax.numpy as jnp

    float(jnp.ones(3).sum())  # JAX's threads are running in this process
    path = tmp_path / "jax_env.py"
    path.write_text(JAX_RENDEZVOUS)
    config = load_config(
        None, [f"env.id={path}:JaxRendezvous", "rollout.num_envs=4", "rollout.vector=subprocess"]
    )
    spec = probe_spec(config)
    make_copy = functools.partial(make_adapter, config, spec)
    spawned = SubprocessVectorEnv(make_copy, num_envs=4, num_workers=2, timeout_s=120, spec=spec)
    local = SyncVectorEnv(make_copy, num_envs=4)
    try:
        assert all(type(process).__name__ == "SpawnProcess" for process in spawned._processes)
        (group,) = spec.groups
        np.testing.assert_array_equal(
            spawned.reset(5).groups[group.name].obs, local.reset(5).groups[group.name].obs
        )
        rng = np.random.default_rng(0)
        for _ in range(25):
            actions = {group.name: rng.integers(0, 3, (4, 2))}
            rewards = spawned.step(actions).groups[group.name].reward.copy()
            np.testing.assert_array_equal(rewards, local.step(actions).groups[group.name].reward)
            assert (rewards <= 0).all()
    finally:
        spawned.close()
        local.close()


@pytest.mark.jax
def test_a_jax_env_trains_in_rollout_workers(tmp_path):
    """The default `vector` settles on rollout workers for a slow env; with JAX loaded they spawn and finish."""
    path = tmp_path / "jax_env.py"
    path.write_text(JAX_RENDEZVOUS)
    overrides = [
        f"env.id={path}:JaxRendezvous",
        "rollout.num_envs=4",
        "rollout.rollout_steps=20",
        "total_steps=160",
    ]
    overrides += ["log.progress=false", "ppo.train_pi_iters=1", "ppo.train_vf_iters=1"]
    overrides += ["rollout.vector=workers", "rollout.num_workers=2", "rollout.worker_timeout_s=120"]
    result = train(load_config(None, overrides), tmp_path / "run")
    assert result.env_steps == 160 and result.episodes == 8 and -200 < result.team_return_mean <= 0
