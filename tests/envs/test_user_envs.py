"""A user's own env file: ids that loading it registers, in this process, in a run, in spawned workers, on resume."""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from marl_ppo.config import load_config
from marl_ppo.envs.factory import make_adapter, probe_spec
from marl_ppo.envs.registry import EnvError, make_env, resolve_factory
from marl_ppo.envs.vector.subprocess import SubprocessVectorEnv
from marl_ppo.envs.vector.sync import SyncVectorEnv
from tests.helpers import ROOT
from tests.user_env_files import write_env_file


def test_an_id_named_after_its_file_loads_the_file_first(tmp_path):
    path = write_env_file(tmp_path, register="mine/rendezvous_v0")
    env = make_env(f"{path}:mine/rendezvous_v0")
    assert type(env).__name__ == "Rendezvous" and env.possible_agents == ["a", "b"]
    assert type(make_env("mine/rendezvous_v0")) is type(env)  # registered in this process from now on


def test_ids_registered_by_a_file_loaded_through_its_callable_are_visible_in_the_process(tmp_path):
    path = write_env_file(tmp_path, register="mine/loaded_with_its_callable_v0")
    with pytest.raises(EnvError, match="unknown env id 'mine/loaded_with_its_callable_v0'"):
        make_env("mine/loaded_with_its_callable_v0")
    env = make_env(f"{path}:Rendezvous")
    assert type(make_env("mine/loaded_with_its_callable_v0")) is type(env)  # the file ran once


def test_a_file_that_does_not_register_the_named_id_is_one_line(tmp_path):
    path = write_env_file(tmp_path)
    with pytest.raises(EnvError) as error:
        make_env(f"{path}:mine/not_registered_v0")
    message = str(error.value)
    assert "registered no env 'mine/not_registered_v0'" in message
    assert "marl_ppo.register_env('mine/not_registered_v0', ...)" in message and "\n" not in message
    registering = write_env_file(tmp_path, register="mine/registered_here_v0", name="registering.py")
    with pytest.raises(EnvError, match=f"did you mean '{registering}:mine/registered_here_v0'"):
        make_env(f"{registering}:mine/registered_here_v1")


def test_an_unknown_id_says_how_to_name_the_file_that_registers_it():
    with pytest.raises(EnvError, match=r"name the file first: env\.id=path/to/file\.py:qqq/xyzzy_v0"):
        resolve_factory("qqq/xyzzy_v0")


def test_an_env_file_imports_the_modules_beside_it_as_a_script_would(tmp_path):
    folder = tmp_path / "myenv"
    folder.mkdir()
    write_env_file(folder, name="rendezvous_beside.py")
    (folder / "train_me.py").write_text(
        "from rendezvous_beside import Rendezvous\n\n\ndef make():\n    return Rendezvous()\n"
    )
    env = make_env(f"{folder / 'train_me.py'}:make")
    assert type(env).__name__ == "Rendezvous" and env.possible_agents == ["a", "b"]


def test_a_module_missing_beside_an_env_file_is_never_answered_with_a_pip_install(tmp_path):
    folder = tmp_path / "myenv"
    folder.mkdir()
    path = folder / "broken.py"
    path.write_text("from predator_not_written_yet import Predator\n")
    with pytest.raises(EnvError) as caught:
        make_env(f"{path}:Predator")
    assert str(caught.value) == (
        f"env '{path}:Predator': '{path}' imports 'predator_not_written_yet', which cannot be found; "
        f"no predator_not_written_yet.py or predator_not_written_yet/ was found next to {folder.resolve()} "
        "or on the import path (PYTHONPATH); if it is your own code, put it there or add its folder to "
        "PYTHONPATH, else install the package that provides it"
    )


def test_a_file_id_without_its_callable_says_to_add_one():
    with pytest.raises(EnvError) as caught:
        resolve_factory("myenv/predator.py")
    assert str(caught.value) == (
        "env.id 'myenv/predator.py' names a Python file but not what in it builds the env; add it after a "
        "colon: env.id=myenv/predator.py:make_env (a function or class of the file), or "
        "env.id=myenv/predator.py:family/name (an id the file registers)"
    )


