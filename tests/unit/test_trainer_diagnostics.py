"""After-update diagnostics on a row subset for large batches, and `ppo.update_stats: minibatches`
(the means of the steps' own forwards): neither changes what is learned."""

import copy
import dataclasses

import pytest
import torch

import marl_ppo.algo.stats as stats_module
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.run.loop import train
from tests.helpers import ROOT, assert_identical, collect_rollout, scalars


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


def test_minibatch_stats_leave_learning_unchanged_and_log_no_deltas(spread_config, tmp_path):
    train(spread_config, tmp_path / "batch")
    minibatches = dataclasses.replace(
        spread_config, ppo=dataclasses.replace(spread_config.ppo, update_stats="minibatches")
    )
    train(minibatches, tmp_path / "minibatches")
    for part in ("model", "trainer"):
        a = load_checkpoint(tmp_path / "batch/checkpoints/final.pt")[part]
        b = load_checkpoint(tmp_path / "minibatches/checkpoints/final.pt")[part]
        assert_identical(a, b)
    logged, by_batch = scalars(tmp_path / "minibatches"), scalars(tmp_path / "batch")
    assert {"train/delta_loss_pi", "train/delta_loss_v"} <= set(by_batch)
    assert set(logged) == set(by_batch) - {"train/delta_loss_pi", "train/delta_loss_v"}
    # the file's policy lag keeps the forward before the update, for the lag's KL, in both modes
    assert logged["train/kl_behaviour_start"] == by_batch["train/kl_behaviour_start"]
    for tag in ("train/loss_pi", "train/loss_v", "train/kl", "train/entropy"):
        assert logged[tag] != by_batch[tag]  # measured another way (the clip fractions are 0 in both)
    assert logged["train/explained_variance"] == by_batch["train/explained_variance"]


def test_one_whole_batch_step_measures_what_the_batch_evaluation_before_it_does(spread_config):
    """One epoch of one minibatch (the whole batch): the step's forward is the start weights' on every
    row, so its means are the before-update evaluation's, and the batch mode's after values minus its
    deltas."""
    from marl_ppo.algo.batch import rollout_batches
    from marl_ppo.algo.stats import diagnostic_rows
    from marl_ppo.algo.trainer import Trainer

    torch.set_num_threads(1)
    model, buffer, result = collect_rollout(spread_config)
    batches = rollout_batches(buffer, result.last_values, gamma=0.95, lam=0.95)
    one = dataclasses.replace(spread_config.ppo, train_pi_iters=1, train_vf_iters=1, num_minibatches=1)
    stats = {}
    for mode in ("batch", "minibatches"):
        ppo = dataclasses.replace(one, update_stats=mode).settled(convolutional=False)
        trainer = Trainer(copy.deepcopy(model), ppo, generator=torch.Generator().manual_seed(0))
        if mode == "minibatches":  # the evaluation before the step, on the rows `update` prepares
            start = Trainer(copy.deepcopy(model), ppo, generator=torch.Generator().manual_seed(0))
            before = start._evaluate(diagnostic_rows(start.prepare(batches)))
        stats[mode] = trainer.update(batches)
    by_batch, means = stats["batch"], stats["minibatches"]
    assert means.delta_loss_pi is None and means.delta_loss_v is None
    assert by_batch.delta_loss_pi is not None and by_batch.delta_loss_v is not None
    assert means.loss_pi == pytest.approx(by_batch.loss_pi - by_batch.delta_loss_pi, rel=1e-5)
    assert means.loss_v == pytest.approx(by_batch.loss_v - by_batch.delta_loss_v, rel=1e-5)
    for key in ("loss_pi", "loss_v", "kl", "entropy", "clipfrac"):
        assert getattr(means, key) == pytest.approx(getattr(before, key), rel=1e-6, abs=1e-9), key
    assert (means.pi_steps, means.stop_iter) == (by_batch.pi_steps, by_batch.stop_iter) == (1, 1)
