"""A person in one seat of a game: the seat's `Acting`, which shows the position, lists the allowed
actions and reads the one the person types.

Input and output go through the streams the prompt is given (a terminal's by default), so a test can
play a game by writing lines. Input that is no allowed action (not a number or an action's name,
out of range, not allowed by the mask now) is refused in one line and asked again; `q` or the end
of the input ends the session (`SessionEnded`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TextIO, runtime_checkable

import gymnasium as gym
import numpy as np
import torch

from marl_ppo.envs.layout import channels_last, feature_space
from marl_ppo.envs.spec import GroupSpec, TeamArrays, TeamSpec
from marl_ppo.eval.evaluate import EvalError

QUIT = ("q", "quit")
"""What a person types to end the session."""

SHOWN_VALUES = 48
"""An observation shown as numbers shows at most this many of them."""

PLANE_MARKS = "XO#@"
"""The marks of a board observation's planes 0, 1, 2, 3 (an empty cell is '.')."""

ACTION_NAMES: dict[str, Callable[[int], str]] = {
    # PettingZoo's tic-tac-toe numbers the cells column by column: 0 3 6 / 1 4 7 / 2 5 8
    "classic/tictactoe_v3": lambda action: f"row {action % 3 + 1}, column {action // 3 + 1}",
    "classic/rps_v2": lambda action: ("rock", "paper", "scissors")[action],
}
"""Names of the actions of the shipped games whose actions are numbers with a fixed meaning."""


@dataclass(frozen=True)
class BoardView:
    """How a game's board observation is drawn."""

    transposed: bool = False
    """The observation holds the board's columns as its rows (drawn transposed, to read as the env's
    own picture does)."""
    numbered: bool = False
    """An empty cell shows the action that plays there: the cell's row-major index in the observation."""
    legend: str = (
        "X plane 0, O plane 1 of your observation; in PettingZoo's board games plane 0 holds your pieces"
    )


BOARDS: dict[str, BoardView] = {
    "classic/tictactoe_v3": BoardView(
        transposed=True,
        numbered=True,
        legend="X yours, O your opponent's; a number is the action that marks there",
    ),
    "classic/connect_four_v3": BoardView(
        legend="X yours, O your opponent's; the column numbers are the actions"
    ),
}
"""The shipped board games whose observation is drawn other than plainly (`BoardView()`)."""


@runtime_checkable
class NamesActions(Protocol):
    """An env that names an agent's actions in its current state (OpenSpiel's games do; so may yours)."""

    def action_names(self, agent: str) -> Sequence[str]:
        """One name per action, in action order."""
        ...


@runtime_checkable
class DescribesPosition(Protocol):
    """An env that says in words what an agent knows of the game now (shown before the person's moves)."""

    def position_text(self, agent: str) -> str:
        """The text a person reads to choose `agent`'s next action."""
        ...


class SessionEnded(Exception):
    """The person ended the session: typed `q`, or the input ended."""


class IllegalInput(ValueError):
    """A typed line that is no allowed action; its message is the one line the person reads."""


class LineReader(Protocol):
    """Where typed lines come from (a terminal's standard input, or a test's stream)."""

    def readline(self) -> str:
        """The next line with its newline; '' at the end of the input."""
        ...


@dataclass(frozen=True)
class Seat:
    """The agent a person plays: its group, its index in the group, and its action's parts."""

    agent: str
    group: GroupSpec
    index: int
    sizes: tuple[int, ...]
    """The number of choices of each part of an action: `(n,)` for Discrete(n), `nvec` for MultiDiscrete
    (a person types one number per part)."""

    def parts(self, mask: np.ndarray) -> list[np.ndarray]:
        """A flat action mask (`(sum(sizes),)`, or empty: every action allowed) split into one per part."""
        if mask.size == 0:
            return [np.ones(size, dtype=bool) for size in self.sizes]
        return np.split(mask.astype(bool), np.cumsum(self.sizes)[:-1])


