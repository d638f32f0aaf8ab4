"""`marl-ppo play`: a person plays one seat of a run's env, the run's trained policy every other seat.

The policy is the checkpoint's, loaded as `marl-ppo eval` loads it; the person's seat is a
`HumanSeat`, seated beside the policy as a match seats its players (`SeatedActing`), on one env copy
that keeps each game's last position until the next game starts (`OneCopy`). Before each of the
person's moves the position is shown: what the env says the seat knows (`DescribesPosition`), the
env's text rendering where it has one (`render_mode='ansi'`), its own window where it has a `human`
render mode and a screen is there, else the seat's observation (a board of marks, or its first
values); the allowed actions are named where the env (`NamesActions`) or a shipped game names them.
Every game is recorded as played (`game_record.py`); Ctrl-C, `q` or the end of the input ends the
session and keeps what was played.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import ExperimentConfig, build_config, merge, parse_overrides
from marl_ppo.envs.factory import make_team_env
from marl_ppo.envs.registry import EnvError, resolve_factory
from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.eval.evaluate import (
    MAX_EPISODE_STEPS,
    EvalError,
    _global_rng_untouched,
    eval_config,
    eval_seed,
    evaluation_step,
)
from marl_ppo.eval.game_record import GameRecord, open_record
from marl_ppo.eval.human import (
    BOARDS,
    DescribesPosition,
    HumanSeat,
    LineReader,
    NamesActions,
    Prompt,
    Seat,
    SessionEnded,
    action_names,
    observation_text,
    seat_of,
)
from marl_ppo.eval.loading import load_policy, resolve_checkpoint
from marl_ppo.eval.one_copy import OneCopy
from marl_ppo.eval.seated import SeatedActing, side_members
from marl_ppo.eval.video import takes_render_mode
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_eval
from marl_ppo.rollout.stepper import Acting, Finished, PolicyActing, Stepper


@dataclass(frozen=True)
class PlayOutput:
    """What a session played and where its record is."""

    record: Path
    returns: list[dict[str, float]]
    """Per finished game, each agent's return."""
    ended: str | None = None
    """Why the session stopped before its last game (`interrupted`, `quit`, `input ended`); None if it did not."""


def play_checkpoint(
    target: Path | str,
    *,
    human: str,
    games: int = 1,
    record: Path | str | None = None,
    seed: int | None = None,
    deterministic: bool = False,
    overrides: Sequence[str] = (),
    window: bool = True,
    reader: LineReader | None = None,
    writer: TextIO | None = None,
) -> PlayOutput:
    """Play `games` games of a run's env (with key=value overrides) by hand in seat `human`, the
    checkpoint's policy in every other seat; record them. `window=False` never opens the env's window."""
    reader, writer = reader or sys.stdin, writer or sys.stdout
    if games < 1:
        raise EvalError(f"--games {games} must be at least 1")
    checkpoint, run_dir = resolve_checkpoint(target)
    payload = load_checkpoint(checkpoint)
    plan = plan_eval(build_config(merge(payload["config"], parse_overrides(overrides))))
    config, device = plan.config, plan.device
    if not isinstance(plan.layout, TeamSpec):
        raise EvalError(
            f"env '{config.env.id}' is a batched env (VMAS, JaxMARL), which cannot be played by hand yet"
        )
    spec = plan.layout
    seat = seat_of(spec, human)  # an unknown seat or one a person cannot type for stops here
    seed = eval_seed(config) if seed is None else seed
    model = load_policy(payload, spec, config, device)
    env, mode = table_env(config, window=window)
    try:
        path, file = open_record(Path(record) if record is not None else None, run_dir)
        log = GameRecord(path, file, spec)
        try:
            log.session(
                checkpoint=str(checkpoint),
                env={"id": config.env.id, "kwargs": config.env.kwargs},
                human=human,
                seed=seed,
                deterministic=deterministic,
            )
            prompt = Prompt(
                reader=reader,
                writer=writer,
                show=_shower(env, mode, spec, human),
                names=_namer(env, config.env.id, seat),
            )
            session = Session(OneCopy(env, spec), model, device, human=human, prompt=prompt, record=log)
            output = session.play(games, seed=seed, deterministic=deterministic)
        finally:
            log.close()
    finally:
        env.close()
    return output


def has_screen() -> bool:
    """Whether a window can open: macOS and Windows, or an X11 or Wayland display."""
    return sys.platform in ("darwin", "win32") or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )


def table_env(config: ExperimentConfig, *, window: bool) -> tuple[Any, str | None]:
    """One copy of the configured env to play on, and its render mode: `ansi` where the env declares it,
    `human` (its own window) where it declares that, `window` and a screen allow it, else None."""
    env = make_team_env(eval_config(config, 1))
    modes = list((getattr(env, "metadata", None) or {}).get("render_modes") or [])
    mode = "ansi" if "ansi" in modes else "human" if window and "human" in modes and has_screen() else None
    factory, _ = resolve_factory(config.env.id)
    if mode is None or not takes_render_mode(factory):
        return env, None
    env.close()
    try:
        return make_team_env(eval_config(config, 1, render_mode=mode)), mode
    except EnvError as err:
        if mode == "ansi":  # no text of its own after all: the observation shows the position
            return make_team_env(eval_config(config, 1)), None
        raise EvalError(
            f"env '{config.env.id}' cannot be built with render_mode='human' to show the game in its "
            f"window: {err}; use --no-window"
        ) from err


