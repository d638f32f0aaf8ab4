"""Which code trained a run: `code.json` in the run directory, read back by `report` to keep versions apart.

A run records the package version and, when marl_ppo is imported from a git checkout, the commit,
the git tree of the package directory at that commit (`tree`: it changes only when the package's
code does, not with a docs or experiment-file commit) and whether the package's tracked files
differed from it (`dirty`); a run of a user's env file also records the file's absolute path and
content hash (`env_file`). A resumed run keeps the record of its start
and appends the code of each resume that ran other code (`resumes`), so a run trained by two
versions says so.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from marl_ppo.envs.registry import env_file

FILE = "code.json"


def current_code() -> dict[str, Any]:
    """The running marl_ppo: `{"version", "commit", "tree", "dirty"}`; all but the version are None
    outside a git checkout."""
    try:
        version = metadata.version("marl-ppo")
    except metadata.PackageNotFoundError:  # the source tree on sys.path, not installed
        version = "unknown"
    record: dict[str, Any] = {"version": version, "commit": None, "tree": None, "dirty": None}
    source = Path(__file__).resolve().parent.parent  # the marl_ppo package directory
    try:
        commit = _git(source, "rev-parse", "HEAD")
        tree = _git(source, "rev-parse", "HEAD:./")
        changed = _git(source, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):  # no git, not a checkout, or a hung git
        return record
    record.update(commit=commit, tree=tree, dirty=bool(changed))
    return record


def _git(where: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.strip()


def env_file_record(env_id: str) -> dict[str, str] | None:
    """A user's env file that `env_id` names: `{"path", "sha256"}` (its absolute path and its content's
    hash); None for other ids."""
    path = env_file(env_id)
    if path is None or not path.is_file():
        return None
    return {"path": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def write_code_record(run_dir: Path, *, resume: bool, env_id: str | None = None) -> None:
    """Write `code.json` for a new run (with the user's env file that `env_id` names, `env_file`); on
    resume, add today's code to `resumes` when it differs."""
    path = run_dir / FILE
    code = current_code()
    file = None if env_id is None else env_file_record(env_id)
    if file is not None:
        code["env_file"] = file
    if resume and path.is_file():
        record = json.loads(path.read_text())
        ran = [{k: record.get(k) for k in code}, *record.get("resumes", [])]
        if code in ran:
            return
        record["resumes"] = [*record.get("resumes", []), code]
    else:
        record = code
    path.write_text(json.dumps(record, indent=2) + "\n")


def code_label(run_dir: Path) -> str:
    """A short name for the code that trained the run: the version and the package tree's hash
    (`0.1.0@1a2b3c4d`), `+dirty` after uncommitted edits, `+resumed` when resumed with other code;
    `unknown` for a run without a record (written before there was one)."""
    path = run_dir / FILE
    if not path.is_file():
        return "unknown"
    record = json.loads(path.read_text())
    label = str(record.get("version", "?"))
    if record.get("tree"):
        label += f"@{str(record['tree'])[:8]}" + ("+dirty" if record.get("dirty") else "")
    if record.get("resumes"):
        label += "+resumed"
    return label
