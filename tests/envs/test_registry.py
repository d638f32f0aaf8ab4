"""Registry, env listing and the conformance check."""

import json
import subprocess
import sys

import numpy as np
import pytest
from marl_ppo_examples.early_leaver import EarlyLeaverEnv

import marl_ppo
from marl_ppo.cli import main
from marl_ppo.envs.registry import EnvError, make_env, registered_ids, resolve_factory
from marl_ppo.run.conformance import check_env


class UnseededEnv(EarlyLeaverEnv):
    """Breaks determinism: its observations come from an RNG that reset(seed) does not seed."""

    def _obs(self, agents):
        return {a: np.array([np.random.randint(3), self._t], np.float32) for a in agents}


def test_register_as_function_and_decorator_then_make():
    marl_ppo.register_env("tests/leaver_short_v0", EarlyLeaverEnv, leave_at=1, max_steps=2)

    @marl_ppo.register_env("tests/leaver_long_v0", max_steps=9)
    def long_leaver(**kwargs):
        return EarlyLeaverEnv(**kwargs)

    short = marl_ppo.make_env("tests/leaver_short_v0")
    assert isinstance(short, EarlyLeaverEnv) and (short.leave_at, short.max_steps) == (1, 2)
    assert marl_ppo.make_env("tests/leaver_long_v0", leave_at=4).max_steps == 9  # defaults, then kwargs
    assert callable(long_leaver)  # the decorator returns the function unchanged


def test_make_env_returns_the_parallel_env_itself():
    from pettingzoo import ParallelEnv

    env = make_env("mpe2/simple_spread_v3", N=4)
    assert isinstance(env, ParallelEnv) and len(env.possible_agents) == 4


def test_project_envs_come_from_the_entry_point():
    ids = registered_ids()
    for env_id in (
        "envs/matrix_game_v0",
        "envs/masked_guess_v0",
        "envs/never_ending_v0",
        "envs/early_leaver_v0",
        "envs/cue_recall_v0",
    ):
        assert env_id in ids


def test_unknown_id_lists_close_matches_and_missing_extra_names_the_install():
    with pytest.raises(EnvError, match="did you mean 'mpe2/simple_spread_v3'"):
        resolve_factory("mpe2/simple_spred_v3")
    marl_ppo.register_env("tests/needs_extra_v0", "not_installed_pkg.module:make", extra="exotic")
    with pytest.raises(EnvError, match=r"pip install 'marl-ppo\[exotic\]'"):
        make_env("tests/needs_extra_v0")


