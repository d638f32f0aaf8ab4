"""The JaxMARL bench cases without JaxMARL's checkout: skips, the fake script's arithmetic, settings."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from bench import jaxmarl_pairs
from bench.jaxmarl_pairs import (
    ENABLE,
    JaxmarlSource,
    after_first,
    batch_of,
    cases,
    jaxmarl_source,
    learn_share,
    our_record,
    report,
    run_pair,
    run_theirs,
)
from bench.peer_jaxmarl_train import load_script
from bench.peers import PeerResult, PeerUnavailable, parse_result
from marl_ppo.config.loading import load_config


@pytest.fixture
def no_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jaxmarl_pairs.REPO_VARIABLE, raising=False)
    monkeypatch.delenv(jaxmarl_pairs.PYTHON_VARIABLE, raising=False)


def fake_python(folder: Path, body: str) -> Path:
    """An executable standing in for the user's Python: it records its arguments and runs `body`."""
    path = folder / "python"
    path.write_text(f'#!/bin/sh\necho "$@" > {folder}/args\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def checkout(folder: Path) -> Path:
    (folder / "jaxmarl" / "baselines").mkdir(parents=True)
    return folder / "jaxmarl"


def test_without_a_checkout_each_case_is_skipped_with_the_line_that_enables_it(no_checkout, capsys):
    with pytest.raises(PeerUnavailable) as raised:
        jaxmarl_source(None, None)
    assert str(raised.value) == ENABLE
    assert "--jaxmarl-repo PATH" in ENABLE and "jaxmarl[algs]" in ENABLE
    assert jaxmarl_pairs.main(["--pairs", "2"]) == 0  # nothing trains: the skip comes first
    output = capsys.readouterr().out
    assert output.count(f"jaxmarl_ippo_mpe: skipped, {ENABLE}") == 2
    assert f"jaxmarl_mappo_smax   skipped: {ENABLE}" in output


def test_a_folder_without_baselines_is_named_and_the_environment_names_the_checkout(
    no_checkout, tmp_path, monkeypatch
):
    with pytest.raises(PeerUnavailable, match=f"{tmp_path} is not a JaxMARL checkout"):
        jaxmarl_source(str(tmp_path), "py")
    repo = checkout(tmp_path)
    monkeypatch.setenv(jaxmarl_pairs.REPO_VARIABLE, str(repo))
    monkeypatch.setenv(jaxmarl_pairs.PYTHON_VARIABLE, "/opt/jax/bin/python")
    assert jaxmarl_source(None, None) == JaxmarlSource(repo, "/opt/jax/bin/python")
    assert jaxmarl_source(None, "other") == JaxmarlSource(repo, "other")


def test_their_script_runs_with_its_config_and_the_runs_env_steps(tmp_path):
    line = 'PEER_RESULT {"env_steps": 204800, "seconds": 8.0, "agents": 3, "compile_seconds": 12.5}'
    source = JaxmarlSource(
        checkout(tmp_path), str(fake_python(tmp_path, f"echo 'Importing...'\necho '{line}'"))
    )
    mpe = cases(mpe_updates=100)[0]
    result = run_theirs(mpe, source)
    assert result == PeerResult(204_800, 8.0, 3, None, 12.5)
    assert result.sps == 25_600.0
    args = (tmp_path / "args").read_text().split()
    assert args[0].endswith("bench/peer_jaxmarl_train.py")
    assert args[args.index("--script") + 1] == "baselines/IPPO/ippo_ff_mpe.py"
    assert args[args.index("--config") + 1] == "baselines/IPPO/config/ippo_ff_mpe.yaml"
    assert args[args.index("--total-timesteps") + 1] == "204800"  # 100 updates of 16 x 128


def test_a_failing_script_skips_the_case_with_its_last_error_line(tmp_path):
    body = "echo 'Traceback' >&2\necho \"ModuleNotFoundError: No module named 'hydra'\" >&2\nexit 1"
    source = JaxmarlSource(checkout(tmp_path), str(fake_python(tmp_path, body)))
    mpe = cases()[0]
    line = run_pair(mpe, 1, source)  # the peer runs first in odd repeats: marl_ppo never starts
    assert line == (
        "jaxmarl_ippo_mpe: skipped, JaxMARL's baselines/IPPO/ippo_ff_mpe.py failed (exit 1): "
        "ModuleNotFoundError: No module named 'hydra'"
    )
    assert run_pair(mpe, 2, source).startswith("jaxmarl_ippo_mpe: skipped, JaxMARL's")


def test_pairs_alternate_and_the_table_holds_medians_ratios_and_ranges(tmp_path, monkeypatch):
    theirs = iter([20_000.0, 25_000.0, 30_000.0])  # env steps/s of JaxMARL's three runs
    ours = iter([10_000.0, 10_000.0, 6_000.0])
    order: list[str] = []

    def fake_theirs(case, source):
        order.append("theirs")
        return PeerResult(204_800, 204_800 / next(theirs), 3, None, 12.0)

    def fake_ours(case):
        order.append("ours")
        return PeerResult(202_752, 202_752 / next(ours), 3, None, 3.0), 0.75

    monkeypatch.setattr(jaxmarl_pairs, "run_theirs", fake_theirs)
    monkeypatch.setattr(jaxmarl_pairs, "run_ours", fake_ours)
    mpe = cases()[0]
    lines = [run_pair(mpe, repeat, JaxmarlSource(tmp_path, "py")) for repeat in range(3)]
    assert order == ["ours", "theirs", "theirs", "ours", "ours", "theirs"]
    assert mpe.ratios() == pytest.approx([0.5, 0.4, 0.2])
    assert lines[0] == (
        "jaxmarl_ippo_mpe: marl_ppo 10,000 env steps/s (first update 3.0 s, learner 75%), "
        "JaxMARL 20,000 (compile 12.0 s), ratio 0.50 (marl_ppo ran first)"
    )
    row = report([mpe]).splitlines()[1].split()
    assert row[:5] == ["jaxmarl_ippo_mpe", "10,000", "(6,000-10,000)", "25,000", "(20,000-30,000)"]
    assert row[5:8] == ["0.40", "(0.20-0.50)", "3"]


def test_our_result_line_counts_the_steps_after_the_first_update():
    line = our_record(99 * 2048, 20.0, 3, 3.5, 0.7)
    result = parse_result(f"loading\n{line}\n")
    assert result.sps == pytest.approx(99 * 2048 / 20.0) and result.compile_seconds == 3.5
    assert learn_share(line) == 0.7


def test_the_learners_share_leaves_the_first_updates_compile_out():
    # 10 s of learning over a 20 s run whose first update took 10 s (compiling) and the other two 10 s:
    # the first update learned for a third of the 10 s, so the last two for 6.67 s of their 10 s
    assert after_first(0.5, 10.0, 10.0, 3) == pytest.approx(2 / 3)
    # a first update as long as the others changes nothing
    assert after_first(0.6, 2.0, 18.0, 10) == pytest.approx(0.6)


def test_our_settings_are_the_scripts():
    mpe, smax, smax_gru = cases()
    config = load_config(mpe.experiment, mpe.overrides)
    assert config.env.id == "jaxmarl/mpe_simple_spread_v3"
    assert (config.rollout.num_envs, config.rollout.rollout_steps) == (16, 128) and batch_of(mpe) == 2048
    assert config.model.hidden_sizes == (64, 64) and config.model.share_actor and config.ppo.critic == "obs"
    assert (config.ppo.train_pi_iters, config.ppo.train_vf_iters, config.ppo.num_minibatches) == (4, 4, 4)
    assert config.ppo.target_kl is None
    config = load_config(smax.experiment, smax.overrides)
    assert config.env.id == "jaxmarl/smax_2s3z" and batch_of(smax) == 128 * 128
    assert (config.ppo.train_pi_iters, config.ppo.train_vf_iters, config.ppo.num_minibatches) == (4, 4, 4)
    assert config.eval.every is None
    config = load_config(smax_gru.experiment, smax_gru.overrides)
    assert batch_of(smax_gru) == 128 * 128 and config.eval.every is None
    assert (config.model.recurrent, config.model.recurrent_size, config.model.hidden_sizes) == (
        "gru",
        128,
        (128,),
    )
    assert config.ppo.chunk_length is None and config.model.critic_recurrent


def test_the_wrapper_imports_a_script_beside_its_neighbours(tmp_path):
    (tmp_path / "helper.py").write_text("WIDTH = 64\n")
    (tmp_path / "train_script.py").write_text(
        "from helper import WIDTH\n\ndef make_train(config):\n    return WIDTH\n"
    )
    module = load_script(tmp_path / "train_script.py")
    assert module.make_train({}) == 64
