"""Command line: `marl-ppo train [EXPERIMENT.yaml] [key=value ...] [--run-dir DIR]` and `marl-ppo envs`.

Parses arguments and calls the library; user errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from marl_ppo.checkpoint import CheckpointError
from marl_ppo.config import ConfigError, config_keys, load_config, parse_overrides
from marl_ppo.envs.pettingzoo import EnvContractError
from marl_ppo.faults import RunFault
from marl_ppo.registry import EnvError, registered_specs, resolve_factory

USER_ERRORS = (ConfigError, EnvError, CheckpointError, EnvContractError)
"""Bad input (config, arguments, files, an env that breaks its contract): one line, exit status 2."""
RUN_FAULTS = (RunFault,)
"""A run that stopped on a fault (numerical, worker, disk): one line, exit status 1."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marl-ppo", description="Multi-agent PPO (MAPPO / IPPO).")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train on an experiment file with key=value overrides")
    train.add_argument("args", nargs="*", metavar="[EXPERIMENT.yaml] [key=value ...]")
    train.add_argument(
        "--run-dir", type=Path, help="where to write logs and checkpoints (default: runs/<name>-<time>)"
    )
    train.add_argument("--help-config", action="store_true", help="list every config key with its meaning")
    train.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    envs = commands.add_parser("envs", help="list registered environment ids, or check one")
    envs.add_argument("--json", action="store_true", help="print the list as JSON objects")
    envs.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    env_commands = envs.add_subparsers(dest="env_command")
    check = env_commands.add_parser("check", help="conformance check of an env id (exit status 1 on failure)")
    check.add_argument(
        "env_id", metavar="ID", help="registered id, package.module:callable or file.py:callable"
    )
    check.add_argument("kwargs", nargs="*", metavar="key=value", help="keyword arguments for the env factory")
    check.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    return parser


def _split(args: Sequence[str]) -> tuple[str | None, list[str]]:
    experiment, overrides = None, []
    for position, arg in enumerate(args):
        if "=" in arg:
            overrides.append(arg)
        elif position == 0:
            experiment = arg
        else:
            raise ConfigError(f"argument '{arg}' is neither the experiment file (first) nor key=value")
    return experiment, overrides


def _default_run_dir(experiment: str | None) -> Path:
    name = Path(experiment).stem if experiment else "default"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _check_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError(f"run directory '{run_dir}' already exists and is not empty; pick a new --run-dir")
    existing = next(p for p in (run_dir.absolute(), *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(
            f"run directory '{run_dir}' cannot be created: '{existing}' is a file; pick another --run-dir"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"run directory '{run_dir}' is not writable (no write permission on '{existing}'); pick another --run-dir"
        )


def _train(options: argparse.Namespace) -> int:
    if options.help_config:
        for key, doc in config_keys().items():
            print(f"{key:28s} {doc}")
        return 0
    experiment, overrides = _split(options.args)
    config = load_config(experiment, overrides)
    run_dir = options.run_dir or _default_run_dir(experiment)
    _check_run_dir(run_dir)
    resolve_factory(
        config.env.id
    )  # unknown ids and missing extras fail here, before the run directory exists
    from marl_ppo.train import train  # heavy imports (torch, tensorboard) only when training

    result = train(config, run_dir)
    print(
        f"done: {result.env_steps} env steps, {result.episodes} episodes, team return (last "
        f"{config.log.return_window}) {result.team_return_mean:.2f}, {result.sps:.0f} steps/s, "
        f"{result.wall_s / 60:.1f} min; run directory {run_dir}"
    )
    return 0


def _envs(options: argparse.Namespace) -> int:
    if options.env_command == "check":
        from marl_ppo.conformance import check_env

        resolve_factory(options.env_id)
        report = check_env(options.env_id, **parse_overrides(options.kwargs))
        print(report.render())
        return 0 if report.passed else 1
    rows = [
        {"id": s.id, "family": s.family, "installed": s.installed, "extra": s.extra}
        for s in registered_specs()
    ]
    if options.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        status = "installed" if row["installed"] else f"needs: pip install 'marl-ppo[{row['extra']}]'"
        print(f"{row['id']:40s} {status}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `marl-ppo` console script."""
    options = _parser().parse_args(argv)
    try:
        if options.command == "train":
            return _train(options)
        return _envs(options)
    except USER_ERRORS as err:
        if options.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RUN_FAULTS as err:
        if options.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
