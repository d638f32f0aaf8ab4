"""The learner benchmark counts the update's matrix products as the networks' shapes say they are."""

import pytest

from bench.learner import SPREAD_YAML, Product, _product, recorded_products, setup

TINY = [
    "rollout.num_envs=2",
    "rollout.rollout_steps=8",
    "ppo.critic=obs",
    "model.share_actor=true",
    "model.hidden_sizes=[8,8]",
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "ppo.num_minibatches=2",
    "ppo.target_kl=null",
]
"""simple_spread (3 agents, 18 observations, 5 actions): 16 env steps of 48 agent rows, 2 steps of 24."""


def test_a_product_is_read_from_the_profilers_shapes_with_the_bias_first_where_it_has_one():
    assert _product("aten::mm", [[1536, 64], [64, 5]]) == Product(1, 1536, 64, 5)
    assert _product("aten::addmm", [[64], [1536, 18], [18, 64], [], []]) == Product(1, 1536, 18, 64)
    assert _product("aten::bmm", [[3, 512, 18], [3, 18, 64]]) == Product(3, 512, 18, 64)
    assert _product("aten::baddbmm", [[3, 1, 64], [3, 512, 64], [3, 64, 64], [], []]) == Product(
        3, 512, 64, 64
    )
    assert Product(3, 512, 64, 64).flops == 2 * 3 * 512 * 64 * 64


def test_an_updates_recorded_products_add_up_to_the_hand_count():
    case = setup(SPREAD_YAML, TINY)
    case.reset()
    products = recorded_products(case.update)
    # multiply-adds per agent row. Actor 18 -> 8 -> 8 -> 5, critic 18 -> 8 -> 8 -> 1: forward, the
    # inputs' gradients of the layers after the first (the normalized observation needs none) and
    # every weight's gradient
    actor = 18 * 8 + 8 * 8 + 8 * 5
    critic = 18 * 8 + 8 * 8 + 8 * 1
    actor_step = actor + (8 * 8 + 8 * 5) + actor
    critic_step = critic + (8 * 8 + 8 * 1) + critic
    steps = 2 * 24 * (actor_step + critic_step)
    evaluations = 2 * 48 * (actor + critic)  # before and after the update, every row, no gradient
    # the input LayerNorm's shift folded into the first layer's bias, weight (8, 18) @ shift (18, 1):
    # in every forward (4 with gradients, 4 without), and its two gradients in the 4 with
    fold = 8 * (8 * 18) + 4 * 2 * (8 * 18)
    assert sum(p.flops for p in products) == 2 * (steps + evaluations + fold)


@pytest.mark.jax
def test_the_jax_learners_case_times_the_same_steps_against_torchs_products(monkeypatch):
    """The JAX learner's case counts the products of torch's update of the same batch (the profiler
    cannot see inside XLA's program) and takes the same minibatch steps."""
    pytest.importorskip("jax")
    import bench.learner as learner

    monkeypatch.setitem(learner.CASES, "tiny", (SPREAD_YAML, TINY))
    monkeypatch.setitem(learner.CASES, "tiny_jax", (SPREAD_YAML, TINY))
    monkeypatch.setattr(learner, "JAX_CASES", {"tiny_jax"})
    monkeypatch.setattr(learner, "_one_thread_xla", lambda: None)  # leaves XLA_FLAGS of this process alone
    torch_case, jax_case = learner._measure("tiny", 1), learner._measure("tiny_jax", 1)
    assert jax_case.steps == torch_case.steps == 2
    assert jax_case.flops == torch_case.flops > 0
    assert len(jax_case.update_ms) == len(jax_case.products_ms) == 1 and jax_case.update_ms[0] > 0
