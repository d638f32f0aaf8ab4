"""Run logging: TensorBoard scalars, a console progress bar, and the episode-return window."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marl_ppo.rollout.collector import EpisodeRecord
from marl_ppo.trainer import TrainStats


class RunLogger:
    """Writes `train/`, `rollout/`, `perf/` and `agents/<id>/` scalars against env steps."""

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
        resume_step: int | None = None,
    ) -> None:
        """`resume_step`: continue a run checkpointed at this env step, dropping what it logged after."""
        log_dir = run_dir / "tensorboard"
        if resume_step is not None:
            _wait_for_a_later_event_file_name(log_dir)
        # purge_step: TensorBoard's reader drops the killed run's events from this step on
        purge_step = None if resume_step is None else resume_step + 1
        self.writer = EventWriter(log_dir, purge_step=purge_step)
        self.agents = tuple(agents)
        # per-group returns matter for competitive teams (red vs blue); one group needs no breakdown
        self.group_columns = (
            {name: [self.agents.index(a) for a in members] for name, members in groups.items()}
            if len(groups) > 1
            else {}
        )
        self.per_agent = per_agent
        self.team_returns: deque[float] = deque(maxlen=return_window)
        self.agent_returns: deque[np.ndarray] = deque(maxlen=return_window)
        self.episodes = 0
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_steps,
                initial=resume_step or 0,
                unit="step",
                unit_scale=True,
                dynamic_ncols=True,
                smoothing=0.1,
            )

    @property
    def team_return_mean(self) -> float:
        """Mean team return (sum over agents) of the recent episodes; nan before the first."""
        return float(np.mean(self.team_returns)) if self.team_returns else float("nan")

    @property
    def agent_return_mean(self) -> float:
        """Mean over agents and recent episodes of each agent's return; nan before the first."""
        return float(np.mean(np.stack(self.agent_returns))) if self.agent_returns else float("nan")

    def episodes_done(self, episodes: Sequence[EpisodeRecord]) -> None:
        """Log each finished episode at the env step it ended and add it to the return window."""
        for episode in episodes:
            self.episodes += 1
            self.team_returns.append(episode.team_return)
            self.agent_returns.append(episode.agent_returns)
            values = {
                "rollout/team_return": episode.team_return,
                "rollout/agent_return": float(episode.agent_returns.mean()),
                "rollout/episode_length": episode.length,
            }
            for name, columns in self.group_columns.items():
                values[f"groups/{name}/return"] = float(episode.agent_returns[columns].sum())
            if self.per_agent:
                values.update(
                    (f"agents/{agent}/return", float(value))
                    for agent, value in zip(self.agents, episode.agent_returns, strict=True)
                )
            self.writer.scalars(episode.end_step, values)

    def update_done(self, step: int, stats: TrainStats, extra: dict[str, float]) -> None:
        """Log one update's training statistics and `extra` scalars (full tags), advance the progress bar."""
        values = {
            f"train/{field.name}": float(getattr(stats, field.name)) for field in dataclasses.fields(stats)
        }
        self.writer.scalars(step, {**values, **extra})
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(
                sps=f"{extra.get('perf/sps', 0):.0f}", team_return=f"{self.team_return_mean:.1f}"
            )

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
        """Write pending events to disk (before a checkpoint, so that a killed run loses none of them)."""
        self.writer.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log scalars given by full tag (e.g. an evaluation's `eval/` tags) at `step`."""
        self.writer.scalars(step, values)

    def close(self) -> None:
        """Flush and close the event file and the progress bar."""
        self.writer.close()
        if self.bar is not None:
            self.bar.close()


class EventWriter:
    """A TensorBoard event file of scalars: one event per call, holding all of that step's values.

    One event with many values costs a fraction of one event per value (a 1,024-copy VMAS rollout
    ends 1,024 episodes of 7 scalars each per update); the reader sees the same scalars.
    """

    QUEUE = 8192
    """Events buffered for the writing thread; a burst of episodes should not wait on the disk."""

    def __init__(self, log_dir: Path, *, purge_step: int | None = None, flush_secs: float = 120) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self._file = EventFileWriter(str(log_dir), max_queue_size=self.QUEUE, flush_secs=flush_secs)
        if purge_step is not None:  # the reader discards events at and after this step read before it
            start = SessionLog(status=SessionLog.START)
            self._file.add_event(Event(wall_time=time.time(), step=purge_step, session_log=start))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Write `values` (tag: number) at `step`."""
        summary = self._summary(
            value=[self._summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()]
        )
        self._file.add_event(self._event(wall_time=time.time(), step=int(step), summary=summary))

    def flush(self) -> None:
        """Write every queued event to disk."""
        self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()


def _wait_for_a_later_event_file_name(log_dir: Path) -> None:
    """Make the next event file sort after the existing ones (TensorBoard reads them in name order).

    Event file names start with the creation second, then host and pid: a run resumed within the
    same second as an earlier writer (or on another host) could otherwise be read before it.
    """
    fields = [path.name.split(".") for path in log_dir.glob("events.out.tfevents.*")]
    stamps = [int(parts[3]) for parts in fields if parts[3].isdigit()]
    while stamps and int(time.time()) <= max(stamps):
        time.sleep(0.05)
