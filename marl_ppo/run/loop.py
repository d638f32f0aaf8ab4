"""train(): one run. Builds its parts from the config, then loops collect -> GAE -> update -> log, checkpointing."""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from marl_ppo.algo.batch import refuse_unshared_rewards, rollout_batches
from marl_ppo.algo.jax_trainer import JaxTrainer
from marl_ppo.algo.schedule import LrSchedule
from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import FORMAT, periodic_path, prune_checkpoints, save_checkpoint
from marl_ppo.config import ExperimentConfig, config_to_dict
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.envs.spec import BatchedLayout, TeamSpec
from marl_ppo.eval.evaluate import PeriodicEvaluation, eval_config
from marl_ppo.eval.exploitability import nash_conv_on
from marl_ppo.eval.versus import periodic_evaluation
from marl_ppo.faults import UserError, WorkerError, WorkersLost
from marl_ppo.league.league import League
from marl_ppo.logs.logger import (
    Headline,
    RunLogger,
    exploitability_headline,
    game_headline,
    team_return_headline,
)
from marl_ppo.logs.trackers import check_backends_installed, open_backends
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.host import ActingWatch, cpu_seconds, peak_rss_mb, rss_mb
from marl_ppo.plan.settle import RunPlan, plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.compiled import CompiledSource
from marl_ppo.rollout.source import RolloutSource
from marl_ppo.run.build import build_collector
from marl_ppo.run.code_record import write_code_record
from marl_ppo.run.memory import check_memory
from marl_ppo.run.protocol import BEST_CHECKPOINT, EvaluationRecord, absolute_metric, record_video
from marl_ppo.run.resume import load_resumable, restore_run_state, run_state
from marl_ppo.run.rundir import write_summary
from marl_ppo.run.seeding import rng_state, seed_everything
from marl_ppo.run.signals import Interrupted, StopSignals, UpdateDropped
from marl_ppo.run.warm_start import warm_start


@dataclass(frozen=True)
class TrainResult:
    """What a finished run reports (also written to `summary.json`)."""

    run_dir: Path
    env_steps: int
    updates: int
    episodes: int
    team_return_mean: float
    agent_return_mean: float
    sps: float
    wall_s: float
    timing: dict[str, float]
    """Seconds spent over the run stepping envs (`env_s`), acting (`act_s`) and learning (`learn_s`)."""


