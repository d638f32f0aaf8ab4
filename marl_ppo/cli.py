"""Command line: `marl-ppo train` (with `--resume RUN_DIR`), `eval`, `sweep`, `tune`, `reproduce`, `report`,
`compare`, `rate`, `crossplay`, `play`, `export` and `envs` (see `marl-ppo -h`).

Parses arguments (options and key=value overrides in any order) and calls the library; user errors
print one line and exit with status 2. A run stopped by Ctrl-C or SIGTERM prints how to resume it
and exits with 130 or 143; output whose reader closed the pipe (`| head`) ends quietly with 141.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

# light imports only: `--help` and `envs` answer without torch, NumPy or pydantic; each command
# imports what it needs
from marl_ppo.console import as_invoked, quiet_closed_outputs, shell_command
from marl_ppo.envs.registry import id_families, registered_specs, resolve_factory
from marl_ppo.faults import RunFault, UserError

if TYPE_CHECKING:
    from marl_ppo.config import ExperimentConfig
    from marl_ppo.eval.versus import VersusResult
    from marl_ppo.run.signals import Interrupted

USER_ERRORS = (UserError,)
"""Bad input (config, arguments, files, an env that breaks its contract): one line, exit status 2."""
RUN_FAULTS = (RunFault,)
"""A run that stopped on a fault (numerical, worker, disk): one line, exit status 1."""


def _debug_after(command: argparse.ArgumentParser) -> None:
    """`CMD ... --debug` as `--debug CMD`: no default here, so that it never resets the main parser's flag."""
    command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


class _Parser(argparse.ArgumentParser):
    """Options and positionals in any order: `train --run-dir D key=value` as `train key=value --run-dir D`.

    argparse's own parsing ends a `nargs='*'` positional at the first option; a command without
    subcommands is parsed intermixed instead (argparse.parse_known_intermixed_args).
    """

    _intermixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        if self._intermixing or self._subparsers is not None:  # intermixed parsing refuses subcommands
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls parse_known_args itself
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


Commands: TypeAlias = "argparse._SubParsersAction[_Parser]"
"""The `marl-ppo` parser's subcommands, each added by one `_add_*` function."""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="marl-ppo", description="Multi-agent PPO (MAPPO / IPPO).")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_train,
        _add_eval,
        _add_sweep,
        _add_tune,
        _add_reproduce,
        _add_report,
        _add_compare,
        _add_rate,
        _add_crossplay,
        _add_play,
        _add_envs,
        _add_export,
    ):
        _debug_after(add(commands))
    return parser


def _add_train(commands: Commands) -> argparse.ArgumentParser:
    """`train`: an experiment file with overrides, or --resume, --help-config, --print-config."""
    train = commands.add_parser("train", help="train on an experiment file with key=value overrides")
    train.add_argument("args", nargs="*", metavar="[EXPERIMENT.yaml] [key=value ...]")
    train.add_argument(
        "--run-dir", type=Path, help="where to write logs and checkpoints (default: runs/<name>-<time>)"
    )
    train.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its latest checkpoint (key=value may extend total_steps)",
    )
    train.add_argument(
        "--help-config", action="store_true", help="list every config key: meaning, default, allowed values"
    )
    train.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (experiment file and overrides applied) as YAML and exit",
    )
    return train


def _add_eval(commands: Commands) -> argparse.ArgumentParser:
    """`eval`: a run's checkpoint, or the random policy on an experiment's env."""
    evaluate = commands.add_parser("eval", help="evaluate a run's checkpoint; writes eval.json (and a video)")
    evaluate.add_argument("target", metavar="RUN_DIR|CHECKPOINT|EXPERIMENT.yaml", type=Path)
    evaluate.add_argument(
        "--random",
        action="store_true",
        help="play the uniform random policy on the experiment file's env instead (the floor to read results against)",
    )
    evaluate.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. env.kwargs.max_cycles=50"
    )
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes to play (default: 10)")
    evaluate.add_argument("--deterministic", action="store_true", help="take each distribution's mode")
    evaluate.add_argument("--render", metavar="gif|mp4", help="also record one episode in this format")
    evaluate.add_argument(
        "--seed", type=int, help="first eval env seed (default: the run's seed + 1,000,000)"
    )
    evaluate.add_argument(
        "--out", type=Path, help="where to write eval.json and the video (default: the run)"
    )
    evaluate.add_argument(
        "--partner",
        action="append",
        default=[],
        metavar="SEAT=PARTNER",
        help="play SEAT (an agent, or agents by name without the number) with PARTNER: a run directory, a "
        "checkpoint, random, scripted/NAME or module:callable (repeatable); the run's policy plays the rest",
    )
    return evaluate


