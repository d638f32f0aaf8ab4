"""Conformance check for an environment: does it keep the PettingZoo parallel contract well enough to train?

`check_env(env_id)` runs, each isolated so one failure does not hide the others:
1. PettingZoo's own `parallel_api_test` (`api_test` for turn-based AEC envs);
2. same seed, same actions -> same trajectory (two fresh copies side by side);
3. every observation inside its declared space, the global state matching `state_space`;
4. a one-update smoke train through the whole framework.
`marl-ppo envs check ID` prints the report; the exit status is 0 only when everything passed.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from marl_ppo.config import ExperimentConfig, build_config, config_to_dict, merge
from marl_ppo.envs.adapters.aec import is_aec
from marl_ppo.envs.registry import env_spec, make_env, registered_id


@dataclass(frozen=True)
class CheckResult:
    """One named check: passed or not, with a one-line detail."""

    name: str
    status: str
    """PASS, FAIL or SKIP (a check that does not apply)."""
    detail: str

    @property
    def passed(self) -> bool:
        """Not failed (skipped checks do not fail a report)."""
        return self.status != "FAIL"


@dataclass
class CheckReport:
    """All checks of one env id."""

    env_id: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(r.passed for r in self.results)

    def render(self) -> str:
        """A readable multi-line report."""
        lines = [f"conformance of '{self.env_id}':"]
        lines += [f"  {r.status}  {r.name:<20} {r.detail}" for r in self.results]
        lines.append("all checks passed" if self.passed else "some checks failed")
        return "\n".join(lines)


def _make(env_id: str, kwargs: dict[str, Any]) -> Any:
    """The env as training sees it: a Gymnasium env is wrapped as a team (GymnasiumTeamEnv)."""
    env = make_env(env_id, **kwargs)
    if isinstance(env, gym.Env):
        from marl_ppo.envs.adapters.gymnasium import GymnasiumTeamEnv

        env = GymnasiumTeamEnv(env)
    return env


def _random_action(env: Any, agent: str, observation: Any, info: Any, rng: np.random.Generator) -> Any:
    space = env.action_space(agent)
    space.seed(int(rng.integers(2**31)))
    mask = None
    if isinstance(observation, dict) and "action_mask" in observation:
        mask = observation["action_mask"]
    elif isinstance(info, dict) and "action_mask" in info:
        mask = info["action_mask"]
    if mask is not None and isinstance(space, gym.spaces.Discrete):
        return space.sample(mask=np.asarray(mask, dtype=np.int8))
    if mask is not None and isinstance(space, gym.spaces.MultiDiscrete):
        return space.sample(mask=tuple(np.asarray(m, dtype=np.int8) for m in mask))
    return space.sample()


def _trajectory(env_id: str, kwargs: dict[str, Any], seed: int, steps: int) -> list[Any]:
    """Observations, rewards and flags of `steps` steps with seeded random valid actions."""
    env = _make(env_id, kwargs)
    rng = np.random.default_rng(seed)
    observations, infos = env.reset(seed=seed)
    record: list[Any] = [_snapshot(observations)]
    for _ in range(steps):
        if not env.agents:
            observations, infos = env.reset()
            record.append(("reset", _snapshot(observations)))
            continue
        actions = {a: _random_action(env, a, observations[a], infos.get(a), rng) for a in env.agents}
        observations, rewards, terminations, truncations, infos = env.step(actions)
        record.append((_snapshot(observations), dict(rewards), dict(terminations), dict(truncations)))
    env.close()
    return record


def _snapshot(observations: dict[str, Any]) -> dict[str, Any]:
    return {agent: _as_array(obs) for agent, obs in observations.items()}


def _as_array(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {key: _as_array(value) for key, value in obs.items()}
    if isinstance(obs, tuple | list):
        return [_as_array(value) for value in obs]
    return np.array(obs, copy=True)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


class Skipped(Exception):
    """A check that does not apply to this env; its message says why."""


def _check_api(env_id: str, kwargs: dict[str, Any]) -> str:
    from pettingzoo.test import api_test, parallel_api_test

    env = _make(env_id, kwargs)
    if is_aec(env):
        with contextlib.redirect_stdout(io.StringIO()):
            api_test(env, num_cycles=100)
        return "pettingzoo.test.api_test (turn-based AEC env), 100 cycles"
    _, infos = env.reset(seed=0)
    if any(isinstance(info, dict) and "action_mask" in info for info in infos.values()):
        raise Skipped("masks are given in infos, which parallel_api_test ignores when it samples actions")
    with contextlib.redirect_stdout(io.StringIO()):
        parallel_api_test(env, num_cycles=100)
    return "pettingzoo.test.parallel_api_test, 100 cycles"


def _skip_aec(env_id: str, kwargs: dict[str, Any], reason: str) -> None:
    if is_aec(_make(env_id, kwargs)):
        raise Skipped(f"turn-based AEC env: {reason}")


def _check_determinism(env_id: str, kwargs: dict[str, Any], steps: int = 200) -> str:
    _skip_aec(env_id, kwargs, "not checked for AEC envs yet")
    first, second = (_trajectory(env_id, kwargs, seed=7, steps=steps) for _ in range(2))
    for step, (a, b) in enumerate(zip(first, second, strict=True)):
        if not _equal(a, b):
            raise AssertionError(
                f"two copies reset with seed 7 diverge at step {step}; seed every RNG in reset()"
            )
    return f"{steps} steps with seed 7 repeat exactly"


def _check_spaces(env_id: str, kwargs: dict[str, Any], steps: int = 200) -> str:
    _skip_aec(env_id, kwargs, "PettingZoo's api_test above checks observations against their spaces")
    env = _make(env_id, kwargs)
    rng = np.random.default_rng(0)
    observations, infos = env.reset(seed=0)
    state_space = getattr(env, "state_space", None)
    checked = 0
    for step in range(steps + 1):
        for agent, obs in observations.items():
            if not env.observation_space(agent).contains(obs):
                raise AssertionError(
                    f"agent '{agent}' at step {step}: observation outside observation_space(agent)"
                )
            checked += 1
        if isinstance(state_space, gym.spaces.Space) and env.agents:
            state = np.asarray(env.state())
            if state.shape != state_space.shape or not np.isfinite(state).all():
                raise AssertionError(
                    f"step {step}: state() has shape {state.shape}, state_space {state_space.shape}"
                )
        if not env.agents:
            observations, infos = env.reset()
            continue
        actions = {a: _random_action(env, a, observations[a], infos.get(a), rng) for a in env.agents}
        observations, _, _, _, infos = env.step(actions)
    env.close()
    return f"{checked} observations inside their spaces" + (
        ", state() matches state_space" if state_space else ""
    )


def _config(env_id: str, kwargs: dict[str, Any], **overrides: Any) -> ExperimentConfig:
    """The default config on `env_id` built with `kwargs`, with `overrides`."""
    return build_config(
        merge(config_to_dict(build_config({})), {"env": {"id": env_id, "kwargs": kwargs}, **overrides})
    )


def _check_train(env_id: str, kwargs: dict[str, Any]) -> str:
    from marl_ppo.run.loop import train

    config = _config(
        env_id,
        kwargs,
        rollout={"num_envs": 2, "rollout_steps": 16},
        total_steps=32,
        log={"progress": False},
        ppo={"train_pi_iters": 1, "train_vf_iters": 1, "num_minibatches": 1},
    )
    with tempfile.TemporaryDirectory() as run_dir:
        result = train(config, run_dir)
    return f"{result.env_steps} env steps and {result.updates} update through marl_ppo"


CHECKS: tuple[tuple[str, Callable[[str, dict[str, Any]], str]], ...] = (
    ("PettingZoo API", _check_api),
    ("same seed, same run", _check_determinism),
    ("spaces and state", _check_spaces),
    ("one-update train", _check_train),
)


def _batched(env_id: str) -> bool:
    name = registered_id(env_id)
    return name is not None and env_spec(name).batched


def _skip_batched_api(env_id: str, kwargs: dict[str, Any]) -> str:
    raise Skipped("a batched simulator holds every copy in one object, not a PettingZoo env")


def _batched_steps(env_id: str, kwargs: dict[str, Any], seed: int, steps: int = 50) -> list[dict[str, Any]]:
    """Observations, rewards and flags of 4 copies of a batched env over `steps` seeded random steps."""
    import torch

    from marl_ppo.envs.factory import build_vector_env, probe_layout
    from marl_ppo.eval.random_policy import random_actions

    config = _config(env_id, kwargs, rollout={"num_envs": 4}, seed=seed)
    venv = build_vector_env(config, probe_layout(config))  # a batched simulator: nothing is probed
    torch.manual_seed(seed)
    arrays = venv.reset(seed)
    record = []
    for _ in range(steps):
        arrays = venv.step(random_actions(venv.spec, arrays, torch.device("cpu")))
        record.append(
            {
                name: [torch.as_tensor(x).clone() for x in (g.obs, g.reward, g.terminated, g.truncated)]
                for name, g in arrays.groups.items()
            }
            | {"state": torch.as_tensor(arrays.state).clone()}
        )
    return record


def _check_batched_determinism(env_id: str, kwargs: dict[str, Any]) -> str:
    first, second = (_batched_steps(env_id, kwargs, seed=7) for _ in range(2))
    for step, (a, b) in enumerate(zip(first, second, strict=True)):
        if not _equal({k: _as_numpy(v) for k, v in a.items()}, {k: _as_numpy(v) for k, v in b.items()}):
            raise AssertionError(f"two simulators seeded 7 diverge at step {step}; seed every RNG in reset()")
    return f"{len(first)} steps of 4 copies with seed 7 repeat exactly"


def _check_batched_spaces(env_id: str, kwargs: dict[str, Any]) -> str:
    record = _batched_steps(env_id, kwargs, seed=0)
    for step, arrays in enumerate(record):
        for name, value in arrays.items():
            values = value if isinstance(value, list) else [value]
            if not all(np.isfinite(_as_numpy(x)).all() for x in values):
                raise AssertionError(f"step {step}: group '{name}' has a NaN or infinite value")
    return f"{len(record)} steps of 4 copies: observations, rewards and state finite"


def _as_numpy(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_numpy(x) for x in value]
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


BATCHED_CHECKS: tuple[tuple[str, Callable[[str, dict[str, Any]], str]], ...] = (
    ("PettingZoo API", _skip_batched_api),
    ("same seed, same run", _check_batched_determinism),
    ("spaces and state", _check_batched_spaces),
    ("one-update train", _check_train),
)
"""The checks of a batched simulator (VMAS), through the vector env a run builds from it."""


def check_env(env_id: str, /, **kwargs: Any) -> CheckReport:
    """Run every conformance check on `env_id` built with `kwargs`; failures are reported, not raised."""
    report = CheckReport(env_id)
    for name, check in BATCHED_CHECKS if _batched(env_id) else CHECKS:
        try:
            report.results.append(CheckResult(name, "PASS", check(env_id, kwargs)))
        except Skipped as why:
            report.results.append(CheckResult(name, "SKIP", str(why)))
        except Exception as err:  # a check's failure is the report's content
            where = traceback.extract_tb(err.__traceback__)[-1]
            detail = f"{type(err).__name__}: {err}".strip().splitlines()[0]
            report.results.append(CheckResult(name, "FAIL", f"{detail} ({where.filename}:{where.lineno})"))
    return report
