"""Evaluation: whole episodes of a policy on env copies seeded apart from training, with 95% CIs.

`run_episodes` plays any vector env with a policy; `PeriodicEvaluation` runs it during training
(logged under `eval/`); `marl_ppo.eval.from_checkpoint` runs it on a saved run for `marl-ppo eval`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marl_ppo.config import ExperimentConfig, build_config, config_to_dict
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.random_policy import RandomActing
from marl_ppo.faults import UserError
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.stepper import Acting, EpisodeLimitError, Finished, PolicyActing, Stepper

EVAL_SEED_OFFSET = 1_000_000
"""Eval env copy i is reset with `seed + EVAL_SEED_OFFSET + i`: never a seed a training env copy gets."""

MAX_EPISODE_STEPS = 100_000
"""An evaluation stops with an error when an env copy runs this many steps without ending an episode."""


PolicyScore = Callable[[TeamModel], dict[str, float]]
"""A score of the policy itself, computed at each periodic evaluation besides its episodes (tags -> values),
such as its exploitability (`marl_ppo.eval.exploitability.NashConvScore`)."""


class EvalError(UserError, ValueError):
    """A user-facing evaluation problem; its message is one line naming the value and the fix."""


def zero_sum(team_returns: np.ndarray, agent_returns: np.ndarray) -> bool:
    """Whether the episodes' rewards cancel out over the agents (a zero-sum game: the team return is 0
    in every episode) while the agents' own returns do not: the team return then says nothing."""
    return (
        len(team_returns) > 0
        and bool(np.all(np.abs(team_returns) < 1e-6))
        and bool(np.any(np.abs(agent_returns) >= 1e-6))
    )


def side_returns(agents: Sequence[str], agent_returns: np.ndarray, *, shown: int = 4) -> str:
    """`agent mean, ...` of `(episodes, agents)` returns, the first `shown` agents (`...` for the rest)."""
    means = agent_returns.mean(axis=0)
    text = ", ".join(f"{agent} {mean:+.2f}" for agent, mean in zip(agents[:shown], means, strict=False))
    return text + (", ..." if len(agents) > shown else "")


def make_out_dir(path: Path) -> None:
    """Create the folder `eval` writes into, or a one-line EvalError (a file in the way, /proc, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EvalError(
            f"--out '{path}' cannot be created ({err.strerror or err}); pick another --out"
        ) from None


@dataclass(frozen=True)
class EvalResult:
    """Returns of the evaluated episodes, in a fixed order (env copy, then episode of that copy)."""

    agents: tuple[str, ...]
    team_returns: np.ndarray
    """`(N,)`: the sum over agents of each episode's rewards."""
    agent_returns: np.ndarray
    """`(N, num_agents)`: each agent's return, in the team's agent order."""
    lengths: np.ndarray
    """`(N,)`: env steps of each episode."""
    seed: int
    deterministic: bool
    won: np.ndarray | None = None
    """`(N,)` bools: the episodes the team won, for an env whose episodes can be won (SMAX); else None."""

    def scalars(self, *, per_agent: bool) -> dict[str, float]:
        """Mean returns as TensorBoard tags under `eval/` (per agent under `eval/agents/<id>/`)."""
        scalars = {
            "eval/team_return": float(self.team_returns.mean()),
            "eval/agent_return": float(self.agent_returns.mean()),
            "eval/episode_length": float(self.lengths.mean()),
        }
        if self.won is not None:
            scalars["eval/win_rate"] = float(self.won.mean())
        if per_agent:
            for agent, returns in zip(self.agents, self.agent_returns.T, strict=True):
                scalars[f"eval/agents/{agent}/return"] = float(returns.mean())
        return scalars

    def to_dict(self) -> dict[str, Any]:
        """Summary statistics with 95% confidence intervals plus every episode's values (for eval.json)."""
        return {
            "episodes": len(self.team_returns),
            "deterministic": self.deterministic,
            "seed": self.seed,
            "team_return": mean_ci95(self.team_returns),
            "agent_return": mean_ci95(self.agent_returns.mean(axis=1)),
            "agents": {
                agent: mean_ci95(returns)
                for agent, returns in zip(self.agents, self.agent_returns.T, strict=True)
            },
            "episode_length": mean_ci95(self.lengths),
            **({} if self.won is None else {"win_rate": mean_ci95(self.won.astype(np.float64))}),
            "per_episode": {
                "team_return": self.team_returns.tolist(),
                "agent_returns": self.agent_returns.tolist(),
                "length": self.lengths.tolist(),
            },
        }