def _add_sweep(commands: Commands) -> argparse.ArgumentParser:
    """`sweep`: a grid of values x seeds, one training process per run."""
    sweep = commands.add_parser("sweep", help="train a grid of key=v1,v2 values x seeds, one process per run")
    sweep.add_argument("experiment", metavar="EXPERIMENT.yaml", type=Path)
    sweep.add_argument("overrides", nargs="*", metavar="key=v1,v2", help="grid values (or one fixed value)")
    sweep.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per grid point (default: 3)")
    sweep.add_argument("--jobs", type=int, help="runs at once (default: available cores / cores per run)")
    sweep.add_argument(
        "--out", type=Path, default=Path("runs"), help="parent of the sweep directory (default: runs)"
    )
    sweep.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run each run as a Ray task on the cluster at ADDRESS (auto or host:port)",
    )
    return sweep


def _add_tune(commands: Commands) -> argparse.ArgumentParser:
    """`tune`: a seed-aware search over config keys with Optuna (docs/tuning.md)."""
    tune = commands.add_parser(
        "tune",
        help="search config keys with Optuna: each trial K seeds, scored by their IQM (docs/tuning.md)",
    )
    tune.add_argument("experiment", metavar="EXPERIMENT.yaml", type=Path)
    tune.add_argument("overrides", nargs="*", metavar="key=value", help="fixed overrides every trial shares")
    tune.add_argument(
        "--space", type=Path, required=True, metavar="SPACE.yaml", help="the keys to search and their ranges"
    )
    tune.add_argument(
        "--trials",
        type=int,
        required=True,
        metavar="N",
        help="trials the study ends with (counting earlier runs of it)",
    )
    tune.add_argument(
        "--seeds", type=int, default=3, metavar="K", help="seeds 0..K-1 trained per trial (default: 3)"
    )
    tune.add_argument(
        "--jobs",
        type=int,
        help="training runs at once (default: available cores, or the Ray cluster's CPUs, / cores per run)",
    )
    tune.add_argument(
        "--out",
        type=Path,
        default=Path("runs/tune"),
        help="parent of the tuning directory (default: runs/tune)",
    )
    tune.add_argument(
        "--ray", metavar="ADDRESS", help="train each seed run as a Ray task on the cluster at ADDRESS"
    )
    tune.add_argument("--pruner", default="median", help="median, halving or none (default: median)")
    tune.add_argument(
        "--score",
        default="curve",
        help="a seed's score: curve (mean of its evaluations) or final (default: curve)",
    )
    tune.add_argument(
        "--fresh-seeds",
        type=int,
        metavar="M",
        default=0,
        help="then train the start and the best config on this many unseen seeds and compare them (default: 0)",
    )
    tune.add_argument("--sampler-seed", type=int, default=0, help="seed of the TPE sampler (default: 0)")
    return tune


def _add_reproduce(commands: Commands) -> argparse.ArgumentParser:
    """`reproduce`: an experiment's seeds checked against its expected: band."""
    reproduce = commands.add_parser(
        "reproduce", help="train an experiment's seeds and check its expected: band (exit 1 outside)"
    )
    reproduce.add_argument("experiment", metavar="EXPERIMENT.yaml", type=Path)
    reproduce.add_argument("--seeds", type=int, help="seeds 0..N-1 (default: the expected: block's seeds)")
    reproduce.add_argument("--jobs", type=int, help="runs at once (default: available cores / cores per run)")
    reproduce.add_argument(
        "--out",
        type=Path,
        default=Path("runs/reproduce"),
        help="parent of the runs' directory (default: runs/reproduce)",
    )
    return reproduce


