"""Who can sit at a game: trained policies, the random policy and scripted ones, named by the user.

A `Player` is a name and a way to act for every agent of E env copies (`build` makes its `Acting`,
fresh for each match). A partner or opponent is named on the command line (or in `eval.partners`)
by one of the forms `partner_player` reads:

- `random`: the uniform random policy over the allowed actions;
- a run directory (its `checkpoints/final.pt`, else `latest.pt`) or a checkpoint file: a trained
  policy, with the networks its own config describes;
- `package.module:callable` or `path/to/file.py:callable` (the forms `env.id` takes), or
  `scripted/NAME` for the scripted players the project ships (`SCRIPTED`): a scripted policy.

A scripted policy is a callable `policy(observation, action_mask, agent) -> action`, called for each
agent it plays whenever that agent is to act: `observation` is the agent's flat observation as the
trained policy sees it (NumPy), `action_mask` its allowed actions (bool, None where the env gives no
mask), `agent` its name. A class is instantiated once per env copy (no arguments) and its instances
are called the same way; their `reset()`, where defined, is called when a new episode starts.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import build_config
from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.eval.evaluate import EvalError
from marl_ppo.eval.loading import load_policy, resolve_checkpoint
from marl_ppo.eval.random_policy import RandomActing
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.stepper import Acting, PolicyActing

RANDOM = "random"
"""The uniform random policy's player name."""

SCRIPTED_PREFIX = "scripted/"
SCRIPTED: dict[str, str] = {
    "connect_four": "marl_ppo.eval.scripted.connect_four:connect_four",
    "hanabi": "marl_ppo.eval.scripted.hanabi:hanabi",
    "smax": "marl_ppo.eval.scripted.smax:SmaxHeuristic",
}
"""The scripted players the project ships: `scripted/NAME` -> the `module:callable` that plays it."""


@dataclass(frozen=True)
class Player:
    """A named policy that can sit at a match: `build(spec, copies, device)` makes its `Acting`, fresh
    (no carries) for each match."""

    name: str
    build: Callable[[TeamSpec, int, torch.device], Acting]


def policy_player(name: str, model: TeamModel, *, deterministic: bool = False) -> Player:
    """A trained policy: a sample of its action distribution, or its mode with `deterministic`."""

    def build(spec: TeamSpec, copies: int, device: torch.device) -> Acting:
        return PolicyActing(model, copies, device, deterministic=deterministic)

    return Player(name, build)


def random_player(name: str = RANDOM) -> Player:
    """The uniform random policy (over the allowed actions)."""

    def build(spec: TeamSpec, copies: int, device: torch.device) -> Acting:
        return RandomActing(spec, device)

    return Player(name, build)


ScriptedPolicy = Callable[[np.ndarray, "np.ndarray | None", str], Any]


class ScriptedActing:
    """A scripted policy as the stepping loop drives it: one call per agent it plays and per env copy,
    for the agents that are to act; every other agent gets action 0 (its actions are not used)."""

    def __init__(
        self,
        make: Callable[[], ScriptedPolicy],
        spec: TeamSpec,
        copies: int,
        device: torch.device,
        agents: Sequence[str] | None = None,
    ) -> None:
        """`make()`: the policy of one env copy (the same function for all, or a new instance each);
        `agents`: the agents it plays (default: all)."""
        self.spec, self.device = spec, device
        self.policies = [make() for _ in range(copies)]
        played = set(spec.agents if agents is None else agents)
        self.played = {g.name: [i for i, a in enumerate(g.agents) if a in played] for g in spec.groups}

    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """Per group, `(E, A_g, ...)` actions: the policy's for its agents that are alive, 0 elsewhere."""
        actions = {}
        for group in self.spec.groups:
            data = arrays.groups[group.name]
            obs, alive, mask = (_numpy(data.obs), _numpy(data.alive), _numpy(data.action_mask))
            discrete = isinstance(group.action_space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
            out = np.zeros((len(self.policies), group.num_agents, *group.action_shape), np.float64)
            for copy, policy in enumerate(self.policies):
                for index in self.played[group.name]:
                    if not alive[copy, index]:
                        continue
                    allowed = mask[copy, index] if group.mask_dim else None
                    chosen = policy(obs[copy, index], allowed, group.agents[index])
                    out[copy, index] = _checked(chosen, group, allowed, group.agents[index])
            dtype = torch.int64 if discrete else torch.float32
            actions[group.name] = torch.as_tensor(out, device=self.device).to(dtype)
        return actions

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """A copy whose episode ended starts the next one: its policy's `reset()`, where it has one."""
        for copy in np.flatnonzero(_numpy(episode_over)):
            reset = getattr(self.policies[copy], "reset", None)
            if callable(reset):
                reset()


def _numpy(array: np.ndarray | torch.Tensor) -> np.ndarray:
    return array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)