def mean_ci95(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Mean, sample std and Student-t 95% confidence interval of the mean (nan bounds for one value)."""
    data = np.asarray(values, dtype=np.float64)
    mean = float(data.mean())
    if len(data) < 2:
        return {"mean": mean, "std": float("nan"), "ci95": [float("nan"), float("nan")]}
    from scipy import stats

    std = float(data.std(ddof=1))
    half = float(stats.t.ppf(0.975, len(data) - 1)) * std / math.sqrt(len(data))
    return {"mean": mean, "std": std, "ci95": [mean - half, mean + half]}


def eval_seed(config: ExperimentConfig) -> int:
    """The first eval env seed of a run: apart from every seed its training env copies get."""
    return config.seed + EVAL_SEED_OFFSET


@contextlib.contextmanager
def _global_rng_untouched(device: torch.device) -> Iterator[None]:
    """Restore Python's, NumPy's and torch's global RNG afterwards: evaluation never perturbs training."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def run_episodes(
    venv: VectorEnv,
    model: TeamModel | None,
    device: torch.device,
    *,
    episodes: int,
    seed: int,
    deterministic: bool,
) -> EvalResult:
    """Play `episodes` whole episodes, each env copy a fixed share of them (so short episodes are not
    favoured). `model=None` plays the uniform random policy (each agent's allowed actions equally
    likely; Box actions uniform in their bounds, clipped to [-1, 1])."""

    def acting() -> Acting:  # a policy's carries, fresh for every copy; its weights read once
        if model is None:
            return RandomActing(venv.spec, device)
        return PolicyActing(model, venv.num_envs, device, deterministic=deterministic)

    return play_episodes(venv, acting, device, episodes=episodes, seed=seed, deterministic=deterministic)


def play_episodes(
    venv: VectorEnv,
    make_acting: Callable[[], Acting],
    device: torch.device,
    *,
    episodes: int,
    seed: int,
    deterministic: bool,
) -> EvalResult:
    """`run_episodes` with any `Acting` (an exported policy's, say), made by `make_acting` once the
    envs are reset and torch's generator seeded with `seed`."""
    copies, spec = venv.num_envs, venv.spec
    quota = [episodes // copies + (i < episodes % copies) for i in range(copies)]
    finished: list[list[Finished]] = [[] for _ in range(copies)]
    stepper = Stepper(venv, max_episode_steps=MAX_EPISODE_STEPS)
    with _global_rng_untouched(device):
        torch.manual_seed(seed)  # stochastic evaluations are reproducible and independent of training
        stepper.reset(seed)
        acting = make_acting()
        while any(len(done) < share for done, share in zip(finished, quota, strict=True)):
            for episode in evaluation_step(stepper, acting):
                finished[episode.copy].append(episode)
    kept = [episode for done, share in zip(finished, quota, strict=True) for episode in done[:share]]
    return episodes_result(spec.agents, kept, seed=seed, deterministic=deterministic)


def episodes_result(
    agents: Sequence[str], kept: Sequence[Finished], *, seed: int, deterministic: bool
) -> EvalResult:
    """The EvalResult of finished episodes, in the order given."""
    agent_returns = np.stack([episode.agent_returns for episode in kept])
    return EvalResult(
        agents=tuple(agents),
        team_returns=agent_returns.sum(axis=1),
        agent_returns=agent_returns,
        lengths=np.array([episode.length for episode in kept]),
        seed=seed,
        deterministic=deterministic,
        won=None if kept[0].won is None else np.array([bool(episode.won) for episode in kept]),
    )


def evaluation_step(stepper: Stepper, acting: Acting) -> list[Finished]:
    """One step of the stepping loop, its episode limit reported as an evaluation error."""
    try:
        return stepper.step(acting)
    except EpisodeLimitError as err:
        raise EvalError(str(err)) from err


def eval_config(config: ExperimentConfig, episodes: int, **env_kwargs: Any) -> ExperimentConfig:
    """The run's config for evaluation: in-process env copies (at most one per episode), extra env kwargs."""
    data = config_to_dict(config)
    data["rollout"].update(vector="sync", policy_lag=0, num_envs=min(episodes, config.rollout.copies))
    data["ppo"]["num_minibatches"] = 1  # unused here; keeps the batch-size check valid for few copies
    data["env"]["kwargs"] = {**data["env"]["kwargs"], **env_kwargs}
    return build_config(data)


class PeriodicEvaluation:
    """Deterministic evaluations during training every `eval.every` env steps, on env copies of their own."""

    def __init__(
        self,
        config: ExperimentConfig,
        venv: VectorEnv,
        model: TeamModel,
        device: torch.device,
        *,
        scores: Sequence[PolicyScore] = (),
    ) -> None:
        """`scores`: the policy's scores besides its episodes' returns, logged with them at each evaluation."""
        if not config.eval.every:
            raise ValueError(f"PeriodicEvaluation needs eval.every > 0, got {config.eval.every!r}")
        self.every = config.eval.every
        self.episodes = config.eval.episodes
        self.per_agent = config.log.per_agent
        self.seed = eval_seed(config)
        self.venv, self.model, self.device = venv, model, device
        self.scores = tuple(scores)
        self.next_step = self.every
        self.last_result: EvalResult | None = None
        """The latest evaluation's episodes."""

    def after_update(self, env_steps: int, *, final: bool) -> dict[str, float]:
        """Evaluate when `env_steps` reached the next multiple of eval.every, or at the end; tags -> values."""
        if env_steps < self.next_step and not final:
            return {}
        self.next_step = (env_steps // self.every + 1) * self.every
        start = time.perf_counter()
        result = self.last_result = run_episodes(
            self.venv, self.model, self.device, episodes=self.episodes, seed=self.seed, deterministic=True
        )
        scalars = result.scalars(per_agent=self.per_agent)
        for score in self.scores:
            scalars.update(score(self.model))
        return {**scalars, "perf/eval_s": time.perf_counter() - start}

    def close(self) -> None:
        """Close the evaluation env copies."""
        self.venv.close()