def _add_report(commands: Commands) -> argparse.ArgumentParser:
    """`report`: returns across seeds and learning curves."""
    report = commands.add_parser("report", help="returns across seeds (IQM, 95%% CIs) and learning curves")
    report.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="run directories, or directories that hold them",
    )
    report.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report)")
    report.add_argument("--reps", type=int, default=5000, help="bootstrap resamples (default: 5000)")
    report.add_argument(
        "--name",
        action="append",
        metavar="NAME=CONFIGURATION",
        help="show a configuration under NAME in the table and legends (repeatable), e.g. 'MAPPO=ppo.critic=state'",
    )
    report.add_argument(
        "--merge-code",
        action="store_true",
        help="count runs of different marl_ppo code (version, commit: code.json) as one configuration",
    )
    return report


def _add_compare(commands: Commands) -> argparse.ArgumentParser:
    """`compare`: algorithms over tasks and seeds by the evaluation protocol (docs/tracking.md)."""
    compare = commands.add_parser(
        "compare",
        help="algorithms over tasks and seeds: IQM, probability of improvement, profiles, marl-eval JSON",
    )
    compare.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="run directories, or directories that hold them",
    )
    compare.add_argument(
        "--out", type=Path, default=Path("compare"), help="output directory (default: compare)"
    )
    compare.add_argument(
        "--by",
        metavar="KEY[,KEY]",
        help="config keys that name the algorithms (default: the keys that differ among a task's runs)",
    )
    compare.add_argument(
        "--name",
        action="append",
        metavar="NAME=ALGORITHM",
        help="show an algorithm under NAME in the table and legends (repeatable), e.g. 'MAPPO=ppo.critic=state'",
    )
    compare.add_argument("--reps", type=int, default=5000, help="bootstrap resamples (default: 5000)")
    return compare


def _add_rate(commands: Commands) -> argparse.ArgumentParser:
    """`rate`: a round-robin of runs' pool snapshots and final policies, the random policy and other checkpoints."""
    rate = commands.add_parser(
        "rate", help="rate runs' policies by play: ratings table, cross-play matrix (docs/leagues.md)"
    )
    rate.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    rate.add_argument(
        "--policy",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="also rate this checkpoint (repeatable)",
    )
    rate.add_argument(
        "--player",
        action="append",
        default=[],
        metavar="SPEC",
        help="also rate this player (repeatable): scripted/NAME, package.module:callable, file.py:callable, "
        "a run directory or a checkpoint",
    )
    rate.add_argument(
        "--episodes", type=int, default=10, help="games per pair of players and side (default: 10)"
    )
    rate.add_argument(
        "--max-players",
        type=int,
        help="at most this many of each run's pool snapshots, evenly, first and last kept",
    )
    rate.add_argument(
        "--seed", type=int, default=0, help="seed of the env copies and the policies' samples (default: 0)"
    )
    rate.add_argument(
        "--deterministic",
        action="store_true",
        help="play each policy's mode instead of a sample (exploitable)",
    )
    rate.add_argument(
        "--sides",
        choices=("seats", "teams"),
        help="every agent a side, or teams by name (default: the run's eval.vs_random)",
    )
    rate.add_argument(
        "--score",
        choices=("returns", "roles"),
        default="returns",
        help="returns: the side with the higher return wins; roles: duplicate games, both players on each "
        "side from the same starts (sides that are not alike, e.g. simple_tag)",
    )
    rate.add_argument(
        "--out", type=Path, help="where to write the ladder and cross-play (default: RUN_DIR/rating)"
    )
    return rate


def _add_crossplay(commands: Commands) -> argparse.ArgumentParser:
    """`crossplay`: every run's policy with every other's (and extra partners) on a cooperative env."""
    crossplay = commands.add_parser(
        "crossplay",
        help="runs' policies played with each other's: team-return matrix, self-play/cross-play gap (docs/partners.md)",
    )
    crossplay.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    crossplay.add_argument(
        "--partner",
        action="append",
        default=[],
        metavar="PARTNER",
        help="also a column of this partner: random, a checkpoint, scripted/NAME or module:callable (repeatable)",
    )
    crossplay.add_argument("--episodes", type=int, default=10, help="episodes per seating (default: 10)")
    crossplay.add_argument(
        "--seed", type=int, help="first env seed of every cell (default: the first run's eval seed)"
    )
    crossplay.add_argument(
        "--deterministic", action="store_true", help="play each policy's mode instead of a sample"
    )
    crossplay.add_argument(
        "--bounds", type=Path, metavar="FILE", help="YAML/JSON {partner: [low, high]}: also normalised scores"
    )
    crossplay.add_argument(
        "--out", type=Path, default=Path("crossplay"), help="output directory (default: crossplay)"
    )
    return crossplay