def test_registering_imports_nothing_heavy():
    code = (
        "import sys, marl_ppo; from marl_ppo.envs.registry import registered_ids; ids = registered_ids();"
        "print(len(ids), sorted(m for m in ('torch', 'mpe2', 'pettingzoo', 'tensorboard') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, heavy = out.split(" ", 1)
    assert int(count) > 10 and heavy.strip() == "[]"


def test_envs_json_lists_id_family_installed(capsys):
    assert main(["envs", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["mpe2/simple_spread_v3"]["family"] == "mpe2" and rows["mpe2/simple_spread_v3"]["installed"]
    assert rows["envs/matrix_game_v0"]["family"] == "envs"


def test_conformance_passes_for_a_good_env_and_reports_a_broken_one(capsys):
    assert main(["envs", "check", "envs/early_leaver_v0", "leave_at=2"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 4 and "all checks passed" in out
    marl_ppo.register_env("tests/unseeded_v0", UnseededEnv)
    report = check_env("tests/unseeded_v0")
    status = {r.name: r.status for r in report.results}
    assert status["same seed, same run"] == "FAIL" and status["one-update train"] == "PASS"
    assert not report.passed and "diverge" in report.render()
    assert main(["envs", "check", "tests/unseeded_v0"]) == 1


def test_readme_bring_your_own_env_example_works_when_pasted(tmp_path, capsys):
    from tests.helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Bring your own environment", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) < 20
    (tmp_path / "my_env.py").write_text(code)
    env_id = f"{tmp_path / 'my_env.py'}:Rendezvous"
    assert main(["envs", "check", env_id]) == 0
    assert "all checks passed" in capsys.readouterr().out
    args = [
        "train",
        f"env.id={env_id}",
        "total_steps=320",
        "log.progress=false",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    assert main(args) == 0


def test_conformance_checks_a_bare_gymnasium_env_as_training_wraps_it(tmp_path):
    """A factory may return a plain Gymnasium env; the check wraps it as a team, as training does."""
    path = tmp_path / "cartpole_env.py"
    path.write_text(
        "import gymnasium\n\n\ndef make(**kwargs):\n    return gymnasium.make('CartPole-v1', **kwargs)\n"
    )
    report = check_env(f"{path}:make")
    assert [result.status for result in report.results] == ["PASS"] * len(report.results), report.results


def test_an_env_kwarg_named_env_id_reaches_the_users_factory(tmp_path):
    (tmp_path / "named.py").write_text(
        "from marl_ppo_examples.early_leaver import EarlyLeaverEnv\n"
        "def make(env_id='default', **kwargs):\n"
        "    env = EarlyLeaverEnv(**kwargs)\n"
        "    env.chosen = env_id\n"
        "    return env\n"
    )
    env_id = f"{tmp_path / 'named.py'}:make"
    assert make_env(env_id, env_id="overcooked", max_steps=3).chosen == "overcooked"
    from marl_ppo.config import load_config
    from marl_ppo.envs.factory import make_team_env

    config = load_config(None, [f"env.id={env_id}", "env.kwargs.env_id=overcooked"])
    assert make_team_env(config).chosen == "overcooked"
    report = check_env(env_id, env_id="overcooked")
    assert report.passed, report.render()


def test_a_missing_dependency_of_an_env_module_names_the_pip_install(tmp_path, monkeypatch):
    package = tmp_path / "mygames"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "chessy.py").write_text("import not_installed_chess_lib.board\ndef env(): ...\n")
    (tmp_path / "my_chess.py").write_text("import not_installed_chess_lib\ndef env(): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for env_id, needed_by in (
        ("mygames.chessy:env", "module 'mygames.chessy'"),
        (f"{tmp_path / 'my_chess.py'}:env", f"'{tmp_path / 'my_chess.py'}'"),
    ):
        with pytest.raises(EnvError) as caught:
            resolve_factory(env_id)
        message = str(caught.value)
        assert message.startswith(
            f"env '{env_id}': {needed_by} imports 'not_installed_chess_lib', which cannot be found; "
            "no not_installed_chess_lib.py or not_installed_chess_lib/ was found "
        )
        assert "pip install" not in message  # an unknown name may be the user's own module
    # an id that names no module at all is still the id's fault
    for env_id in ("mygames.nochess:env", "no_such_package.games:env"):
        with pytest.raises(EnvError, match="cannot import module .*; check env.id$"):
            resolve_factory(env_id)


def test_a_batched_envs_kwargs_cannot_name_what_the_run_sets():
    from marl_ppo.config import load_config
    from tests.helpers import vector_env

    config = load_config(None, ["env.id=vmas/navigation", "env.kwargs.num_envs=4"])
    with pytest.raises(EnvError, match=r"the run sets its num_envs .*; drop env.kwargs.num_envs$"):
        vector_env(config)


def test_help_and_envs_import_neither_torch_nor_numpy_nor_pydantic():
    """`marl-ppo --help` and `marl-ppo envs` answer in well under a second: the heavy packages stay unloaded."""
    code = (
        "import sys\nfrom marl_ppo.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "main(['envs'])\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pydantic', 'gymnasium', 'tensorboard') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "mpe2/simple_spread_v3" in out and out.strip().splitlines()[-1] == "[]"


def test_a_missing_module_that_an_extra_installs_names_the_extra_and_a_well_known_one_its_pip_name(
    tmp_path, monkeypatch
):
    import marl_ppo.envs.registry as registry

    monkeypatch.setitem(
        registry._REGISTRY,
        "exotic/needs_lib_v0",
        registry.EnvSpec("exotic/needs_lib_v0", "extra_only_lib.games:env", extra="exotic"),
    )
    (tmp_path / "uses_extra.py").write_text("import extra_only_lib.games\n")
    monkeypatch.setitem(registry.PIP_NAMES, "short_import_name", "long-distribution-name")
    (tmp_path / "uses_known.py").write_text("import short_import_name.part\n")
    for name, module, fix in (
        ("uses_extra.py", "extra_only_lib", "install it with: pip install 'marl-ppo[exotic]'"),
        ("uses_known.py", "short_import_name", "install it with: pip install long-distribution-name"),
    ):
        path = tmp_path / name
        with pytest.raises(EnvError) as caught:
            resolve_factory(f"{path}:env")
        assert (
            str(caught.value)
            == f"env '{path}:env': '{path}' imports '{module}', which cannot be found; {fix}"
        )
