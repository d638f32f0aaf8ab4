"""The one-direction flow of DESIGN.md, checked on the imports: env layers never reach downstream."""

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "marl_ppo"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("marl_ppo")}


def test_env_layer_imports_nothing_downstream():
    downstream = (
        "marl_ppo.rollout",
        "marl_ppo.batch",
        "marl_ppo.trainer",
        "marl_ppo.models",
        "marl_ppo.logging",
        "marl_ppo.train",
        "marl_ppo.losses",
    )
    for path in (PACKAGE / "envs").glob("*.py"):
        bad = [name for name in _imports(path) if name.startswith(downstream)]
        assert not bad, f"{path.name} imports {bad}"


def test_losses_and_gae_are_pure_torch():
    assert _imports(PACKAGE / "losses.py") == set()
    assert _imports(PACKAGE / "rollout" / "gae.py") == set()


def test_only_the_orchestrator_builds_the_logger_and_the_cli_only_calls_the_library():
    users = [
        p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if "marl_ppo.logging" in _imports(p)
    ]
    assert users == ["train.py"]
    assert "marl_ppo.trainer" not in _imports(PACKAGE / "cli.py")


def test_rollout_layer_does_not_import_the_models_or_the_trainer():
    for path in (PACKAGE / "rollout").glob("*.py"):
        bad = [
            n
            for n in _imports(path)
            if n.startswith(("marl_ppo.models", "marl_ppo.trainer", "marl_ppo.train"))
        ]
        assert not bad, f"{path.name} imports {bad}"
