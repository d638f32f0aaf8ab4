"""summary.json, the record whose presence marks a run finished for sweep, reproduce and report."""

from __future__ import annotations

import os

import pytest

from marl_ppo.run import rundir
from marl_ppo.run.rundir import is_finished, read_summary, write_summary


def test_a_written_summary_reads_back_and_marks_the_run_finished(tmp_path):
    assert read_summary(tmp_path) is None and not is_finished(tmp_path)
    write_summary(tmp_path, {"env_steps": 320, "team_return_mean": -31.5})
    assert read_summary(tmp_path) == {"env_steps": 320, "team_return_mean": -31.5}
    assert is_finished(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temporary file left


def test_a_run_killed_while_writing_its_summary_is_not_finished(tmp_path, monkeypatch):
    def killed(src, dst):  # the process dies after the temporary file, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_summary(tmp_path, {"env_steps": 320})
    monkeypatch.setattr(rundir.os, "replace", os.replace)
    assert not is_finished(tmp_path) and read_summary(tmp_path) is None


def test_a_sweep_run_that_exits_0_without_a_summary_is_named_not_a_traceback(tmp_path):
    from marl_ppo.analysis.sweep import SweepRun, _result_line

    run = SweepRun(name="seed0", overrides=(), run_dir=tmp_path)
    assert _result_line(run) == "exited 0 without its summary.json"
    write_summary(tmp_path, {"team_return_mean": -31.5, "wall_s": 90.0})
    assert _result_line(run) == "team return -31.50, 1.5 min"
