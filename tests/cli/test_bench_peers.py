"""The bench's peer cases without installing a peer: venv commands, result lines, step counts, pairing, skips."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import pairs, peers
from bench.pairs import PISTONBALL_TUTORIAL, PeerCase, peer_cases, peer_report, run_pair
from bench.peer_sb3_pistonball import ENV_KWARGS, PPO_KWARGS, result_record
from bench.peers import PeerResult, PeerUnavailable, parse_result
from marl_ppo.config.loading import load_config

FAKE = peers.Peer("fake", ("fakepkg==1.0",), "fake_script.py")


def test_sb3_agent_steps_count_as_env_steps_over_the_pistons():
    record = result_record(20_480, 80.0, [2.0, 4.0])
    assert record["env_steps"] == 1_024 and record["agent_steps"] == 20_480 and record["agents"] == 20
    assert record["piston_return_mean"] == 3.0 and record["team_return"] == 60.0
    result = PeerResult(1_024, 80.0, 20)
    assert result.sps == pytest.approx(12.8) and result.agent_sps == pytest.approx(256.0)


def test_the_result_line_is_found_among_other_output():
    output = 'Starting training\nPEER_RESULT {"env_steps": 800, "seconds": 2.0, "agents": 3}\nbye\n'
    assert parse_result(output) == PeerResult(800, 2.0, 3)
    assert (
        parse_result(
            'PEER_RESULT {"env_steps": 8, "seconds": 2.0, "agents": 3, "team_return": -5}'
        ).team_return
        == -5.0
    )
    with pytest.raises(ValueError, match="no result line"):
        parse_result("Traceback ...\n")


def test_the_tutorial_is_the_same_on_both_sides():
    config = load_config(None, [*PISTONBALL_TUTORIAL, "total_steps=1024"])
    assert config.env.kwargs["max_cycles"] == ENV_KWARGS["max_cycles"] == 25
    assert tuple(config.env.resize or ()) == (84, 84) and config.env.frame_stack == 3 and config.env.greyscale
    assert config.rollout.copies == 4 and config.rollout.rollout_steps == PPO_KWARGS["n_steps"] == 256
    assert config.ppo.gamma == PPO_KWARGS["gamma"] and config.ppo.gae_lambda == PPO_KWARGS["gae_lambda"]
    assert config.ppo.pi_lr == config.ppo.vf_lr == PPO_KWARGS["learning_rate"]
    assert config.ppo.clip_ratio == PPO_KWARGS["clip_range"]
    assert config.ppo.entropy_coef == PPO_KWARGS["ent_coef"]
    assert config.ppo.max_grad_norm == PPO_KWARGS["max_grad_norm"]
    assert config.ppo.train_pi_iters == config.ppo.train_vf_iters == PPO_KWARGS["n_epochs"] == 5
    # SB3's batch of 256 agent-steps out of 4 copies x 256 steps x 20 pistons: 80 minibatches an epoch
    assert config.ppo.num_minibatches == 4 * 256 * 20 // PPO_KWARGS["batch_size"] == 80
    # SB3's NatureCNN: 32/64/64 channels, kernels 8/4/3, strides 4/2/1, unpadded, 512 features
    model = config.model
    assert (model.cnn_channels, model.cnn_kernels, model.cnn_strides) == ((32, 64, 64), (8, 4, 3), (4, 2, 1))
    assert model.cnn_padding == "valid" and model.cnn_features == 512 and model.shared_cnn


def test_the_tutorial_runs_in_float32_and_at_auto_precision_against_the_same_peer_script():
    tutorial = {case.name: case for case in peer_cases(2048, 24_000) if case.name.startswith("pistonball")}
    assert set(tutorial) == {"pistonball_tutorial", "pistonball_tutorial_auto"}
    for name, precision in (("pistonball_tutorial", "fp32"), ("pistonball_tutorial_auto", "auto")):
        case = tutorial[name]
        assert case.peer is peers.SB3 and case.peer_args == ["--env-steps", "2048"]
        config = load_config(case.experiment, case.overrides)
        assert config.model.precision == precision and config.total_steps == 2048


def test_the_spread_cases_ask_both_sides_for_the_same_budget_and_widths():
    spread = {case.name: case for case in peer_cases(1024, 24_000) if case.name.startswith("spread")}
    assert set(spread) == {"spread_benchmarl_64", "spread_benchmarl_256"}
    case = spread["spread_benchmarl_256"]
    assert case.peer_args == ["--frames", "24000", "--hidden", "256", "256"]
    config = load_config(case.experiment, case.overrides)
    assert config.total_steps == 24_000 and config.rollout.copies * config.rollout.rollout_steps == 800
    assert tuple(config.model.hidden_sizes) == (256, 256) and config.host.torch_threads == 1
    assert config.ppo.num_minibatches == 4 and config.ppo.train_pi_iters == 10 and config.ppo.gamma == 0.95
    assert config.ppo.critic == "team"  # BenchMARL's shared centralised critic: one value per env step


def test_the_venv_commands_pin_torch_and_take_extra_pip_options(tmp_path, monkeypatch):
    monkeypatch.setenv("MARL_PPO_PEERS_PIP_ARGS", "--extra-index-url https://example.org/simple")
    commands = peers.install_commands(FAKE, tmp_path, "torch==2.13.0", "/usr/bin/python3")
    python = str(tmp_path / "fake" / "bin" / "python")
    assert commands == [
        ["/usr/bin/python3", "-m", "venv", str(tmp_path / "fake")],
        [python, "-m", "pip", "install", "--quiet", "--extra-index-url", "https://example.org/simple",
         "torch==2.13.0", "fakepkg==1.0"],
    ]  # fmt: skip


def test_the_torch_pin_is_the_running_version_without_its_local_label(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert peers.torch_requirement() == "torch==2.13.0"


def test_the_venvs_live_in_the_cache_unless_told_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("MARL_PPO_PEERS_DIR", raising=False)
    assert peers.peers_dir() == Path.home() / ".cache" / "marl_ppo" / "bench-peers"
    monkeypatch.setenv("MARL_PPO_PEERS_DIR", str(tmp_path))
    assert peers.peers_dir() == tmp_path


def test_a_failed_install_says_which_step_failed_and_where_its_log_is(tmp_path, monkeypatch):
    failing = [[sys.executable, "-c", "import sys; print('No matching distribution'); sys.exit(3)"]]
    monkeypatch.setattr(peers, "install_commands", lambda *args: failing)
    with pytest.raises(
        PeerUnavailable, match=r"fake could not be installed: `-c import sys; print\("
    ) as caught:
        peers.ensure_peer(FAKE, tmp_path)
    assert "exited 3" in str(caught.value) and str(tmp_path / "fake-install.log") in str(caught.value)
    assert "No matching distribution" in (tmp_path / "fake-install.log").read_text()
    assert not (tmp_path / "fake" / "marl_ppo-requirements.txt").exists()  # the next run tries again


def test_an_installed_venv_with_the_same_pins_is_reused(tmp_path, monkeypatch):
    python = peers.venv_python(FAKE, tmp_path)
    python.parent.mkdir(parents=True)
    python.write_text("")
    stamp = tmp_path / "fake" / "marl_ppo-requirements.txt"
    stamp.write_text(f"{peers.torch_requirement()}\nfakepkg==1.0\n")
    monkeypatch.setattr(peers.subprocess, "run", lambda *a, **k: pytest.fail("installed again"))
    assert peers.ensure_peer(FAKE, tmp_path) == python
    stamp.write_text("torch==1.0\nfakepkg==0.9\n")  # other pins: the venv is made again
    monkeypatch.setattr(peers, "install_commands", lambda *args: [[sys.executable, "-c", "pass"]])
    monkeypatch.setattr(peers.subprocess, "run", lambda *a, **k: type("Done", (), {"returncode": 0})())
    assert peers.ensure_peer(FAKE, tmp_path) == python
    assert stamp.read_text() == f"{peers.torch_requirement()}\nfakepkg==1.0\n"


def test_run_peer_reads_the_script_result_and_reports_its_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "ensure_peer", lambda peer: Path(sys.executable))
    monkeypatch.setattr(peers, "HERE", tmp_path)
    script = tmp_path / "fake_script.py"
    script.write_text(
        "import os, sys\n"
        'print(\'PEER_RESULT {"env_steps": %s, "seconds": 4.0, "agents": 3}\' % sys.argv[1])\n'
        "print(os.environ['OMP_NUM_THREADS'])\n"
    )
    assert peers.run_peer(FAKE, ["1600"], {"OMP_NUM_THREADS": "1"}) == PeerResult(1600, 4.0, 3)
    script.write_text("import sys\nsys.exit('BenchMARL: no such task')\n")
    with pytest.raises(
        PeerUnavailable, match=r"fake's script fake_script.py failed \(exit 1\): BenchMARL: no such"
    ):
        peers.run_peer(FAKE, [], None)


def _case() -> PeerCase:
    return PeerCase("fake_case", FAKE, ["--x"], None, ["total_steps=100"], 3)


def test_pairs_alternate_their_order_and_ratio_neighbours(monkeypatch):
    order: list[str] = []
    rates = iter([30.0, 10.0, 40.0, 10.0, 18.0, 6.0])  # in call order: ours, theirs, theirs, ours, ...

    def train(experiment, overrides):
        order.append("ours")
        return {"sps": next(rates)}

    def peer(peer, args, env):
        order.append("theirs")
        return PeerResult(int(next(rates) * 10), 10.0, 3)

    monkeypatch.setattr(pairs, "ensure_peer", lambda peer: Path("python"))
    monkeypatch.setattr(pairs, "run_peer", peer)
    case = _case()
    lines = [run_pair(case, repeat, train) for repeat in range(3)]
    assert order == ["ours", "theirs", "theirs", "ours", "ours", "theirs"]
    assert case.ratios() == pytest.approx([3.0, 0.25, 3.0])
    assert "ratio 0.25 (fake ran first)" in lines[1]
    row = peer_report([case]).splitlines()[1].split()
    # medians: ours 18 env steps/s, theirs 10; agent-steps/s x 3; ratio median 3.0 over 0.25-3.00
    assert row == ["fake_case", "fake", "18.00", "10.00", "54", "/", "30", "3.00", "0.25-3.00", "3"]


def test_a_missing_peer_skips_its_case_in_one_line_before_marl_ppo_runs(monkeypatch):
    def missing(peer):
        raise PeerUnavailable("fake could not be installed: `-m pip install` exited 1; see install.log")

    monkeypatch.setattr(pairs, "ensure_peer", missing)
    case = _case()
    train_calls = []
    train = lambda *args: train_calls.append(args)  # noqa: E731  never called: the case is skipped first
    lines = [run_pair(case, repeat, train) for repeat in range(2)]  # type: ignore[arg-type]
    assert train_calls == []
    expected = "fake_case: skipped, fake could not be installed: `-m pip install` exited 1; see install.log"
    assert lines == [expected, expected]
    assert peer_report([case]).splitlines()[1].split("skipped: ")[1] == expected.split("skipped, ")[1]
