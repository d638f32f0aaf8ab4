"""After-update diagnostics on a row subset for large batches: they never change what is learned."""

import torch

import marl_ppo.algo.stats as stats_module
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.run.loop import train
from tests.helpers import ROOT, collect_rollout


def test_diagnostic_rows_are_an_even_stride_with_both_ends(spread_config):
    from marl_ppo.algo.batch import rollout_batches
    from marl_ppo.algo.sequences import cut_batch

    _, buffer, result = collect_rollout(spread_config)
    flat = rollout_batches(buffer, result.last_values, gamma=0.95, lam=0.95)
    batches = {
        name: cut_batch(b, length=1, advantages=b.advantages, returns=b.returns, value_ref=b.values_old)
        for name, b in flat.items()
    }
    assert stats_module.diagnostic_rows(batches) is batches  # 50 env steps of 3 agents: all of them
    stats_module.DIAGNOSTIC_ROWS = 24  # agent-steps: 8 env steps of the 3 agents
    try:
        subset = stats_module.diagnostic_rows(batches)
        stats_module.DIAGNOSTIC_ROWS = 23  # 7 env steps and 2 agents' worth: whole env steps, so 7
        fewer = stats_module.diagnostic_rows(batches)
    finally:
        stats_module.DIAGNOSTIC_ROWS = 8192
    rows = [0, 7, 14, 21, 28, 35, 42, 49]
    assert list(subset) == list(batches)
    assert torch.equal(subset["agent"].inputs.obs[0], flat["agent"].obs[rows])
    assert torch.equal(subset["agent"].inputs.state[0], flat["agent"].state[rows])
    assert torch.equal(fewer["agent"].inputs.obs[0], flat["agent"].obs[[0, 8, 16, 24, 32, 40, 49]])


def test_the_diagnostic_subset_leaves_learning_unchanged(spread_config, tmp_path, monkeypatch):
    train(spread_config, tmp_path / "all")
    monkeypatch.setattr(stats_module, "DIAGNOSTIC_ROWS", 5)
    train(spread_config, tmp_path / "subset")
    a = load_checkpoint(tmp_path / "all/checkpoints/final.pt")["model"]
    b = load_checkpoint(tmp_path / "subset/checkpoints/final.pt")["model"]
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_the_fingerprint_of_a_run_repeats_and_tells_another_run_apart():
    """`python -m bench.fingerprint` compares learning before and after a change: the same
    seeded run gives the same hashes, another seed other ones."""
    from bench.fingerprint import fingerprint

    tiny = [
        "total_steps=100",
        "rollout.num_envs=2",
        "rollout.rollout_steps=25",
        "rollout.vector=sync",
        "ppo.num_minibatches=2",
    ]
    first, again = (
        fingerprint(str(ROOT / "experiments/mpe/simple_spread.yaml"), ["seed=0", *tiny]) for _ in range(2)
    )
    other = fingerprint(str(ROOT / "experiments/mpe/simple_spread.yaml"), ["seed=1", *tiny])
    assert first == again and len(first["model"]) == len(first["trainer"]) == 16
    assert other["model"] != first["model"] and other["trainer"] != first["trainer"]
