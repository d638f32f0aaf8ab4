"""The frameworks `make bench` measures marl_ppo against, each in a virtual environment of its own.

A peer's packages are never marl_ppo's dependencies: the first bench run that needs a peer creates
its venv under `MARL_PPO_PEERS_DIR` (default `~/.cache/marl_ppo/bench-peers`), pip-installs the
pinned versions there with the torch version this process runs, and keeps it for later runs. The
peer's script (a file beside this one that imports only the peer's packages) runs with that venv's
python and prints one result line, which `run_peer` reads.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULT_PREFIX = "PEER_RESULT "
"""A peer script's last line: this prefix, then a JSON object with env_steps, seconds and agents
(optionally team_return and compile_seconds)."""


class PeerUnavailable(RuntimeError):
    """A peer's venv could not be created or its script could not run; the bench goes on without it."""


@dataclass(frozen=True)
class Peer:
    """A framework to compare with: the pip requirements of its venv and the script run there."""

    name: str
    requirements: tuple[str, ...]
    script: str
    """File name of the script, in this folder."""


SB3 = Peer(
    "sb3",
    ("stable-baselines3==2.9.2", "supersuit==3.11.0", "pettingzoo[butterfly]==1.27.0"),
    "peer_sb3_pistonball.py",
)
BENCHMARL = Peer(
    "benchmarl",
    # TorchRL 0.11 finds simple_spread in pettingzoo.mpe (pygame through its extra), moved to mpe2 in 1.25
    ("benchmarl==1.5.2", "torchrl==0.11.1", "tensordict==0.11.0", "pettingzoo[mpe]==1.24.3"),
    "peer_benchmarl_spread.py",
)


@dataclass(frozen=True)
class PeerResult:
    """What a peer's script measured, setup excluded."""

    env_steps: int
    """Parallel env steps (every agent acts once); SB3's agent-steps divided by the team size."""
    seconds: float
    agents: int
    team_return: float | None = None
    """The mean team return of the script's last episodes, where it reports one."""
    compile_seconds: float | None = None
    """Time spent compiling before the timed run, where the script compiles (JAX); not in `seconds`."""

    @property
    def sps(self) -> float:
        """Env steps per second."""
        return self.env_steps / self.seconds

    @property
    def agent_sps(self) -> float:
        """Agent-steps per second, the unit SB3 counts in."""
        return self.sps * self.agents


def torch_requirement() -> str:
    """The torch this process runs, as a pin for a peer's venv (a local label such as +cpu dropped)."""
    import torch

    return f"torch=={torch.__version__.split('+')[0]}"


def peers_dir() -> Path:
    """Where the peers' venvs live: `MARL_PPO_PEERS_DIR`, else `~/.cache/marl_ppo/bench-peers`."""
    configured = os.environ.get("MARL_PPO_PEERS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "marl_ppo" / "bench-peers"


def venv_python(peer: Peer, root: Path) -> Path:
    """The python of the peer's venv under `root`."""
    return root / peer.name / "bin" / "python"


def install_commands(peer: Peer, root: Path, torch_pin: str, base_python: str) -> list[list[str]]:
    """The commands that create the peer's venv: `python -m venv`, then one pip install of every pin.

    `MARL_PPO_PEERS_PIP_ARGS` adds pip options, such as an index that serves the CPU build of torch.
    """
    python = str(venv_python(peer, root))
    extra = shlex.split(os.environ.get("MARL_PPO_PEERS_PIP_ARGS", ""))
    return [
        [base_python, "-m", "venv", str(root / peer.name)],
        [python, "-m", "pip", "install", "--quiet", *extra, torch_pin, *peer.requirements],
    ]


def ensure_peer(peer: Peer, root: Path | None = None) -> Path:
    """The python of the peer's venv, created first when it is missing or was made for other pins."""
    root = peers_dir() if root is None else root
    torch_pin = torch_requirement()
    stamp = root / peer.name / "marl_ppo-requirements.txt"
    wanted = "\n".join([torch_pin, *peer.requirements]) + "\n"
    if stamp.is_file() and stamp.read_text() == wanted and venv_python(peer, root).is_file():
        return venv_python(peer, root)
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{peer.name}-install.log"
    print(f"{peer.name}: creating its venv in {root / peer.name} (once; log in {log})", flush=True)
    with log.open("w") as out:
        for command in install_commands(peer, root, torch_pin, sys.executable):
            out.write(f"$ {shlex.join(command)}\n")
            out.flush()
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise PeerUnavailable(
                    f"{peer.name} could not be installed: `{' '.join(command[1:4])}` exited "
                    f"{done.returncode}; see {log}"
                )
    stamp.write_text(wanted)
    return venv_python(peer, root)


def parse_result(output: str) -> PeerResult:
    """The result line of a peer script's output."""
    lines = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        raise ValueError("no result line")
    record = json.loads(lines[-1][len(RESULT_PREFIX) :])
    team_return, compile_seconds = record.get("team_return"), record.get("compile_seconds")
    return PeerResult(
        int(record["env_steps"]),
        float(record["seconds"]),
        int(record["agents"]),
        None if team_return is None else float(team_return),
        None if compile_seconds is None else float(compile_seconds),
    )


def run_peer(peer: Peer, args: list[str], env: dict[str, str] | None = None) -> PeerResult:
    """Run the peer's script with `args` in its venv (created first if needed); its measured result."""
    python = ensure_peer(peer)
    command = [str(python), str(HERE / peer.script), *args]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PeerUnavailable(f"{peer.name}'s script {peer.script} failed (exit {done.returncode}): {last}")
    try:
        return parse_result(done.stdout)
    except (ValueError, KeyError) as error:
        raise PeerUnavailable(f"{peer.name}'s script {peer.script} printed no result ({error})") from None