def _add_play(commands: Commands) -> argparse.ArgumentParser:
    """`play`: a person in one seat of a run's env, the trained policy in the others (docs/play.md)."""
    play = commands.add_parser(
        "play",
        help="play one seat of a run's env against its trained policy; records the games (docs/play.md)",
    )
    play.add_argument("target", metavar="RUN_DIR|CHECKPOINT", type=Path)
    play.add_argument("--human", required=True, metavar="SEAT", help="the agent you play, e.g. player_1")
    play.add_argument("--games", type=int, default=1, help="games to play (default: 1)")
    play.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="the JSONL record to write (default: RUN_DIR/play/games-<time>.jsonl)",
    )
    play.add_argument(
        "--seed",
        type=int,
        help="seed of the first game's env and the policy's samples (default: the run's seed + 1,000,000)",
    )
    play.add_argument("--deterministic", action="store_true", help="the policy takes its most likely action")
    play.add_argument(
        "--no-window", action="store_true", help="never open the env's own window; show text only"
    )
    play.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides that keep the spaces (env.kwargs.*)",
    )
    return play


def _add_envs(commands: Commands) -> argparse.ArgumentParser:
    """`envs`: the registered ids, and `envs check ID`."""
    envs = commands.add_parser("envs", help="list registered environment ids, or check one")
    envs.add_argument("--json", action="store_true", help="print the list as JSON objects")
    env_commands = envs.add_subparsers(dest="env_command")
    check = env_commands.add_parser("check", help="conformance check of an env id (exit status 1 on failure)")
    check.add_argument(
        "env_id", metavar="ID", help="registered id, package.module:callable or file.py:callable"
    )
    check.add_argument("kwargs", nargs="*", metavar="key=value", help="keyword arguments for the env factory")
    _debug_after(check)
    return envs


def _add_export(commands: Commands) -> argparse.ArgumentParser:
    """`export`: a run's actors as ONNX or TorchScript files with a policy.json beside them."""
    export = commands.add_parser(
        "export",
        help="write a run's policy as ONNX or TorchScript files (one per agent group) and policy.json",
    )
    export.add_argument("target", metavar="RUN_DIR|CHECKPOINT", type=Path)
    export.add_argument(
        "--format", choices=("onnx", "torchscript"), default="onnx", help="file format (default: onnx)"
    )
    export.add_argument(
        "--sample",
        action="store_true",
        help="the files sample actions from a noise input (default: the most likely action, the mean for Box)",
    )
    export.add_argument("--out", type=Path, help="where to write the files (default: RUN_DIR/export/FORMAT)")
    export.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides that keep the spaces (env.kwargs.*)",
    )
    return export


def _export(options: argparse.Namespace) -> int:
    from marl_ppo.export.writer import export_policy  # heavy imports (torch, onnx, envs)

    result = export_policy(
        options.target,
        fmt=options.format,
        out=options.out,
        sample=options.sample,
        overrides=options.overrides,
    )
    names = ", ".join(path.name for path in result.files.values())
    print(f"wrote {names} and {result.sidecar.name} (float32) to {result.directory}")
    return 0


