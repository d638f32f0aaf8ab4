"""Console progress: a redrawn bar on a terminal; plain lines, every 5% and at the end, anywhere else."""

import dataclasses
import io
import re
from typing import Any

import numpy as np

from marl_ppo.algo.stats import TrainStats
from marl_ppo.logs.logger import ProgressLines, RunLogger
from marl_ppo.rollout.source import EpisodeRecord

ZEROS: dict[str, Any] = {
    field.name: 0.0 for field in dataclasses.fields(TrainStats) if field.name != "agents"
}
STATS = TrainStats(**ZEROS)
LINE = re.compile(r"^step (\d+)/(\d+) \((\d+)%\): (\d+) steps/s, (.*)$")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _logger(tmp_path, stream, total_steps, resume_step=None):
    return RunLogger(
        tmp_path,
        agents=["a", "b"],
        groups={"team": ["a", "b"]},
        total_steps=total_steps,
        return_window=100,
        per_agent=False,
        progress=True,
        resume_step=resume_step,
        stream=stream,
    )


def _episode(team_return, end_step):
    return EpisodeRecord(
        team_return=team_return,
        agent_returns=np.array([team_return / 2, team_return / 2]),
        length=5,
        end_step=end_step,
    )


def test_a_non_terminal_gets_a_plain_line_every_5_percent_and_no_redraws(tmp_path):
    stream = io.StringIO()
    logger = _logger(tmp_path, stream, total_steps=1000)
    for step in range(20, 1001, 20):  # 50 updates of 20 env steps
        if step == 400:
            logger.episodes_done([_episode(1.0, 390), _episode(3.0, 400)])
        logger.update_done(step, STATS, {})
    logger.close()
    output = stream.getvalue()
    assert "\r" not in output and "\x1b" not in output
    lines = output.splitlines()
    assert len(lines) == 20  # one per 50 env steps: 5%, 10%, ..., 100%
    matches = [LINE.match(line) for line in lines]
    parsed = [m for m in matches if m is not None]
    assert len(parsed) == len(lines), lines
    steps = [int(m[1]) for m in parsed]
    assert steps == [step for step in range(20, 1001, 20) if step % 50 < 20]  # the first update past each 5%
    assert [int(m[3]) for m in parsed] == [step // 10 for step in steps]  # the percent done
    assert lines[-1].startswith("step 1000/1000 (100%): ")
    assert parsed[0][5] == "no episode finished yet"
    assert lines[7].endswith("team return 2.00 (last 2 episodes)")  # step 400: episodes 1.0 and 3.0


def test_each_update_writes_at_most_one_line_and_the_end_always_one(tmp_path):
    stream = io.StringIO()
    logger = _logger(tmp_path, stream, total_steps=100)
    for step in (30, 60, 90, 120):  # each update covers several 5% parts; the last overshoots
        logger.update_done(step, STATS, {})
    logger.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "step 30/100 (30%)",
        "step 60/100 (60%)",
        "step 90/100 (90%)",
        "step 120/100 (100%)",
    ]


def test_a_resumed_run_counts_its_lines_from_the_resume_step(tmp_path):
    first = _logger(tmp_path, io.StringIO(), total_steps=1000)
    first.update_done(500, STATS, {})
    first.close()
    stream = io.StringIO()
    logger = _logger(tmp_path, stream, total_steps=1000, resume_step=500)
    for step in range(510, 1001, 10):
        logger.update_done(step, STATS, {})
    logger.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10 and lines[0].startswith("step 550/1000 (55%)")


def test_a_terminal_gets_the_redrawn_bar(tmp_path):
    stream = Terminal()
    logger = _logger(tmp_path, stream, total_steps=1000)
    for step in range(100, 1001, 100):
        logger.update_done(step, STATS, {"perf/sps": 123.0})
    logger.close()
    output = stream.getvalue()
    assert "\r" in output and "1.00k/1.00k" in output and "sps=123, no episode finished yet" in output
    assert not LINE.search(output.split("\r")[-1])


def test_progress_false_writes_nothing(tmp_path):
    stream = io.StringIO()
    logger = RunLogger(
        tmp_path,
        agents=["a"],
        groups={"team": ["a"]},
        total_steps=100,
        return_window=10,
        per_agent=False,
        progress=False,
        stream=stream,
    )
    logger.update_done(100, STATS, {})
    logger.close()
    assert stream.getvalue() == ""


def test_a_closed_reader_stops_the_lines_not_the_run():
    class ClosedPipe(io.StringIO):
        writes = 0

        def write(self, text):
            ClosedPipe.writes += 1
            raise BrokenPipeError(32, "Broken pipe")

    lines = ProgressLines(ClosedPipe(), total_steps=100)
    lines.update(50, "no episode finished yet")  # raises inside, caught: progress stops
    lines.update(100, "no episode finished yet")
    assert ClosedPipe.writes == 1 and lines.stream is None


