"""The package's shape, checked on its imports: the pipeline's one direction, no cycles, a small top level."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "marl_ppo"

LAYERS = [
    # shared small types, the hand-written library pieces (which import nothing of ours) and checkpoint
    # files (read by eval, written by run)
    ("marl_ppo.faults", "marl_ppo.config", "marl_ppo.console", "marl_ppo.fast", "marl_ppo.checkpoint"),
    ("marl_ppo.envs",),  # the env id registry among them: the config no longer reads it
    ("marl_ppo.models",),  # the networks and their value normalizers
    ("marl_ppo.plan",),  # the run settled once: what every builder below the run takes
    ("marl_ppo.rollout",),
    ("marl_ppo.algo",),
    ("marl_ppo.eval",),  # evaluation, and the scores of a policy: returns, against random, exploitability
    # competitive training's pools, matches and ratings; policies out of a run
    ("marl_ppo.league", "marl_ppo.export"),
    ("marl_ppo.logs",),  # the run logger, its scalar backends and the experiment trackers
    ("marl_ppo.run",),
    ("marl_ppo.analysis",),
    ("marl_ppo.tune",),  # searches that train and score runs
    ("marl_ppo.cli", "marl_ppo.__main__", "marl_ppo.api", "marl_ppo"),
]
"""Lowest first, whole folders only. A module may import from its own layer and the layers below, never
from above."""


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every marl_ppo module `path` imports, at the top or inside a function (a lazy import is still an edge)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    modules = _modules()
    return {name for name in names if name in modules}


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> int:
    """The layer of the longest prefix that names the module."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            below = module.startswith(prefix + ".") and prefix != "marl_ppo"  # the package itself: exactly
            if (module == prefix or below) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} is in no layer of LAYERS; add it"
    return best


def test_every_import_goes_down_the_pipeline():
    upward = []
    for module, path in _modules().items():
        for imported in _imports(path):
            if _layer(imported) > _layer(module):
                upward.append(f"{module} -> {imported}")
    assert not upward, "imports that reach up the layers:\n" + "\n".join(sorted(upward))


def test_the_layers_name_whole_folders_and_top_level_modules():
    named = [prefix for prefixes in LAYERS for prefix in prefixes if prefix != "marl_ppo"]
    for prefix in named:
        parts = prefix.split(".")
        assert len(parts) == 2, f"{prefix}: a layer names a folder or a top-level module, not a part of one"
        assert (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file(), prefix
    assert len(named) == len(set(named))


def test_no_import_cycles():
    graph = defaultdict(set)
    for module, path in _modules().items():
        for imported in _imports(path):
            if imported != module and not module.startswith(imported + "."):  # a package's own __init__
                graph[module].add(imported)
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(_modules()):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_package_never_imports_the_benchmarks():
    """bench/ sits beside the package, outside the wheel: an installed marl_ppo could not import it."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            assert not [n for n in names if n == "bench" or n.startswith("bench.")], path


def test_the_maths_and_the_fast_pieces_import_nothing_of_the_framework():
    for module in ("marl_ppo.algo.gae", "marl_ppo.algo.losses", "marl_ppo.models.value_norm"):
        assert _imports(_modules()[module]) == set(), module
    for module, path in _modules().items():
        if module.startswith("marl_ppo.fast"):
            assert _imports(path) <= {"marl_ppo.fast"}, module


def test_the_rollout_layer_knows_envs_by_their_protocol():
    concrete = ("marl_ppo.envs.vector.sync", "marl_ppo.envs.vector.subprocess", "marl_ppo.envs.vmas")
    collector = _imports(PACKAGE / "rollout" / "collector.py")
    assert not [name for name in collector if name.startswith(concrete)]
    assert "marl_ppo.envs.vector.base" in collector


def test_only_the_loop_builds_the_logger_and_the_cli_only_calls_the_library():
    users = [_module_name(p) for p in PACKAGE.rglob("*.py") if "marl_ppo.logs.logger" in _imports(p)]
    assert users == ["marl_ppo.run.loop"]
    assert not [name for name in _imports(PACKAGE / "cli.py") if name.startswith("marl_ppo.algo")]


def test_the_top_level_is_small_and_every_room_says_what_it_is_for():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top
    for init in PACKAGE.rglob("__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 30, f"{init.relative_to(ROOT)} needs a docstring"


def test_every_package_is_installed():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {_module_name(init) for init in PACKAGE.rglob("__init__.py")} | {"marl_ppo_examples"}
    assert listed == found


def test_the_example_envs_install_under_their_own_name_not_as_a_bare_envs(tmp_path):
    def runs(code: str) -> bool:
        return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True).returncode == 0

    assert not runs("import envs")
    assert runs("import marl_ppo_examples.matrix_game")
    assert runs("from marl_ppo.envs.registry import env_spec; env_spec('envs/matrix_game_v0').load()")