def _split(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The experiment file (the one argument without `=`, wherever it stands) and the key=value overrides."""
    from marl_ppo.config import ConfigError

    experiment, overrides = None, []
    for index, arg in enumerate(args):
        before = args[index - 1] if index > 0 else ""
        if arg.startswith("=") and before:  # `key = value`: the shell made three arguments of it
            value = arg[1:] or (args[index + 1] if index + 1 < len(args) else "VALUE")
            shown = f"{before} {arg}" + (f" {value}" if arg == "=" else "")
            raise ConfigError(f"'{shown}' has spaces around '='; write {before}={value}, without spaces")
        if "=" not in arg and "=" in before and before.count("[") > before.count("]"):
            joined = f"{before.rstrip(',')},{arg.lstrip(',')}"
            raise ConfigError(
                f"the shell split '{before} {arg}' at a space; write it without spaces, {joined}, "
                "or quote it as one argument"
            )
        if "=" in arg:
            overrides.append(arg)
        elif experiment is None:
            experiment = arg
        else:
            raise ConfigError(
                f"argument '{arg}' is neither the experiment file ('{experiment}' is) nor key=value"
            )
    return experiment, overrides


def _train(options: argparse.Namespace) -> int:
    from marl_ppo.config import load_config
    from marl_ppo.config.keys import config_yaml, defaults_notice, help_config_lines
    from marl_ppo.run.rundir import check_new_run_dir as _check_run_dir
    from marl_ppo.run.rundir import default_run_dir as _default_run_dir
    from marl_ppo.run.signals import Interrupted

    if options.help_config:
        for line in help_config_lines(shutil.get_terminal_size((100, 24)).columns):
            print(line)
        return 0
    experiment, overrides = _split(options.args)
    if options.resume is not None:
        config, run_dir = _resumed(options, experiment, overrides)
    else:
        config = load_config(experiment, overrides)
        run_dir = options.run_dir or _default_run_dir(experiment)
        if not options.print_config:
            _check_run_dir(run_dir)
    resolve_factory(config.env.id)  # unknown ids and missing extras fail here, before any run directory
    if options.print_config:  # reads the experiment file (or the run's checkpoint) and writes nothing
        from marl_ppo.plan.copies import settle_copies  # the config's own imports (pydantic)

        print(config_yaml(settle_copies(config)), end="")
        return 0
    if options.resume is None and experiment is None:
        from marl_ppo.plan.copies import settle_copies

        print(defaults_notice(settle_copies(config), overrides), flush=True)
    from marl_ppo.run.loop import train  # heavy imports (torch, tensorboard) only when training

    try:
        result = train(config, run_dir, resume=options.resume is not None)
    except Interrupted as stopped:
        print(_resume_hint(stopped), file=sys.stderr)
        return stopped.exit_status
    print(
        f"done: {result.env_steps} env steps, {result.episodes} episodes, team return (last "
        f"{config.log.return_window}) {result.team_return_mean:.2f}, {result.sps:.0f} steps/s, "
        f"{result.wall_s / 60:.1f} min; run directory {run_dir}"
    )
    return 0


def _resumed(
    options: argparse.Namespace, experiment: str | None, overrides: list[str]
) -> tuple[ExperimentConfig, Path]:
    """The config and run directory of `--resume RUN_DIR [key=value ...]`."""
    from marl_ppo.config import ConfigError

    if options.run_dir is not None and options.run_dir != options.resume:
        raise ConfigError("--resume RUN_DIR continues in RUN_DIR itself; drop --run-dir")
    if experiment is not None:
        raise ConfigError(
            f"--resume takes the config from the run's checkpoint; drop the experiment file '{experiment}'"
        )
    from marl_ppo.run.resume import resume_config  # imports torch

    return resume_config(options.resume, overrides), options.resume


def _envs(options: argparse.Namespace) -> int:
    if options.env_command == "check":
        from marl_ppo.config import parse_overrides
        from marl_ppo.run.conformance import check_env

        resolve_factory(options.env_id)
        report = check_env(options.env_id, **parse_overrides(options.kwargs))
        print(report.render())
        return 0 if report.passed else 1
    rows = [
        {"id": s.id, "family": s.family, "installed": s.installed, "extra": s.extra}
        for s in registered_specs()
    ]
    rows = sorted(rows + _family_rows({str(row["id"]) for row in rows}), key=lambda row: str(row["id"]))
    if options.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        status = "installed" if row["installed"] else f"needs: pip install 'marl-ppo[{row['extra']}]'"
        print(as_invoked(f"{row['id']:40s} {status}"))
    return 0


def _family_rows(listed: set[str]) -> list[dict[str, Any]]:
    """What each id family (`vmas/`, `mamujoco/`) offers beyond the registered ids; `family/*` when
    its package is missing."""
    rows = []
    for family in id_families():
        if family.names is None:
            continue
        name = family.prefix.rstrip("/")
        offered = family.offered_ids() if family.installed else [family.prefix + "*"]
        rows += [
            {"id": env_id, "family": name, "installed": family.installed, "extra": family.extra}
            for env_id in offered
            if env_id not in listed
        ]
    return rows


def _eval(options: argparse.Namespace) -> int:
    from marl_ppo.eval.evaluate import side_returns, zero_sum
    from marl_ppo.eval.from_checkpoint import evaluate_checkpoint  # heavy imports (torch, envs)
    from marl_ppo.eval.partners import parse_partners
    from marl_ppo.league.average import pool_average

    if options.random:
        return _eval_random(options)

    partners = parse_partners(options.partner)
    output = evaluate_checkpoint(
        options.target,
        episodes=options.episodes,
        deterministic=options.deterministic,
        overrides=options.overrides,
        render=options.render,
        out=options.out,
        seed=options.seed,
        partners=partners,
        pool_score=pool_average,
    )
    team = output.result.to_dict()["team_return"]
    low, high = team["ci95"]
    video = f", video {output.video}" if output.video is not None else ""
    with_partners = "".join(f", {seat} played by {partner}" for seat, partner in partners.items())
    print(
        f"{len(output.result.team_returns)} episodes{with_partners}: team return (sum over agents) {team['mean']:.2f} "
        f"[95% CI {low:.2f}, {high:.2f}]; wrote {output.eval_json}{video}"
    )
    if output.versus is not None:
        print(f"against random opponents ({output.versus.mode}): {_scores(output.versus)}")
    elif zero_sum(output.result.team_returns, output.result.agent_returns):
        print(
            f"zero-sum: the team return is 0 in every episode; per agent "
            f"{side_returns(output.result.agents, output.result.agent_returns)}; add eval.vs_random=seats "
            "to score the policy against random players"
        )
    if output.nash_conv is not None:
        print(f"exploitability: NashConv {output.nash_conv:.4f} (OpenSpiel; 0 at a Nash equilibrium)")
    if output.pool is not None:
        pool = output.pool
        span = f"{len(pool.snapshots)} snapshots, {pool.snapshots[0]} to {pool.snapshots[-1]}"
        if pool.nash_conv is not None:
            print(f"the pool's average policy ({span}): NashConv {pool.nash_conv:.4f}")
        else:
            print(
                f"the pool's average policy ({span}): not computed, snapshot files {pool.missing} are "
                "missing from the run's league/pool/"
            )
    return 0


def _scores(versus: VersusResult) -> str:
    """A VersusResult's rates (or returns) as `key value, ...`."""
    return ", ".join(
        f"{key} {value:.2f}" for key, value in versus.to_dict().items() if isinstance(value, float)
    )


def _eval_random(options: argparse.Namespace) -> int:
    from marl_ppo.eval.evaluate import EvalError
    from marl_ppo.eval.random_floor import evaluate_random

    if options.render or options.deterministic:
        raise EvalError("--random plays a uniform random policy: drop --render and --deterministic")
    target, overrides = options.target, options.overrides
    if "=" in str(target):  # `eval --random env.id=...`: overrides alone, on the defaults
        target, overrides = None, [str(target), *overrides]
    floor = evaluate_random(
        target, episodes=options.episodes, overrides=overrides, out=options.out, seed=options.seed
    )
    team = floor.result.to_dict()["team_return"]
    low, high = team["ci95"]
    wrote = f"; wrote {floor.eval_json}" if floor.eval_json is not None else ""
    print(
        f"{len(floor.result.team_returns)} episodes of the uniform random policy: team return (sum over agents) "
        f"{team['mean']:.2f} [95% CI {low:.2f}, {high:.2f}]{wrote}"
    )
    if floor.versus is not None:
        print(f"random against random ({floor.versus.mode}): {_scores(floor.versus)}")
    if floor.nash_conv is not None:
        print(f"exploitability: NashConv {floor.nash_conv:.4f} (OpenSpiel; 0 at a Nash equilibrium)")
    return 0


def _sweep(options: argparse.Namespace) -> int:
    from marl_ppo.analysis.sweep import default_jobs, parse_grid, plan_sweep, run_sweep, summary_line

    grid = parse_grid(options.overrides)
    runs, config = plan_sweep(options.experiment, grid, options.seeds, options.out)
    resolve_factory(config.env.id)  # unknown ids and missing extras fail here, before any process starts
    if options.ray is not None:
        return _sweep_on_ray(options, runs, config)
    jobs = options.jobs if options.jobs is not None else min(default_jobs(config), len(runs))
    name = options.experiment.stem
    print(f"sweep {name}: {len(runs)} runs, {jobs} at a time, in {options.out / name}")
    outcome = run_sweep(options.experiment, runs, jobs)
    print(summary_line(name, outcome))
    if not outcome.failed:
        print(f"compare the seeds with: {shell_command('report', str(options.out / name))}")
    return 1 if outcome.failed else 0


def _sweep_on_ray(options: argparse.Namespace, runs: list[Any], config: ExperimentConfig) -> int:
    from marl_ppo.analysis.ray_sweep import run_sweep_on_ray
    from marl_ppo.analysis.sweep import summary_line

    name = options.experiment.stem
    print(f"sweep {name}: {len(runs)} runs on the Ray cluster at {options.ray}, in {options.out / name}")
    outcome = run_sweep_on_ray(options.experiment, runs, config, options.ray, options.jobs)
    print(summary_line(name, outcome))
    if not outcome.failed:
        print(f"compare the seeds with: {shell_command('report', str(options.out / name))}")
    return 1 if outcome.failed else 0


def _tune(options: argparse.Namespace) -> int:
    from marl_ppo.tune.command import TuneRequest, tune

    request = TuneRequest(
        experiment=options.experiment,
        space=options.space,
        overrides=tuple(options.overrides),
        trials=options.trials,
        seeds=options.seeds,
        out=options.out,
        jobs=options.jobs,
        ray=options.ray,
        pruner=options.pruner,
        score=options.score,
        fresh_seeds=options.fresh_seeds,
        sampler_seed=options.sampler_seed,
    )
    return tune(request)


def _reproduce(options: argparse.Namespace) -> int:
    from marl_ppo.analysis.reproduce import reproduce
    from marl_ppo.analysis.sweep import summary_line

    reproduction, outcome = reproduce(
        options.experiment, seeds=options.seeds, jobs=options.jobs, out=options.out
    )
    if reproduction is None:
        print(summary_line(options.experiment.stem, outcome))
        return 1
    for line in reproduction.lines():
        print(line)
    return 0 if reproduction.inside else 1


def _report(options: argparse.Namespace) -> int:
    from marl_ppo.analysis.report import write_report  # heavy imports (tensorboard, rliable, matplotlib)

    files = write_report(
        options.paths, options.out, reps=options.reps, by_code=not options.merge_code, names=options.name
    )
    seeds = sum(len(row.configuration.runs) for row in files.rows)
    duplicates = sum(len(row.configuration.duplicates) for row in files.rows)
    print(
        f"{seeds} run(s) in {len(files.rows)} configuration(s): wrote {files.markdown} and "
        f"{len(files.figures)} figure(s) in {options.out}"
    )
    if duplicates:
        print(
            f"warning: {duplicates} run(s) repeat the configuration and seed of another and are not counted "
            f"(listed in {files.markdown})",
            file=sys.stderr,
        )
    return 0


def _compare(options: argparse.Namespace) -> int:
    from marl_ppo.analysis.compare import write_comparison  # heavy imports (tensorboard, rliable, matplotlib)

    by = options.by.split(",") if options.by else None
    comparison = write_comparison(options.paths, options.out, by=by, names=options.name, reps=options.reps)
    if comparison.warning:
        print(f"warning: {comparison.warning}", file=sys.stderr)
    table = comparison.table
    seeds = len(table.of(table.tasks[0], table.algorithms[0]))
    print(
        f"{len(table.algorithms)} algorithm(s) x {len(table.tasks)} task(s) x {seeds} seed(s): wrote "
        + ", ".join(str(path) for path in comparison.files)
    )
    for algorithm, aggregates in comparison.aggregates.items():
        print(f"{algorithm}: IQM {aggregates['iqm']}, mean {aggregates['mean']}")
    return 0


def _rate(options: argparse.Namespace) -> int:
    from marl_ppo.league.ladder import ladder_markdown  # heavy imports (torch, envs, openskill)
    from marl_ppo.league.rate import rate_runs

    rated = rate_runs(
        options.runs,
        policies=options.policy,
        players=options.player,
        episodes=options.episodes,
        max_players=options.max_players,
        seed=options.seed,
        out=options.out,
        deterministic=options.deterministic,
        sides=options.sides,
        score=options.score,
    )
    print(ladder_markdown(rated.ratings), end="")
    print(f"{len(rated.players)} players, {len(rated.games)} games: wrote {rated.files.ratings_md.parent}")
    return 0


def _crossplay(options: argparse.Namespace) -> int:
    from marl_ppo.league.crossplay import crossplay_runs, write_crossplay  # heavy imports (torch, envs)

    result = crossplay_runs(
        options.runs,
        partners=options.partner,
        episodes=options.episodes,
        seed=options.seed,
        deterministic=options.deterministic,
        bounds=options.bounds,
    )
    files = write_crossplay(result, options.out)
    print(files.markdown.read_text(), end="")
    print(f"wrote {files.json}, {files.csv.name}, {files.markdown.name}, {files.png.name}")
    return 0


def _play(options: argparse.Namespace) -> int:
    from marl_ppo.eval.play import play_checkpoint  # heavy imports (torch, envs)

    played = play_checkpoint(
        options.target,
        human=options.human,
        games=options.games,
        record=options.record,
        seed=options.seed,
        deterministic=options.deterministic,
        overrides=options.overrides,
        window=not options.no_window,
    )
    return 130 if played.ended == "interrupted" else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `marl-ppo` console script."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # output left in the buffer meets a closed pipe here, not at interpreter exit
    except BrokenPipeError:
        if not quiet_closed_outputs():
            raise  # another pipe (an env worker's, ...) broke: not a reader that has read enough
        return 128 + signal.SIGPIPE  # as if ended by SIGPIPE, like other programs whose reader left


def _own_warnings_as_lines() -> None:
    """Print marl_ppo's own warnings as `warning: MESSAGE`, without the file and source line that
    Python adds (which point into our code or a library, not at anything the user wrote)."""
    default = warnings.formatwarning
    if getattr(default, "__name__", "") == "_one_line_warning":  # installed by an earlier main() call
        return

    def _one_line_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
        if category.__module__.startswith("marl_ppo."):
            return f"warning: {message}\n"
        return default(message, category, *args, **kwargs)

    warnings.formatwarning = _one_line_warning


def _main(argv: Sequence[str] | None) -> int:
    options = _parser().parse_args(argv)
    _own_warnings_as_lines()
    try:
        if options.command == "train":
            return _train(options)
        if options.command == "eval":
            return _eval(options)
        if options.command == "sweep":
            return _sweep(options)
        if options.command == "tune":
            return _tune(options)
        if options.command == "report":
            return _report(options)
        if options.command == "compare":
            return _compare(options)
        if options.command == "reproduce":
            return _reproduce(options)
        if options.command == "export":
            return _export(options)
        if options.command == "rate":
            return _rate(options)
        if options.command == "crossplay":
            return _crossplay(options)
        if options.command == "play":
            return _play(options)
        return _envs(options)
    except USER_ERRORS as err:
        if options.debug:
            raise
        print(f"error: {as_invoked(str(err))}", file=sys.stderr)
        return 2
    except RUN_FAULTS as err:
        if options.debug:
            raise
        print(f"error: {as_invoked(str(err))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _resume_hint(stopped: Interrupted) -> str:
    """The stop message, ending in the command that continues the run."""
    message, marker, _ = str(stopped).partition("continue with: ")
    if not marker:
        return str(stopped)
    return f"{message}{marker}{shell_command('train', '--resume', str(stopped.run_dir))}"


if __name__ == "__main__":
    sys.exit(main())