def _checked(chosen: Any, group: Any, allowed: np.ndarray | None, agent: str) -> np.ndarray:
    """The scripted action as an array of the group's action shape; a masked or malformed one is refused."""
    value = np.asarray(chosen, dtype=np.float64).reshape(-1)
    if value.size != int(np.prod(group.action_shape)):
        raise EvalError(
            f"scripted policy returned {chosen!r} for agent '{agent}', but its actions have shape "
            f"{tuple(group.action_shape) or '()'}; return one action of that shape"
        )
    if isinstance(group.action_space, gym.spaces.Discrete):
        action = int(value[0])
        if not 0 <= action < int(group.action_space.n) or (allowed is not None and not allowed[action]):
            legal = (
                np.flatnonzero(allowed).tolist() if allowed is not None else f"0..{group.action_space.n - 1}"
            )
            raise EvalError(
                f"scripted policy chose action {action} for agent '{agent}', which is not allowed now "
                f"(allowed: {legal}); a scripted policy must respect the action mask"
            )
    return value.reshape(group.action_shape)


def scripted_player(name: str, target: Any, agents: Sequence[str] | None = None) -> Player:
    """A scripted policy (a callable, or a class instantiated per env copy) as a player of `agents`."""
    make: Callable[[], ScriptedPolicy] = target if isinstance(target, type) else (lambda: target)

    def build(spec: TeamSpec, copies: int, device: torch.device) -> Acting:
        return ScriptedActing(make, spec, copies, device, agents)

    return Player(name, build)


def partner_player(
    text: str,
    spec: TeamSpec,
    device: torch.device,
    *,
    agents: Sequence[str] | None = None,
    deterministic: bool = False,
    name: str | None = None,
) -> Player:
    """The player that `text` names (see the module's forms), to act for `agents` of `spec`'s env."""
    if text == RANDOM:
        return random_player(name or RANDOM)
    if text.startswith(SCRIPTED_PREFIX):
        key = text[len(SCRIPTED_PREFIX) :]
        if key not in SCRIPTED:
            raise EvalError(
                f"partner '{text}': no scripted player '{key}'; the project ships "
                f"{', '.join(SCRIPTED_PREFIX + k for k in sorted(SCRIPTED)) or 'none'}"
            )
        return scripted_player(name or text, load_callable(SCRIPTED[key], text), agents)
    path = Path(text)
    if path.is_dir() or (path.is_file() and path.suffix != ".py"):
        return policy_player(
            name or player_name(path), run_model(path, spec, device), deterministic=deterministic
        )
    if ":" in text:
        return scripted_player(name or text, load_callable(text, text), agents)
    raise EvalError(
        f"partner '{text}' is not a run directory, a checkpoint file, 'random', '{SCRIPTED_PREFIX}NAME' or a "
        "scripted policy 'package.module:callable' / 'path/to/file.py:callable'; check the path"
    )


def player_name(path: Path) -> str:
    """A run's or checkpoint's name in tables: the run directory's name (`RUN/best` for a named checkpoint)."""
    if path.is_dir():
        return path.name
    if path.parent.name == "checkpoints":
        run = path.parent.parent.name
        return run if path.stem in ("final", "latest") else f"{run}/{path.stem}"
    return path.stem


def run_model(path: Path, spec: TeamSpec, device: torch.device) -> TeamModel:
    """The trained policy of a run directory or checkpoint, with the networks its own config describes."""
    checkpoint, _ = resolve_checkpoint(path)
    payload = load_checkpoint(checkpoint)
    if "model" not in payload or "config" not in payload:
        raise EvalError(f"'{checkpoint}' holds no policy (no model or config); pass a run's checkpoint")
    return load_policy(payload, spec, build_config(payload["config"]), device)


def load_callable(target: str, named: str) -> Any:
    """The callable `package.module:callable` or `path/to/file.py:callable` names."""
    source, _, attr = target.rpartition(":")
    if not source or not attr:
        raise EvalError(f"partner '{named}': name a callable after a colon, e.g. my_module:policy")
    if source.endswith(".py"):
        module = _file_module(Path(source), named)
    else:
        try:
            module = importlib.import_module(source)
        except ImportError as err:
            raise EvalError(f"partner '{named}': cannot import '{source}' ({err}); check the name") from None
    found = getattr(module, attr, None)
    if not callable(found):
        raise EvalError(f"partner '{named}': '{source}' defines no callable '{attr}'; check the name")
    return found


def _file_module(path: Path, named: str) -> Any:
    """The module of a user's file, loaded once per process under a name of its absolute path."""
    if not path.is_file():
        raise EvalError(f"partner '{named}': file '{path}' does not exist; check the path")
    module_name = "marl_ppo_user_partner_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise EvalError(f"partner '{named}': cannot load '{path}' as a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise EvalError(
            f"partner '{named}': loading '{path}' raised {type(err).__name__}: {' '.join(str(err).split())}"
        ) from err
    sys.modules[module_name] = module
    return module