def train(
    config: ExperimentConfig,
    run_dir: Path | str,
    *,
    resume: bool = False,
    on_update: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train MAPPO/IPPO as configured, writing logs, checkpoints and summary.json into `run_dir`.

    `resume=True` continues the run checkpointed in `run_dir/checkpoints/latest.pt` where it stopped;
    `config` may differ from that run's only in `resume.RESUMABLE_KEYS`. Ctrl-C or SIGTERM lets the
    current update finish, writes a checkpoint and raises `Interrupted`. `on_update(updates)` is
    called after each update (the memory benchmark samples RSS there).
    """
    run_dir = Path(run_dir)
    plan = plan_run(config)  # before seeding: the probe steps an env copy
    config, device = plan.config, plan.device  # the settled choices are what config.yaml records
    saved = load_resumable(run_dir, config) if resume else None  # a bad checkpoint fails before any work
    if config.log.progress:
        print(_start_line(plan, run_dir, saved), file=sys.stderr, flush=True)
    check_backends_installed(config)  # a missing tracker extra fails before any work
    torch.set_num_threads(plan.build_threads)
    # before any allocation (and before touching run_dir): a run that cannot fit stops here
    estimate = check_memory(plan)
    generator = seed_everything(config.seed)
    # before touching run_dir: a bad env leaves nothing behind
    collector, model = build_collector(plan)
    torch.set_num_threads(plan.threads)
    spec = model.spec
    league = None
    if config.league.opponents is not None:  # its sides are checked before touching run_dir
        games = config.league.rating_episodes * 2 * len(spec.agents)  # a rating match's games, at most
        league = League(
            config,
            spec,
            run_dir,
            lambda: copy.deepcopy(model),  # the shape without a fresh initialisation's cost
            device,
            rating_venv=lambda: build_vector_env(eval_config(config, games), plan.layout, device),
        )
        league.attach(collector)
    evaluation = None
    logger: RunLogger | None = None
    try:
        try:
            # before touching run_dir: weights that do not fit leave nothing behind
            start = warm_start(model, config.model) if saved is None and config.model.init_from else None
            if start is not None and config.log.progress:
                print(start.describe(), file=sys.stderr, flush=True)
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
            write_code_record(run_dir, resume=resume, env_id=config.env.id)
            learner = JaxTrainer if config.fast.learner == "jax" else Trainer
            trainer = learner(model, plan.ppo, generator=generator, optimizer=config.fast.optimizer)
            if start is not None:
                start.carry_optimizer(trainer, config.model)
            _launch_ahead(trainer, collector, config.total_steps)
            if config.eval.every:  # deterministic episodes on env copies of their own, logged under eval/
                eval_venv = build_vector_env(eval_config(config, config.eval.episodes), plan.layout, device)
                evaluation = periodic_evaluation(config, eval_venv, model, device)
            logger = _make_logger(config, run_dir, spec, None if saved is None else saved["env_steps"])
            run = _Run(plan, run_dir, model, trainer, collector, logger, evaluation, on_update, league)
            run.begin(saved)
            logger.hyperparameters(config_to_dict(config))
            buffer = RolloutBuffer(
                spec, config.rollout.rollout_steps, config.rollout.copies, device, model.memory_layout()
            )
            with StopSignals() as stop:  # also covers the last save: a first signal cannot cut it short
                run.loop(buffer, stop)
                if stop.received is not None and collector.env_steps < config.total_steps:
                    checkpoint = run.save()
                    raise Interrupted(
                        stop.received, run_dir=run_dir, checkpoint=checkpoint, env_steps=collector.env_steps
                    )
                run.save(final=True)
                run.absolute_metric()  # the best evaluated policy, once the final one is saved
                run.video()
        finally:
            collector.close()  # before the summary: the CPU time of worker processes counts once they end
            if evaluation is not None:
                evaluation.close()
            if league is not None:
                league.close()
        result = run.result()
        summary = _summary(result, None if estimate is None else estimate.total) | run.absolute
        logger.summary(summary)
    finally:
        if logger is not None:
            logger.close()
    write_summary(run_dir, summary)
    return result


def _start_line(plan: RunPlan, run_dir: Path, saved: dict[str, Any] | None) -> str:
    """The line a run prints as it starts: what it builds and where it logs, or where it continues from."""
    total = plan.config.total_steps
    # JAX compiles the env's reset and step before the first rollout: up to a minute in silence otherwise
    compiles = isinstance(plan.layout, BatchedLayout) and plan.layout.own_threads
    first = (
        "; JAX compiles the env first (a minute or so unless its compilation cache holds it)"
        if compiles
        else ""
    )
    if saved is None:
        return f"training {plan.describe()}; {total} env steps, logs and checkpoints in {run_dir}{first}"
    return (
        f"resuming {run_dir} from env step {saved['env_steps']} (update {saved['updates']}) to {total}: "
        f"{plan.describe()}{first}"
    )


def _make_logger(
    config: ExperimentConfig, run_dir: Path, spec: TeamSpec, resume_step: int | None
) -> RunLogger:
    return RunLogger(
        run_dir,
        agents=spec.agents,
        groups={g.name: g.agents for g in spec.groups},
        total_steps=config.total_steps,
        return_window=config.log.return_window,
        per_agent=config.log.per_agent,
        progress=config.log.progress,
        episodes=config.log.episodes,
        resume_step=resume_step,
        headline=_headline(config),
        backends=open_backends(config, run_dir, resume_step=resume_step),
    )


def _headline(config: ExperimentConfig) -> Headline:
    """What progress lines say of the run: a game's team return says nothing (zero-sum), so a game
    shows its exploitability where it is computed, else its scores against random opponents."""
    if config.eval.every and nash_conv_on(config):
        return exploitability_headline
    return team_return_headline if config.eval.vs_random is None else game_headline


class _Run:
    """One run's components and counters: runs updates, writes and restores checkpoints."""

    def __init__(
        self,
        plan: RunPlan,
        run_dir: Path,
        model: TeamModel,
        trainer: Trainer,
        collector: RolloutSource,
        logger: RunLogger,
        evaluation: PeriodicEvaluation | None = None,
        on_update: Callable[[int], None] | None = None,
        league: League | None = None,
    ) -> None:
        config = plan.config
        self.config, self.run_dir = config, run_dir
        self.model, self.trainer, self.collector, self.logger = model, trainer, collector, logger
        self.evaluation, self.on_update, self.league = evaluation, on_update, league
        self.acting = ActingWatch(config, plan.layout, plan.threads)
        self.update_threads = plan.update_threads
        """torch threads while the trainer updates (the rest of the run uses the plan's `threads`)."""
        self.updates = 0
        self.saved_updates: int | None = None
        """The update count of the last checkpoint written (or resumed from)."""
        self.timing = {"env_s": 0.0, "act_s": 0.0, "learn_s": 0.0}
        self.schedule = LrSchedule(config.ppo.lr_schedule, config.total_steps)
        self.entropy_schedule = LrSchedule(config.ppo.entropy_schedule, config.total_steps)
        """The factor that moves the entropy weight from ppo.entropy_coef (1) to ppo.entropy_final (0)."""
        self.start = time.perf_counter()
        """perf_counter() at the run's start; a resumed run moves it back by the time already trained."""
        self.record: EvaluationRecord | None = None
        """The periodic evaluations' episodes and the best of them (with `evaluation`)."""
        self.absolute: dict[str, float] = {}
        """The absolute metric's team return for the summary, once measured."""

    def begin(self, saved: dict[str, Any] | None) -> None:
        """Reset the envs for a new run, or restore everything a checkpoint saved."""
        if self.evaluation is not None:
            resume_step = None if saved is None else int(saved["env_steps"])
            self.record = EvaluationRecord(self.run_dir, resume_step=resume_step)
        if saved is None:
            self.collector.start(self.config.seed)
            if self.league is not None:
                self.league.begin(None, self._policy_payload)
            return
        restore_run_state(
            saved,
            model=self.model,
            trainer=self.trainer,
            collector=self.collector,
            logger=self.logger,
            seed=self.config.seed,
        )
        if self.league is not None:
            self.league.begin(saved, self._policy_payload)
        self.updates = self.saved_updates = int(saved["updates"])
        self.timing = dict(saved["timing"])
        # a changed total_steps re-spreads the rest of the decay from the rate reached here
        self.schedule = LrSchedule.from_checkpoint(saved).resumed(
            self.config.total_steps, int(saved["env_steps"])
        )
        if "entropy_schedule" in saved:  # checkpoints from before the entropy schedule ran a constant one
            self.entropy_schedule = LrSchedule(**saved["entropy_schedule"]).resumed(
                self.config.total_steps, int(saved["env_steps"])
            )
        if self.evaluation is not None:  # the stopped run evaluated up to its checkpoint's step
            self.evaluation.next_step = (
                self.collector.env_steps // self.evaluation.every + 1
            ) * self.evaluation.every
        self.start = time.perf_counter() - saved["wall_s"]

    def loop(self, buffer: RolloutBuffer, stop: StopSignals) -> None:
        """Update until total_steps or a stop signal, checkpointing every `log.checkpoint_every` updates."""
        while self.collector.env_steps < self.config.total_steps and stop.received is None:
            boundary = self.collector.env_steps
            # after a first update there is one to keep: an update that a stop signal outlasts is dropped
            kept = self._learner_state() if self.updates > 0 else None
            try:
                seconds = _one_update(
                    self.config,
                    self.collector,
                    buffer,
                    self.trainer,
                    self.logger,
                    self.start,
                    (self.schedule, self.entropy_schedule),
                    self.update_threads,
                    droppable=stop.droppable() if kept is not None else contextlib.nullcontext(),
                )
            except UpdateDropped:
                assert kept is not None and stop.received is not None
                raise self._dropped(stop.received, kept, boundary) from None
            except WorkersLost as lost:
                raise self._stopped_short(lost) from None
            except _CollectFailed as failed:
                self._save_before_fault(failed.fault, boundary)
                raise failed.fault from failed.fault.__cause__  # the env's own error, for --debug
            for name, value in seconds.items():
                self.timing[name] += value
            self.acting.update_done(seconds)
            self.updates += 1
            if self.evaluation is not None:  # before the checkpoint, which then covers it
                steps = self.collector.env_steps
                final = steps >= self.config.total_steps
                scalars = self.evaluation.after_update(steps, final=final)
                self.logger.scalars(steps, scalars)
                if scalars:
                    self._evaluated(steps)
            if self.league is not None:  # a snapshot before the checkpoint that lists it
                league_scalars = self.league.after_update(self.updates, self._policy_payload)
                self.logger.scalars(self.collector.env_steps, league_scalars)
            if self.updates % self.config.log.checkpoint_every == 0:
                try:
                    self.save()
                except WorkersLost as lost:  # found receiving the rollout collected ahead
                    raise self._stopped_short(lost) from None
            if self.on_update is not None:
                self.on_update(self.updates)

    def _evaluated(self, steps: int) -> None:
        """Record the evaluation's episodes; keep the policy as `checkpoints/best.pt` when it scored best."""
        assert self.evaluation is not None and self.record is not None
        assert self.evaluation.last_result is not None
        if self.record.add(steps, self.evaluation.last_result):
            save_checkpoint(self.run_dir / "checkpoints" / BEST_CHECKPOINT, self._policy_payload())

    def absolute_metric(self) -> None:
        """The evaluation protocol's absolute metric of the best evaluated policy (`run.protocol`)."""
        if self.evaluation is None or self.record is None:
            return
        evaluation = self.evaluation
        metric = absolute_metric(
            self.config, self.run_dir, self.record, self.model, evaluation.venv, evaluation.device
        )
        if metric is not None:
            team_return = float(metric["team_return"]["mean"])
            self.logger.scalars(self.collector.env_steps, {"eval/absolute_team_return": team_return})
            self.absolute = {"absolute_team_return": team_return}

    def video(self) -> None:
        """With `log.video`, an episode of the model as it is now (the best evaluated policy after
        `absolute_metric`), shown by the backends at the step that policy was evaluated."""
        step = self.record.best_step if self.record is not None and self.absolute else None
        step = step if step is not None else self.collector.env_steps
        path = record_video(self.config, self.run_dir, self.model, step)
        if path is not None:
            self.logger.video(step, path)

    def _stopped_short(self, lost: WorkersLost) -> WorkersLost:
        """Checkpoint the state after the last update (unless the last checkpoint holds it already, with
        its env copies) and say how to continue."""
        if self.saved_updates != self.updates:
            self.save()
        return WorkersLost(
            f"{lost}; checkpoint {self.run_dir / 'checkpoints' / 'latest.pt'} at env step "
            f"{self.collector.env_steps}; continue once the cluster is back with "
            f"`marl-ppo train --resume {self.run_dir}`"
        )

    def _save_before_fault(self, fault: Exception, env_steps: int) -> None:
        """An env copy failed during a rollout: checkpoint the last complete update (learner, optimizers,
        counters; the env copies restart with fresh episodes on resume) and end the fault's one line
        with how to continue."""
        if self.updates == 0:
            return
        latest = self.run_dir / "checkpoints" / "latest.pt"
        if self.saved_updates != self.updates:
            self._save_without_envs(env_steps, "the run stopped on a fault in an env copy")
        fault.args = (
            f"{fault}; {latest} holds the run up to update {self.updates} (env step {env_steps}): once the env "
            f"is fixed, continue with `marl-ppo train --resume {self.run_dir}`",
        )

    def _learner_state(self) -> dict[str, Any]:
        """A copy of the model's and the trainer's state, to put back if the next update is dropped."""
        model = {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}
        return {"model": model, "trainer": _cloned(self.trainer.state_dict())}

    def _dropped(self, signum: int, kept: dict[str, Any], env_steps: int) -> Interrupted:
        """A stop signal outlasted the update under way: put the learner back as the last complete update
        left it, checkpoint that update (the env copies restart with fresh episodes) and stop."""
        self.model.load_state_dict(kept["model"])
        self.trainer.load_state_dict(kept["trainer"])
        if self.saved_updates != self.updates:
            self._save_without_envs(env_steps, "the update under way was dropped to stop at once")
        return Interrupted(
            signum,
            run_dir=self.run_dir,
            checkpoint=self.run_dir / "checkpoints" / "latest.pt",
            env_steps=env_steps,
            dropped=True,
        )

    def _save_without_envs(self, env_steps: int, reason: str) -> None:
        """Write the last complete update, whose env copies are gone, as `update_<N>.pt` and `latest.pt`."""
        directory = self.run_dir / "checkpoints"
        self.logger.flush()
        payload = self._payload_without_envs(env_steps, reason)
        save_checkpoint(periodic_path(directory, self.updates), payload, [directory / "latest.pt"])
        self.saved_updates = self.updates
        prune_checkpoints(directory, self.config.log.keep_last)

    def _payload_without_envs(self, env_steps: int, reason: str) -> dict[str, Any]:
        """The checkpoint of the last complete update when the env copies are in an unknown state: the
        learner, its optimizers and counters as they were after that update; no env copies."""
        return {
            **self._policy_payload(),
            "env_steps": env_steps,
            "wall_s": time.perf_counter() - self.start,
            "timing": dict(self.timing),
            "lr_schedule": self.schedule.state_dict(),
            "entropy_schedule": self.entropy_schedule.state_dict(),
            "trainer": self.trainer.state_dict(),
            "collector": {"env_steps": env_steps},
            "logger": self.logger.state_dict(),
            "rng": rng_state(),
            "envs": {"unavailable": reason},
            **({} if self.league is None else {"league": self.league.state_dict()}),
        }

    def save(self, *, final: bool = False) -> Path:
        """Write `update_<N>.pt` and `latest.pt` (and `final.pt`), prune old ones; return the periodic file."""
        self.logger.flush()  # events up to this checkpoint survive a kill -9; later ones are purged on resume
        directory = self.run_dir / "checkpoints"
        path = periodic_path(directory, self.updates)
        copies = [directory / "latest.pt"] + ([directory / "final.pt"] if final else [])
        save_checkpoint(path, self._payload(), copies)
        self.saved_updates = self.updates
        prune_checkpoints(directory, self.config.log.keep_last)
        return path

    def _policy_payload(self) -> dict[str, Any]:
        """What `marl-ppo eval` reads: the config, the agents and the networks (no optimizer or env state)."""
        spec = self.model.spec
        return {
            "format": FORMAT,
            "config": config_to_dict(self.config),
            "agents": list(spec.agents),
            "groups": {g.name: list(g.agents) for g in spec.groups},
            "updates": self.updates,
            "env_steps": self.collector.env_steps,
            "model": self.model.state_dict(),
        }

    def _payload(self) -> dict[str, Any]:
        return {
            **self._policy_payload(),
            "wall_s": time.perf_counter() - self.start,
            "timing": dict(self.timing),
            "lr_schedule": self.schedule.state_dict(),
            "entropy_schedule": self.entropy_schedule.state_dict(),
            **run_state(model=self.model, trainer=self.trainer, collector=self.collector, logger=self.logger),
            **({} if self.league is None else {"league": self.league.state_dict()}),
        }

    def result(self) -> TrainResult:
        """The finished run's figures."""
        wall = time.perf_counter() - self.start
        steps = self.collector.env_steps
        return TrainResult(
            self.run_dir,
            steps,
            self.updates,
            self.logger.episodes,
            self.logger.team_return_mean,
            self.logger.agent_return_mean,
            steps / wall if wall > 0 else 0.0,
            wall,
            dict(self.timing),
        )


class _CollectFailed(Exception):
    """An env copy failed during a rollout (`fault`); nothing of the learner has changed since the last update."""

    def __init__(self, fault: UserError | WorkerError) -> None:
        super().__init__(str(fault))
        self.fault = fault


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """`count` torch threads inside the block, the count before it after (nothing done when equal)."""
    before = torch.get_num_threads()
    if count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _one_update(
    config: ExperimentConfig,
    collector: RolloutSource,
    buffer: RolloutBuffer,
    trainer: Trainer,
    logger: RunLogger,
    start: float,
    schedules: tuple[LrSchedule, LrSchedule],
    update_threads: int,
    *,
    droppable: AbstractContextManager[None],
) -> dict[str, float]:
    """Collect a rollout, update on it and log both; `droppable` covers the rollout and the update (a
    stop signal may drop them), not the logging."""
    with droppable:
        t0 = time.perf_counter()
        buffer.reset()
        # rollout workers with policy lag start the next rollout now, unless this is the run's last
        ahead = collector.env_steps + buffer.steps * buffer.num_envs < config.total_steps
        try:
            rollout = collector.collect(buffer, ahead=ahead)
        except (UserError, WorkerError) as fault:  # the learner is still as the last update left it
            raise _CollectFailed(fault) from fault
        t1 = time.perf_counter()
        team = config.ppo.critic == "team"
        if team and config.ppo.team_reward == "refuse":
            refuse_unshared_rewards(buffer, env_steps_before=collector.env_steps - rollout.env_steps)
        batches = rollout_batches(
            buffer,
            rollout.last_values,
            rollout.last_alive,
            gamma=config.ppo.gamma,
            lam=config.ppo.gae_lambda,
            team=team,
        )
        before = collector.env_steps - rollout.env_steps
        trainer.set_lr_scale(schedules[0].scale(before))
        if config.ppo.entropy_schedule == "linear":
            start, final = config.ppo.entropy_coef, config.ppo.entropy_final
            trainer.set_entropy_coef(final + (start - final) * schedules[1].scale(before))
        with torch_threads(update_threads):
            stats = trainer.update(batches, lagged=config.rollout.policy_lag > 0)
        t2 = time.perf_counter()
    logger.episodes_done(rollout.episodes, collector.env_steps)
    act_s = rollout.act_seconds if rollout.act_seconds is not None else (t1 - t0) - rollout.env_seconds
    extra = {
        "perf/sps": collector.env_steps / (t2 - start),
        "perf/env_s": rollout.env_seconds,
        "perf/act_s": act_s,
        "perf/collect_wait_s": t1 - t0,
        "perf/learn_s": t2 - t1,
        "perf/peak_rss_mb": peak_rss_mb(),
        "perf/rss_mb": rss_mb(),
        "train/pi_lr": trainer.actor_optimizer.param_groups[0]["lr"],
        **rollout.perf,
    }
    logger.update_done(collector.env_steps, stats, extra)
    return {"env_s": extra["perf/env_s"], "act_s": extra["perf/act_s"], "learn_s": extra["perf/learn_s"]}


def _launch_ahead(trainer: Trainer, collector: RolloutSource, total_steps: int) -> None:
    """With the JAX learner and compiled rollouts, each update but the run's last starts the next
    rollout on its new weights as soon as its program is dispatched (`CompiledSource.launch`)."""
    if not isinstance(trainer, JaxTrainer) or not isinstance(collector, CompiledSource):
        return

    def launch(new: Mapping[int, Any]) -> None:
        if collector.env_steps < total_steps:
            collector.launch(new)

    trainer.next_rollout = launch


def _cloned(value: Any) -> Any:
    """A copy of a state dict: tensors cloned, dicts, lists and tuples rebuilt, immutable leaves shared,
    anything else deep-copied. Taken before every update, so cheaper than `copy.deepcopy`'s memo."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _cloned(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_cloned(item) for item in value)
    if value is None or isinstance(value, int | float | str | bool):
        return value
    return copy.deepcopy(value)


def _summary(result: TrainResult, memory_estimate: int | None) -> dict[str, Any]:
    """What summary.json records of a finished run."""
    return {
        "env_steps": result.env_steps,
        "updates": result.updates,
        "episodes": result.episodes,
        "team_return_mean": result.team_return_mean,
        "agent_return_mean": result.agent_return_mean,
        "sps": result.sps,
        "wall_s": result.wall_s,
        "peak_rss_mb": peak_rss_mb(),
        # the pre-run memory check's estimate, to compare with the measured peak (learner and workers)
        "memory_estimate_mb": None if memory_estimate is None else memory_estimate / 2**20,
        "cpu_s": cpu_seconds(),
        **result.timing,
    }