def seat_of(spec: TeamSpec, agent: str) -> Seat:
    """The seat of agent `agent`, refused in one line unless it is an agent whose actions a person can
    type (a number, or one per part: Discrete or MultiDiscrete actions)."""
    if agent not in spec.agents:
        raise EvalError(
            f"--human '{agent}' is not an agent of env '{spec.env_id}'; pick one of {', '.join(spec.agents)}"
        )
    group, index = spec.group_of(agent)
    space = group.action_space
    if isinstance(space, gym.spaces.Discrete):
        return Seat(agent, group, index, (int(space.n),))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return Seat(agent, group, index, tuple(int(n) for n in space.nvec.reshape(-1)))
    raise EvalError(
        f"--human {agent}: its actions ({space}) are continuous, which a person cannot type; "
        "play a seat whose actions are Discrete or MultiDiscrete"
    )


def action_names(env_id: str, count: int) -> list[str] | None:
    """The names of a shipped game's `count` actions, or None where its actions have no names here."""
    name = ACTION_NAMES.get(env_id)
    if name is None:
        return None
    try:
        return [name(action) for action in range(count)]
    except IndexError:  # a game built with more actions than the names cover (rps with lizard and spock)
        return None


def observation_text(group: GroupSpec, obs: np.ndarray, board: BoardView | None = None) -> str:
    """A short text of one agent's flat observation: a board of marks for a board observation (a small
    (H, W, C) Box of 0/1 planes, C at most 4), drawn as `board` says, else its first values."""
    shape = _board_shape(group)
    if shape is not None:
        return board_text(obs.reshape(shape), board or BoardView())
    values = np.array2string(obs[:SHOWN_VALUES], precision=3, suppress_small=True, max_line_width=100)
    more = f" ... ({obs.size} values)" if obs.size > SHOWN_VALUES else ""
    return f"observation: {values}{more}"


def _board_shape(group: GroupSpec) -> tuple[int, int, int] | None:
    """(H, W, C) where the group's observation is a board of 0/1 planes stored flat, else None."""
    space = feature_space(group.observation_space)
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and channels_last(space.shape)):
        return None
    height, width, planes = (int(n) for n in space.shape)
    binary = bool(np.all(space.low >= 0) and np.all(space.high <= 1))
    flat = group.obs_dim == height * width * planes and all(
        part.pool == 1 for part in (group.obs_layout.parts if group.obs_layout else ())
    )
    return (height, width, planes) if binary and flat and planes <= len(PLANE_MARKS) else None


def board_text(planes: np.ndarray, view: BoardView) -> str:
    """Rows of marks, one per cell: the mark of the first plane set there (`PLANE_MARKS`); an empty cell
    '.' (rows and columns numbered from 0) or, on a numbered board, the action that plays there."""
    height, width, count = planes.shape
    marks = np.full((height, width), ".", dtype=object)
    if view.numbered:
        marks[...] = np.arange(height * width).reshape(height, width).astype(str)
    for plane in reversed(range(count)):  # the first plane set wins
        marks[planes[:, :, plane] > 0.5] = PLANE_MARKS[plane]
    if view.transposed:
        marks = marks.T
    size = max(len(str(mark)) for mark in marks.flat)
    rows = [" ".join(f"{mark:>{size}}" for mark in row) for row in marks]
    if not view.numbered:
        rows = ["   " + " ".join(f"{c % 10:>{size}}" for c in range(marks.shape[1]))] + [
            f"{r:>2} {row}" for r, row in enumerate(rows)
        ]
    return "\n".join([*rows, f"({view.legend})"])


def parse_action(text: str, allowed: Sequence[np.ndarray], names: Sequence[str] | None) -> tuple[int, ...]:
    """The action a typed line names, one number per part (`allowed`: per part, a bool per choice; a
    one-part action may also be named, any case), if every part is allowed now; else IllegalInput with
    the one line that says why. `q` or `quit` raise SessionEnded."""
    typed = text.strip()
    if typed.lower() in QUIT:
        raise SessionEnded("quit")
    words = typed.split()
    if len(allowed) == 1:
        lowered = [n.lower() for n in names] if names is not None else []
        words = [str(lowered.index(typed.lower()))] if typed.lower() in lowered else [typed]
    elif len(words) != len(allowed):
        raise IllegalInput(
            f"'{typed}' is not an action: type {len(allowed)} numbers, one per part (q ends the session)"
        )
    return tuple(
        _part(word, choices, part, len(allowed))
        for part, (word, choices) in enumerate(zip(words, allowed, strict=True))
    )