def test_episodes_ending_at_one_step_are_each_logged_in_one_event(tmp_path):
    """Every copy's episode that ends at a step keeps its own value of every tag, written as one event."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    logger = RunLogger(
        tmp_path,
        agents=("a", "b"),
        groups={"agent": ("a", "b")},
        total_steps=100,
        return_window=10,
        per_agent=True,
        progress=False,
    )
    returns = [np.array([1.0, 2.0]), np.array([-1.5, 0.5]), np.array([4.0, 4.0])]
    logger.episodes_done(
        [EpisodeRecord(float(r.sum()), r, 25, step) for r, step in zip(returns, (50, 50, 75), strict=True)]
    )
    logger.scalars(75, {"eval/team_return": 7.0})
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("rollout/team_return")] == [
        (50, 3.0),
        (50, -1.0),
        (75, 8.0),
    ]
    assert [(e.step, e.value) for e in events.Scalars("agents/b/return")] == [(50, 2.0), (50, 0.5), (75, 4.0)]
    assert [(e.step, e.value) for e in events.Scalars("eval/team_return")] == [(75, 7.0)]
    (path,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    written = [e for e in EventFileLoader(str(path)).Load() if e.HasField("summary")]
    # one event per step of the episodes (every value inside: 2 episodes x 5 tags at step 50), then the call at 75
    assert [(e.step, len(e.summary.value)) for e in written] == [(50, 10), (75, 5), (75, 1)]


def test_a_run_says_what_it_builds_as_it_starts_and_a_resume_where_it_continues(tmp_path, capsys):
    from marl_ppo.cli import main

    run_dir = tmp_path / "run"
    tiny = [
        "env.id=envs/matrix_game_v0",
        "rollout.num_envs=2",
        "rollout.rollout_steps=5",
        "rollout.vector=sync",
        "model.hidden_sizes=[8]",
    ]
    assert main(["train", *tiny, "total_steps=10", "--run-dir", str(run_dir)]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        "training MAPPO on envs/matrix_game_v0 (2 agents in 1 group): 2 env copies in this process, "
        f"1 torch thread; 10 env steps, logs and checkpoints in {run_dir}"
    )
    assert main(["train", "--resume", str(run_dir), "total_steps=20"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"resuming {run_dir} from env step 10 (update 1) to 20: MAPPO on envs/matrix_game_v0 "
        "(2 agents in 1 group): 2 env copies in this process, 1 torch thread"
    )


def test_a_games_progress_shows_its_last_win_rate_episode_length_and_entropy(tmp_path):
    """A zero-sum game's team return is always 0: its line says what moves instead."""
    from marl_ppo.logs.logger import game_headline

    stream = io.StringIO()
    logger = RunLogger(
        tmp_path,
        agents=["a", "b"],
        groups={"player": ["a", "b"]},
        total_steps=100,
        return_window=100,
        per_agent=False,
        progress=True,
        stream=stream,
        headline=game_headline,
    )
    stats = dataclasses.replace(STATS, entropy=1.234)
    logger.update_done(10, stats, {})
    logger.episodes_done([_episode(0.0, 15), dataclasses.replace(_episode(0.0, 20), length=8)])
    logger.update_done(20, stats, {})
    logger.scalars(20, {"eval/vs_random/win_rate": 0.75, "eval/vs_random/draw_rate": 0.05})
    logger.update_done(30, stats, {})
    logger.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("steps/s, no episode finished yet")
    assert lines[1].endswith("steps/s, no evaluation against random yet, episode length 6.5, entropy 1.23")
    assert lines[2].endswith(
        "steps/s, vs random win rate 0.75 (at step 20), episode length 6.5, entropy 1.23"
    )
    assert all("team return" not in line for line in lines)


def test_a_zero_sum_games_progress_shows_each_agents_return_and_points_to_vs_random(tmp_path):
    """Without eval.vs_random, a game whose rewards cancel out shows each side's mean return."""
    stream = io.StringIO()
    logger = RunLogger(
        tmp_path,
        agents=["player_0", "player_1"],
        groups={"player": ["player_0", "player_1"]},
        total_steps=100,
        return_window=100,
        per_agent=False,
        progress=True,
        stream=stream,
    )
    episodes = [
        EpisodeRecord(team_return=0.0, agent_returns=np.array([a, -a]), length=4, end_step=10)
        for a in (1.0, -1.0, 1.0, 0.5)
    ]
    logger.episodes_done(episodes)
    logger.update_done(10, STATS, {})
    logger.close()
    # player_0: (1 - 1 + 1 + 0.5) / 4 = 0.375
    assert (
        stream.getvalue()
        .splitlines()[0]
        .endswith(
            "steps/s, zero-sum: returns player_0 +0.38, player_1 -0.38 (last 4 episodes); "
            "eval.vs_random=seats scores the policy against random players"
        )
    )
    # draws only (every return 0) are not told apart from a cooperative team scoring 0
    from marl_ppo.eval.evaluate import zero_sum

    assert not zero_sum(np.zeros(3), np.zeros((3, 2)))
    assert not zero_sum(np.array([0.0, 1.0]), np.array([[0.5, -0.5], [1.0, 0.0]]))
