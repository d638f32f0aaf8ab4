"""The scripts docs/ tells users to run import against today's package (a moved name breaks them
without any other test noticing)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "docs").rglob("*.py"))


def test_docs_has_scripts():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.relative_to(ROOT / "docs").as_posix())
def test_a_docs_script_imports_without_running(path):
    source = path.read_text()
    assert 'if __name__ == "__main__":' in source, f"{path.name} runs on import"
    spec = importlib.util.spec_from_file_location(f"docs_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"