def test_spawned_worker_processes_load_the_file_again(tmp_path):
    """Workers started with spawn inherit no modules: the id names the file, so each loads it."""
    path = write_env_file(tmp_path, register="mine/rendezvous_spawn_v0")
    config = load_config(
        None, [f"env.id={path}:mine/rendezvous_spawn_v0", "rollout.num_envs=2", "rollout.vector=sync"]
    )
    make_copy = functools.partial(make_adapter, config, probe_spec(config))
    sync = SyncVectorEnv(make_copy, num_envs=2)
    spawned = SubprocessVectorEnv(make_copy, num_envs=2, num_workers=2, start_method="spawn", timeout_s=60)
    try:
        (group,) = sync.spec.groups
        first = spawned.reset(seed=3).groups[group.name].obs
        np.testing.assert_array_equal(first, sync.reset(seed=3).groups[group.name].obs)
        for step in range(25):  # across the 20-step episode's auto-reset
            actions = {group.name: np.full((2, 2), step % 3)}
            rewards = spawned.step(actions).groups[group.name].reward
            np.testing.assert_array_equal(rewards, sync.step(actions).groups[group.name].reward)
    finally:
        spawned.close()
        sync.close()


def _marl_ppo(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "marl_ppo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_run_in_rollout_workers_resumes_in_a_new_process_on_the_files_id(tmp_path):
    """As a user runs it: `marl-ppo train env.id=my_env.py:mine/rendezvous_v0`, then `--resume` (exact)."""
    write_env_file(tmp_path, register="mine/rendezvous_v0")
    common = [
        "rollout.num_envs=4",
        "rollout.rollout_steps=10",
        "log.progress=false",
        "model.hidden_sizes=[8]",
    ]
    first = _marl_ppo(
        "train",
        "env.id=my_env.py:mine/rendezvous_v0",
        *common,
        "rollout.vector=workers",
        "total_steps=80",
        "--run-dir",
        "run",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    assert (
        yaml.safe_load((tmp_path / "run/config.yaml").read_text())["env"]["id"]
        == f"{(tmp_path / 'my_env.py').resolve()}:mine/rendezvous_v0"
    )
    resumed = _marl_ppo("train", "--resume", "run", "total_steps=120", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "done: 120 env steps" in resumed.stdout
    assert "not exact" not in resumed.stderr  # the pickled env copies found their class in the reloaded file


def test_a_file_env_run_resumes_and_evaluates_from_another_directory_and_follows_a_moved_file(
    tmp_path, monkeypatch, capsys
):
    """The file is recorded by its absolute path and content hash; a moved file gets one line naming
    the old path and the override, and the override resumes it (its env copies restart)."""
    import hashlib
    import json
    import shutil

    from marl_ppo.cli import main

    start, elsewhere, moved_to = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "moved"
    for directory in (start, elsewhere, moved_to):
        directory.mkdir()
    env_file = write_env_file(start)
    tiny = [
        "rollout.num_envs=2",
        "rollout.rollout_steps=10",
        "rollout.vector=sync",
        "log.progress=false",
        "model.hidden_sizes=[8]",
    ]
    monkeypatch.chdir(start)
    assert main(["train", "env.id=my_env.py:Rendezvous", *tiny, "total_steps=20", "--run-dir", "run"]) == 0
    run_dir = start / "run"
    absolute = f"{env_file.resolve()}:Rendezvous"
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["env"]["id"] == absolute
    recorded = json.loads((run_dir / "code.json").read_text())["env_file"]
    assert recorded == {
        "path": str(env_file.resolve()),
        "sha256": hashlib.sha256(env_file.read_bytes()).hexdigest(),
    }

    monkeypatch.chdir(elsewhere)
    assert main(["train", "--resume", str(run_dir), "total_steps=40"]) == 0
    assert "done: 40 env steps" in capsys.readouterr().out
    assert main(["eval", str(run_dir), "--episodes", "2", "--out", "eval"]) == 0
    assert json.loads((elsewhere / "eval" / "eval.json").read_text())["env"]["id"] == absolute

    shutil.move(env_file, moved_to / "my_env.py")
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "total_steps=60"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"file '{env_file.resolve()}' does not exist" in err
    assert "env.id=NEW/PATH/my_env.py:Rendezvous" in err
    override = f"env.id={moved_to / 'my_env.py'}:Rendezvous"
    with pytest.warns(UserWarning, match="the env file moved from"):
        assert main(["train", "--resume", str(run_dir), "total_steps=60", override]) == 0
    assert (
        yaml.safe_load((run_dir / "config.yaml").read_text())["env"]["id"]
        == f"{moved_to / 'my_env.py'}:Rendezvous"
    )
    assert main(["eval", str(run_dir), "--episodes", "2", "--out", "eval2"]) == 0  # the new path, recorded
