"""The JSONL record of games played by hand (`marl-ppo play`): every line written and flushed as played.

Lines, each a JSON object with a `type`:
- `session`, first: the checkpoint, env id, agents, the person's seat, the seed and whether the policy
  took its mode;
- `step`, one per env step: `game` and `step` (from 0), `human_moved` (the person acted at it), and
  per agent its `obs` (the flat observation the policy reads, as a list), `action` (null where the
  agent did not act), `reward` and, where the env masks actions, `allowed` (the mask, as 0/1);
- `game`, after a game's last step: its `returns` per agent and its `length` in steps;
- `ended`, last where the session stopped in the middle (Ctrl-C, `q`, end of input): the `reason`.

So a game stopped half-way keeps its steps, and a later behaviour-cloning partner can read the
person's moves (the steps where `human_moved`) with the observations they were made from.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.eval.evaluate import EvalError


def open_record(path: Path | None, run_dir: Path) -> tuple[Path, TextIO]:
    """A new record file, opened to write: `path`, or `RUN_DIR/play/games-<time>.jsonl`; an existing file
    is never overwritten (refused in one line where named, a numbered name where the default is taken)."""
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return path, path.open("x", encoding="utf-8")
        except FileExistsError:
            raise EvalError(
                f"--record '{path}' exists; name a new file (a record is never overwritten)"
            ) from None
        except OSError as err:
            raise EvalError(
                f"--record '{path}' cannot be written ({err.strerror or err}); pick another file"
            ) from None
    folder = run_dir / "play"
    stem = f"games-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EvalError(f"'{folder}' cannot be created ({err.strerror or err}); pass --record FILE") from None
    for number in range(1, 1000):
        candidate = folder / (f"{stem}.jsonl" if number == 1 else f"{stem}-{number}.jsonl")
        try:
            return candidate, candidate.open("x", encoding="utf-8")
        except FileExistsError:
            continue
    raise EvalError(f"'{folder}' has 999 records named {stem}*; pass --record FILE")


class GameRecord:
    """Writes the lines of the record (see the module) to an open file, flushing each."""

    def __init__(self, path: Path, file: TextIO, spec: TeamSpec) -> None:
        self.path, self.file, self.spec = path, file, spec
        self.lines = 0

    def write(self, line: dict[str, Any]) -> None:
        """One JSON line, flushed: on disk before the next move."""
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()
        self.lines += 1

    def session(self, **facts: Any) -> None:
        """The first line: what was played."""
        self.write({"type": "session", "agents": list(self.spec.agents), **facts})

    def step(
        self,
        game: int,
        step: int,
        before: TeamArrays,
        actions: dict[str, np.ndarray],
        after: TeamArrays,
        human: str,
    ) -> None:
        """A step's line: `before`, the arrays the actions were chosen from (a copy); `after`, the step's rewards."""
        agents: dict[str, Any] = {}
        for group in self.spec.groups:
            chosen, stepped = before.groups[group.name], after.groups[group.name]
            for i, agent in enumerate(group.agents):
                acted = bool(chosen.alive[0, i])
                entry: dict[str, Any] = {
                    "obs": np.asarray(chosen.obs[0, i]).tolist(),
                    "action": actions[group.name][0, i].tolist() if acted else None,
                    "reward": float(stepped.reward[0, i]),
                }
                if group.mask_source is not None and acted:
                    entry["allowed"] = np.asarray(chosen.action_mask[0, i], dtype=np.int8).tolist()
                agents[agent] = entry
        human_moved = agents[human]["action"] is not None
        self.write({"type": "step", "game": game, "step": step, "human_moved": human_moved, "agents": agents})

    def game_over(self, game: int, agent_returns: np.ndarray, length: int) -> None:
        """A game's last line: each agent's return and the game's length."""
        returns = {agent: float(r) for agent, r in zip(self.spec.agents, agent_returns, strict=True)}
        self.write({"type": "game", "game": game, "returns": returns, "length": length})

    def ended(self, game: int, reason: str) -> None:
        """The line of a session stopped in the middle of game `game`."""
        self.write({"type": "ended", "game": game, "reason": reason})

    def close(self) -> None:
        """Close the file."""
        self.file.close()
