"""Mistakes a newcomer makes, each answered in one line with the fix that works (not a wrong one)."""

import os
from pathlib import Path

import pytest

from marl_ppo.cli import main

CASES = {
    # a tuple and an unclosed list: the fix is the list itself, not the value wrapped in brackets again
    "tuple": (
        ["model.hidden_sizes=(128,128)"],
        "config key 'model.hidden_sizes' takes a list, got '(128,128)'; "
        "write it as model.hidden_sizes=[128,128] (YAML's list form)",
    ),
    "unclosed list": (
        ["log.backends=[tensorboard,csv"],
        "config key 'log.backends' takes a list, got '[tensorboard,csv'; "
        "write it as log.backends=[tensorboard,csv] (YAML's list form)",
    ),
    "a value the shell split": (
        ["model.hidden_sizes=[128", "128]"],
        "the shell split 'model.hidden_sizes=[128 128]' at a space; write it without spaces, "
        "model.hidden_sizes=[128,128], or quote it as one argument",
    ),
    "spaces around =": (
        ["total_steps", "=", "1000"],
        "'total_steps = 1000' has spaces around '='; write total_steps=1000, without spaces",
    ),
    "a section given a value": (
        ["env=mpe2/simple_spread_v3"],
        "config key 'env' is a section of keys, got 'mpe2/simple_spread_v3'; set the keys inside it, e.g. "
        "env.id=mpe2/simple_spread_v3 (in a file: env: {id: mpe2/simple_spread_v3})",
    ),
    "an env file without its callable": (
        ["env.id=myenv/predator.py"],
        "env.id 'myenv/predator.py' names a Python file but not what in it builds the env; add it after a "
        "colon: env.id=myenv/predator.py:make_env (a function or class of the file), or "
        "env.id=myenv/predator.py:family/name (an id the file registers)",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_mistake_gets_the_fix_that_works(case, tmp_path, capsys):
    args, message = case
    assert main(["train", *args, "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "run").exists()


def test_an_experiment_in_a_file_that_gives_a_section_a_value_gets_the_file_form(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("env: mpe2/simple_spread_v3\n")
    assert main(["train", str(path), "--print-config"]) == 2
    assert "(in a file: env: {id: mpe2/simple_spread_v3})" in capsys.readouterr().err


def test_eval_of_an_experiment_file_says_to_add_random(capsys):
    assert main(["eval", "experiments/mpe/simple_spread.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: 'experiments/mpe/simple_spread.yaml' is an experiment file, not a checkpoint; evaluate a run "
        "with `"
    )
    assert err.endswith(" eval --random experiments/mpe/simple_spread.yaml`\n") and err.count("\n") == 1


def test_a_run_dir_under_a_dangling_link_or_in_proc_or_sys_is_one_line(tmp_path, capsys):
    link = tmp_path / "scratch"
    link.symlink_to(tmp_path / "gone")
    assert main(["train", "total_steps=100", "--run-dir", str(link / "run")]) == 2
    assert capsys.readouterr().err == (
        f"error: run directory '{link / 'run'}' cannot be created: '{link}' is a link to '{tmp_path / 'gone'}', "
        "which does not exist; create the link's target or pick another --run-dir\n"
    )
    for pseudo in (Path("/proc"), Path("/sys")):
        if not pseudo.is_dir():
            continue
        assert main(["train", "total_steps=100", "--run-dir", str(pseudo / "marl_ppo_run")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(
            f"error: run directory '{pseudo / 'marl_ppo_run'}' cannot be created in '{pseudo}' ("
        )
        assert err.endswith("); pick another --run-dir\n") and err.count("\n") == 1


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_eval_out_in_proc_is_one_line(capsys):
    args = [
        "eval",
        "--random",
        "experiments/mpe/simple_spread.yaml",
        "--episodes",
        "1",
        "--out",
        "/proc/marl_ppo_x",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out '/proc/marl_ppo_x' cannot be created (") and err.count("\n") == 1


def test_our_warnings_print_as_one_line_without_a_source_line(monkeypatch):
    import warnings

    from marl_ppo.cli import _own_warnings_as_lines
    from marl_ppo.envs.vmas.adapter import SlowResetWarning

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    _own_warnings_as_lines()
    _own_warnings_as_lines()  # main() called again in one process installs it once
    ours = warnings.formatwarning(
        SlowResetWarning("vmas/x: reset slowly"), SlowResetWarning, "lib.py", 7, "src"
    )
    assert ours == "warning: vmas/x: reset slowly\n"
    foreign = warnings.formatwarning(UserWarning("theirs"), UserWarning, "lib.py", 7, "src")
    assert foreign.startswith("lib.py:7: UserWarning: theirs")


def test_a_mujoco_render_without_a_display_names_mujoco_gl():
    from marl_ppo.eval.evaluate import EvalError
    from marl_ppo.eval.video import _frame

    class NoDisplay:
        def render(self):
            raise RuntimeError("an OpenGL platform library has not been loaded into this process")

    with pytest.raises(EvalError) as caught:
        _frame(NoDisplay(), "mamujoco/Hopper-3x1")
    assert str(caught.value) == (
        "env 'mamujoco/Hopper-3x1' failed to render with render_mode='rgb_array': render() raised RuntimeError: "
        "an OpenGL platform library has not been loaded into this process; without a display, MuJoCo renders "
        "off-screen when started with MUJOCO_GL=egl (with a GPU) or MUJOCO_GL=osmesa (CPU only) before the "
        "command; or drop --render"
    )
    with pytest.raises(EvalError, match="; drop --render$"):
        _frame(NoDisplay(), "mpe2/simple_spread_v3")