def _shower(
    env: Any, mode: str | None, spec: TeamSpec, seat: str
) -> Callable[[np.ndarray | None], str | None]:
    """The prompt's view of the position: what the env says the seat knows (`DescribesPosition`), its
    text, its window (drawn, no text), or the seat's observation (none where there is no observation)."""
    own = _innermost(env)
    if isinstance(own, DescribesPosition):
        return lambda obs: own.position_text(seat)
    if mode == "ansi":
        return lambda obs: str(env.render()).rstrip("\n")

    if mode == "human":

        def draw(obs: np.ndarray | None) -> None:
            env.render()
            return None

        return draw
    group = spec.group_of(seat)[0]
    board = BOARDS.get(spec.env_id)
    return lambda obs: None if obs is None else observation_text(group, obs, board)


def _innermost(env: Any) -> Any:
    """The env under its wrappers (PettingZoo's `unwrapped`; a plain object that has no wrappers is itself)."""
    return getattr(env, "unwrapped", env)


def _namer(env: Any, env_id: str, seat: Seat) -> Callable[[], Sequence[str] | None]:
    """The names of the seat's actions at each move: the env's own (`NamesActions`), else a shipped game's."""
    own = _innermost(env)
    if isinstance(own, NamesActions):
        return lambda: list(own.action_names(seat.agent))
    names = action_names(env_id, seat.sizes[0]) if len(seat.sizes) == 1 else None
    return lambda: names


class _Recorded:
    """An `Acting` that writes each step of the acting it wraps to the record (what it chose from,
    what it chose, the rewards it got)."""

    def __init__(self, acting: Acting, record: GameRecord, human: str) -> None:
        self.acting, self.record, self.human = acting, record, human
        self.game, self.step = 0, 0
        self._before: TeamArrays | None = None
        self._actions: dict[str, np.ndarray] = {}

    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """The wrapped acting's actions; the arrays they were chosen from are kept (the step overwrites them)."""
        actions = self.acting.act(arrays)
        self._before = arrays.map(np.copy)
        self._actions = {name: a.cpu().numpy() for name, a in actions.items()}
        return actions

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """The step's line; then the wrapped acting carries on."""
        assert self._before is not None, "advance follows act"
        self.record.step(self.game, self.step, self._before, self._actions, arrays, self.human)
        self.step += 1
        self.acting.advance(arrays, episode_over)


class Session:
    """Games on one env copy: the person in seat `human`, `model`'s policy in every other seat."""

    def __init__(
        self,
        table: OneCopy,
        model: TeamModel,
        device: torch.device,
        *,
        human: str,
        prompt: Prompt,
        record: GameRecord,
    ) -> None:
        self.table, self.model, self.device = table, model, device
        self.human, self.prompt, self.record = human, prompt, record

    def play(self, games: int, *, seed: int, deterministic: bool) -> PlayOutput:
        """Play `games` games (game g resets the env with `seed + g`; torch's generator seeded with `seed`
        for the policy's samples); stop early, keeping the record, on Ctrl-C, `q` or the end of input."""
        spec, device = self.table.spec, self.device
        person = HumanSeat(spec, self.human, device, self.prompt)
        others = tuple(agent for agent in spec.agents if agent != self.human)
        members = side_members(spec, {"policy": others, "person": (self.human,)}, device)
        policy = PolicyActing(self.model, 1, device, deterministic=deterministic)
        seated = SeatedActing([policy, person], members, 1, device)
        seated.seating = torch.tensor([[0, 1]])  # the policy on its side, the person on theirs
        acting = _Recorded(seated, self.record, self.human)
        stepper = Stepper(self.table, max_episode_steps=MAX_EPISODE_STEPS)
        returns: list[dict[str, float]] = []
        with _global_rng_untouched(device):
            torch.manual_seed(seed)
            for game in range(games):
                acting.game, acting.step = game, 0
                try:
                    stepper.reset(seed + game)
                    ended: list[Finished] = []
                    while not ended:
                        ended = evaluation_step(stepper, acting)
                except (SessionEnded, KeyboardInterrupt) as stop:
                    reason = "interrupted" if isinstance(stop, KeyboardInterrupt) else str(stop)
                    self.record.ended(game, reason)
                    self.prompt.say(f"\nsession ended ({reason}): {self._kept(returns)}")
                    return PlayOutput(self.record.path, returns, reason)
                finished = ended[0]
                self.record.game_over(game, finished.agent_returns, finished.length)
                returns.append(dict(zip(spec.agents, map(float, finished.agent_returns), strict=True)))
                self._show_end(game, returns[-1], finished.length)
        self.prompt.say(self._kept(returns))
        return PlayOutput(self.record.path, returns)

    def _show_end(self, game: int, returns: dict[str, float], length: int) -> None:
        """The last position and each agent's return."""
        try:
            last = self.table.observe(self.human)
        except Exception:  # an env that cannot be observed once its game is over: no last position shown
            last = None
        view = self.prompt.show(last)
        scores = ", ".join(f"{a}{' (you)' if a == self.human else ''} {r:+g}" for a, r in returns.items())
        self.prompt.say(
            (f"{view}\n" if view else "") + f"game {game + 1} over after {length} steps: {scores}"
        )

    def _kept(self, returns: list[dict[str, float]]) -> str:
        """Where the record is, and the person's mean return over the finished games."""
        mine = [r[self.human] for r in returns]
        mean = f", your mean return {np.mean(mine):+.3g}" if mine else ""
        return f"{len(returns)} game(s) finished{mean}; record: {self.record.path}"
