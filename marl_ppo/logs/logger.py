"""Run logging: scalars to the backends (`log.backends`), console progress, and the episode-return window."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import torch

from marl_ppo.algo.stats import TrainStats
from marl_ppo.eval.evaluate import side_returns, zero_sum
from marl_ppo.logs.backends import LogBackend, TensorBoardBackend
from marl_ppo.rollout.source import EpisodeRecord

Headline = Callable[["RunLogger"], str]
"""What a progress line says of the run after its step and speed (`team_return_headline`, `game_headline`)."""


def team_return_headline(logger: RunLogger) -> str:
    """The mean team return of the recent episodes."""
    if not logger.team_returns:
        return "no episode finished yet"
    agents = np.stack(logger.agent_returns)
    if zero_sum(np.array(logger.team_returns), agents):  # the sum is 0 by the game's rules: show each side
        return (
            f"zero-sum: returns {side_returns(logger.agents, agents)} (last {len(agents)} episodes); "
            "eval.vs_random=seats scores the policy against random players"
        )
    return f"team return {logger.team_return_mean:.2f} (last {len(logger.team_returns)} episodes)"


def game_headline(logger: RunLogger) -> str:
    """For a game, whose team return says nothing (zero-sum: always 0): the last scores against random
    opponents (`eval.vs_random`), the recent episodes' length and the policy's entropy."""
    if not logger.team_returns:
        return "no episode finished yet"
    scores = {
        k.removeprefix("eval/vs_random/"): v
        for k, v in logger.latest.items()
        if k.startswith("eval/vs_random/")
    }
    if "win_rate" in scores:
        versus = f"vs random win rate {scores['win_rate']:.2f} (at step {logger.versus_step})"
    elif scores:
        teams = ", ".join(
            f"{k.removesuffix('/team_return')} {v:.2f}"
            for k, v in scores.items()
            if k.endswith("/team_return")
        )
        versus = f"vs random team return {teams} (at step {logger.versus_step})"
    else:
        versus = "no evaluation against random yet"
    length = float(np.mean(logger.episode_lengths))
    entropy = logger.latest.get("train/entropy", float("nan"))
    return f"{versus}, episode length {length:.1f}, entropy {entropy:.2f}"


def exploitability_headline(logger: RunLogger) -> str:
    """For a game whose exploitability is computed (`eval.nash_conv`): the last NashConv, the recent
    episodes' length and the policy's entropy."""
    if not logger.team_returns:
        return "no episode finished yet"
    nash_conv = logger.latest.get("eval/nash_conv")
    score = (
        "no NashConv yet" if nash_conv is None else f"NashConv {nash_conv:.3f} (at step {logger.eval_step})"
    )
    length = float(np.mean(logger.episode_lengths))
    entropy = logger.latest.get("train/entropy", float("nan"))
    return f"{score}, episode length {length:.1f}, entropy {entropy:.2f}"


class RunLogger:
    """Writes `train/`, `rollout/`, `perf/` and `agents/<id>/` scalars against env steps to its backends, and the progress."""

    def __init__(
        self,
        run_dir: Path,
        *,
        agents: Sequence[str],
        groups: dict[str, Sequence[str]],
        total_steps: int,
        return_window: int,
        per_agent: bool,
        progress: bool,
        episodes: Literal["each", "update"] = "each",
        resume_step: int | None = None,
        stream: TextIO | None = None,
        headline: Headline = team_return_headline,
        backends: Sequence[LogBackend] | None = None,
    ) -> None:
        """`resume_step`: continue a run checkpointed at this env step, dropping what it logged after.
        `headline`: what a progress line says of the run. `episodes`: `log.episodes`, whether each
        finished episode is written or each update's means.

        `progress` writes to `stream` (default stderr): a redrawn bar on a terminal, else `ProgressLines`.
        `backends` receive the scalars (default: TensorBoard in `run_dir/tensorboard`).
        """
        self.backends = (
            list(backends) if backends is not None else [TensorBoardBackend(run_dir, resume_step=resume_step)]
        )
        self.agents = tuple(agents)
        # per-group returns matter for competitive teams (red vs blue); one group needs no breakdown
        self.group_columns = (
            {name: [self.agents.index(a) for a in members] for name, members in groups.items()}
            if len(groups) > 1
            else {}
        )
        self.per_agent = per_agent
        self.each_episode = episodes == "each"
        self.team_returns: deque[float] = deque(maxlen=return_window)
        self.episode_lengths: deque[int] = deque(maxlen=return_window)
        self.latest: dict[str, float] = {}
        """The last value of each tag logged by an update or `scalars` (not per episode)."""
        self.versus_step = 0
        """The step of the last scores against random opponents (`eval/vs_random/`)."""
        self.eval_step = 0
        """The step of the last periodic evaluation (`eval/`)."""
        self.headline = headline
        self.agent_returns: deque[np.ndarray] = deque(maxlen=return_window)
        self.episodes = 0
        self.bar = None
        self.lines: ProgressLines | None = None
        stream = sys.stderr if stream is None else stream
        if progress and _is_terminal(stream):  # a terminal redraws the bar in place
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_steps,
                initial=resume_step or 0,
                unit="step",
                unit_scale=True,
                dynamic_ncols=True,
                smoothing=0.1,
                file=stream,
            )
        elif progress:  # a log file or a pipe keeps every character: plain lines, no redraws
            self.lines = ProgressLines(stream, total_steps=total_steps, start_step=resume_step or 0)

    @property
    def team_return_mean(self) -> float:
        """Mean team return (sum over agents) of the recent episodes; nan before the first."""
        return float(np.mean(self.team_returns)) if self.team_returns else float("nan")

    @property
    def agent_return_mean(self) -> float:
        """Mean over agents and recent episodes of each agent's return; nan before the first."""
        return float(np.mean(np.stack(self.agent_returns))) if self.agent_returns else float("nan")

    def episodes_done(self, episodes: Sequence[EpisodeRecord], step: int | None = None) -> None:
        """Add the finished episodes to the return window and log them: each at the env step it ended,
        or (`episodes="update"`) each tag's mean over them and their count at `step`, the update's."""
        if not episodes:
            return
        self.episodes += len(episodes)
        team = np.array([e.team_return for e in episodes], dtype=np.float64)
        agents = np.stack([e.agent_returns for e in episodes])  # (episodes, agents)
        self.team_returns.extend(team.tolist())
        self.episode_lengths.extend(e.length for e in episodes)
        self.agent_returns.extend(agents)
        columns = {
            "rollout/team_return": team,
            "rollout/agent_return": agents.mean(axis=1),
            "rollout/episode_length": np.array([e.length for e in episodes]),
        }
        if episodes[0].won is not None:  # 1 for a won episode, 0 otherwise: its mean is the win rate
            columns["rollout/won"] = np.array([float(bool(e.won)) for e in episodes])
        for name, members in self.group_columns.items():
            columns[f"groups/{name}/return"] = agents[:, members].sum(axis=1)
        if self.per_agent:
            columns.update((f"agents/{agent}/return", agents[:, i]) for i, agent in enumerate(self.agents))
        if not self.each_episode:
            if step is None:
                raise ValueError("episodes_done: logging each update's means needs the update's step")
            means = [(tag, float(column.mean())) for tag, column in columns.items()]
            self._write(step, [*means, ("rollout/episodes", len(episodes))])
            return
        by_step: dict[int, list[tuple[str, Any]]] = {}  # episodes of many copies end at the same step
        for row, episode in enumerate(episodes):
            by_step.setdefault(episode.end_step, []).extend(
                (tag, column[row]) for tag, column in columns.items()
            )
        for step, pairs in by_step.items():
            self._write(step, pairs)

    def update_done(self, step: int, stats: TrainStats, extra: dict[str, float]) -> None:
        """Log one update's training statistics and `extra` scalars (full tags), advance the progress bar."""
        self._scalars(step, {**stats.scalars(), **extra})
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(f"sps={extra.get('perf/sps', 0):.0f}, {self.headline(self)}")
        if self.lines is not None:
            self.lines.update(step, self.headline(self))

    def state_dict(self) -> dict[str, Any]:
        """The episode counter and the return window."""
        agents = np.stack(self.agent_returns) if self.agent_returns else np.zeros((0, len(self.agents)))
        return {
            "episodes": self.episodes,
            "team_returns": torch.tensor(list(self.team_returns), dtype=torch.float64),
            "agent_returns": torch.from_numpy(agents.astype(np.float64)),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`."""
        self.episodes = int(state["episodes"])
        self.team_returns.clear()
        self.team_returns.extend(state["team_returns"].tolist())
        self.agent_returns.clear()
        self.agent_returns.extend(row.numpy() for row in state["agent_returns"])

    def flush(self) -> None:
        """Write pending scalars to disk (before a checkpoint, so that a killed run loses none of them)."""
        for backend in self.backends:
            backend.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log scalars given by full tag (e.g. an evaluation's `eval/` tags) at `step`."""
        self._scalars(step, values)

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """Give every backend the run's resolved config."""
        for backend in self.backends:
            backend.hyperparameters(config)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Give every backend the finished run's summary."""
        for backend in self.backends:
            backend.summary(values)

    def video(self, step: int, path: Path) -> None:
        """Give every backend a recorded episode (a file in the run directory)."""
        for backend in self.backends:
            backend.video(step, path)

    def _scalars(self, step: int, values: Mapping[str, Any]) -> None:
        self.latest.update(values)
        if any(tag.startswith("eval/vs_random/") for tag in values):
            self.versus_step = step
        if any(tag.startswith("eval/") for tag in values):
            self.eval_step = step
        self._write(step, values.items())

    def _write(self, step: int, pairs: Iterable[tuple[str, Any]]) -> None:
        """Every scalar of `step` to every backend, as `(tag, float)` pairs (a tag may repeat)."""
        logged = [(tag, float(value)) for tag, value in pairs]
        if not logged:
            return
        for backend in self.backends:
            backend.scalars(step, logged)

    def close(self) -> None:
        """Close the backends and the progress bar."""
        for backend in self.backends:
            backend.close()
        if self.bar is not None:
            self.bar.close()


class ProgressLines:
    """Progress as plain lines, for a log file or a pipe: one each `1/lines` of total_steps, one at the end.

    A line reads `step 50000/1000000 (5%): 1234 steps/s, team return -65.30 (last 100 episodes)` (the
    part after the speed is the run's `Headline`); steps/s is measured since the previous line.
    """

    def __init__(self, stream: TextIO, *, total_steps: int, start_step: int = 0, lines: int = 20) -> None:
        self.stream: TextIO | None = stream
        self.total_steps = total_steps
        self.lines = lines
        self.shown = self._part(start_step)
        self.last_step, self.last_time = start_step, time.monotonic()

    def _part(self, step: int) -> int:
        """How many `1/lines` parts of total_steps `step` has completed."""
        return min(step, self.total_steps) * self.lines // self.total_steps

    def update(self, step: int, recent: str) -> None:
        """Write a line, ending in `recent`, when `step` completes a new part (the last part ends at total_steps)."""
        part = self._part(step)
        if self.stream is None or part <= self.shown:
            return
        now = time.monotonic()
        sps = (step - self.last_step) / max(now - self.last_time, 1e-9)
        self.shown, self.last_step, self.last_time = part, step, now
        percent = 100 * min(step, self.total_steps) // self.total_steps
        try:
            print(
                f"step {step}/{self.total_steps} ({percent}%): {sps:.0f} steps/s, {recent}",
                file=self.stream,
                flush=True,
            )
        except OSError:  # the reader went away (a closed pipe): train on without progress
            self.stream = None


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False