def _part(word: str, allowed: np.ndarray, part: int, parts: int) -> int:
    """One part's typed number, if allowed now; else IllegalInput (naming the part where there are several)."""
    where = f"part {part + 1}: " if parts > 1 else ""
    legal = [int(a) for a in np.flatnonzero(allowed)]
    try:
        action = int(word)
    except ValueError:
        raise IllegalInput(
            f"{where}'{word}' is not an action: type one of {_listed(legal)} (q ends the session)"
        ) from None
    if not 0 <= action < len(allowed):
        raise IllegalInput(
            f"{where}{action} is out of range: actions are 0 to {len(allowed) - 1}; allowed now {_listed(legal)}"
        )
    if not allowed[action]:
        raise IllegalInput(f"{where}{action} is not allowed now: type one of {_listed(legal)}")
    return action


def _listed(actions: Sequence[int]) -> str:
    return ", ".join(str(a) for a in actions)


class Prompt:
    """Asks a person for one action: shows the position (`show`), lists the allowed actions, reads lines
    until one is an allowed action."""

    def __init__(
        self,
        *,
        reader: LineReader,
        writer: TextIO,
        show: Callable[[np.ndarray | None], str | None],
        names: Callable[[], Sequence[str] | None] = lambda: None,
    ) -> None:
        """`show(obs)`: the text that shows the position before a move, from the seat's observation where
        it needs one (None: nothing to show, or a window shows it); `names()`: the actions' names now, or None."""
        self.reader, self.writer, self.show, self.names = reader, writer, show, names

    def ask(self, obs: np.ndarray, allowed: Sequence[np.ndarray], heading: str) -> tuple[int, ...]:
        """The allowed action the person types after `heading`, one number per part (`allowed`: per part,
        a bool per choice)."""
        view = self.show(obs)
        self.say(heading if view is None else f"{heading}\n{view}")
        names = self.names() if len(allowed) == 1 else None
        if len(allowed) == 1:
            legal = np.flatnonzero(allowed[0])
            self.say("allowed: " + ", ".join(f"{a} ({names[int(a)]})" if names else str(a) for a in legal))
        else:
            listed = (f"part {p + 1}: {_listed(np.flatnonzero(c).tolist())}" for p, c in enumerate(allowed))
            self.say(f"allowed (type {len(allowed)} numbers): " + "; ".join(listed))
        while True:
            self.writer.write("your action> ")
            self.writer.flush()
            line = self.reader.readline()
            if not line:
                raise SessionEnded("input ended")
            try:
                return parse_action(line, allowed, names)
            except IllegalInput as refused:
                self.say(str(refused))

    def say(self, text: str) -> None:
        """Write a line (or lines) and flush: the person reads it before typing."""
        self.writer.write(text + "\n")
        self.writer.flush()


class HumanSeat:
    """The `Acting` of one seat played by a person: the typed action where that agent is to act, 0 for
    every other agent (a seated match takes only the seat's action from this player)."""

    def __init__(self, spec: TeamSpec, seat: str, device: torch.device, prompt: Prompt) -> None:
        self.spec, self.device, self.prompt = spec, device, prompt
        self.seat = seat_of(spec, seat)
        self.game, self.move = 0, 0
        """The game being played (from 0) and the moves the person made in it."""

    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """Per group, `(1, A_g, ...)` actions: the person's for the seat where it is alive, else zeros."""
        actions = {
            group.name: torch.from_numpy(
                np.zeros((1, group.num_agents, *group.action_shape), group.action_dtype)
            ).to(self.device)
            for group in self.spec.groups
        }
        seat = self.seat
        mine = arrays.groups[seat.group.name]
        if bool(mine.alive[0, seat.index]):
            obs = np.asarray(mine.obs[0, seat.index])
            allowed = seat.parts(np.asarray(mine.action_mask[0, seat.index]))
            heading = f"game {self.game + 1}, your move {self.move + 1} as {seat.agent}:"
            chosen = self.prompt.ask(obs, allowed, heading)
            actions[seat.group.name][0, seat.index] = torch.tensor(
                chosen if seat.group.action_shape else chosen[0], device=self.device
            )
            self.move += 1
        return actions

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """Count the games: a new one starts after an episode ends."""
        if bool(episode_over[0]):
            self.game, self.move = self.game + 1, 0
