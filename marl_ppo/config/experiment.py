"""The experiment: the top-level keys, the sections, the checks that span sections, the keys that
moved into a section and the config as plain data."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

from marl_ppo.config.base import STRICT, ConfigError, PositiveInt
from marl_ppo.config.env import EnvConfig
from marl_ppo.config.evaluation import EvalConfig
from marl_ppo.config.fast import REMOVED_FAST_KEYS, REMOVED_OPTIMIZERS, FastConfig
from marl_ppo.config.host import HostConfig
from marl_ppo.config.league import LeagueConfig
from marl_ppo.config.log import LogConfig
from marl_ppo.config.model import ModelConfig
from marl_ppo.config.ppo import PPOConfig
from marl_ppo.config.rollout import RayConfig, RolloutConfig


@dataclass(frozen=True, config=STRICT)
class ExpectedConfig:
    """The result an experiment file promises, checked by `marl-ppo reproduce` (ignored by `train`)."""

    steps: PositiveInt
    """Env steps each seed trains for (reproduce runs them with total_steps set to this)."""
    seeds: PositiveInt
    """Seeds 0..seeds-1 (reproduce --seeds overrides it)."""
    team_return: tuple[float, float] | None = None
    """[low, high]: the band the IQM over seeds of the final team return (the mean of each run's last
    `log.return_window` training episodes) must fall in."""
    eval: dict[str, tuple[float, float]] | None = None
    """Bands for the last periodic evaluation (`eval.every`): a tag under `eval/` to the [low, high]
    band the IQM over seeds of its last value must fall in, e.g. `{vs_random/win_rate: [0.8, 1.0]}`
    for a game, where the team return says nothing."""
    league: dict[str, tuple[float, float]] | None = None
    """Bands for the last value of a tag under `league/` a league run logs at each snapshot, e.g.
    `{pool_nash_conv: [0.2, 0.6]}`: the NashConv of the pool's average policy."""

    def __post_init__(self) -> None:
        if self.team_return is None and not self.eval and not self.league:
            raise ValueError(
                "config key 'expected' needs a band: team_return: [low, high], eval: {TAG: [low, high]} "
                "for a tag under eval/ (e.g. vs_random/win_rate), or league: {TAG: [low, high]} for one "
                "under league/ (e.g. pool_nash_conv)"
            )
        bands = {"expected.team_return": self.team_return} if self.team_return is not None else {}
        for section, example in (("eval", "vs_random/win_rate"), ("league", "pool_nash_conv")):
            for tag, band in (getattr(self, section) or {}).items():
                if not tag or tag.startswith(f"{section}/"):
                    raise ValueError(
                        f"config key 'expected.{section}' names tags under {section}/ without the prefix "
                        f"({example}, not {section}/{example}), got '{tag}'"
                    )
                bands[f"expected.{section}.{tag}"] = band
        for key, (low, high) in bands.items():
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise ValueError(
                    f"config key '{key}' must be [low, high] with finite low <= high, got {[low, high]}"
                )


MOVED_KEYS = {
    "num_envs": "rollout.num_envs",
    "rollout_steps": "rollout.rollout_steps",
    "vector": "rollout.vector",
    "num_workers": "rollout.num_workers",
    "policy_lag": "rollout.policy_lag",
    "worker_timeout_s": "rollout.worker_timeout_s",
    "eval_every": "eval.every",
    "eval_episodes": "eval.episodes",
    "eval_absolute": "eval.absolute",
    "eval_vs_random": "eval.vs_random",
    "eval_teams": "eval.teams",
    "device": "host.device",
    "torch_threads": "host.torch_threads",
    "memory_check": "host.memory_check",
    "gamma": "ppo.gamma",
    "gae_lambda": "ppo.gae_lambda",
    "critic": "ppo.critic",
    "team_reward": "ppo.team_reward",
    "share_actor": "model.share_actor",
    "share_critic": "model.share_critic",
}
"""Dotted keys that moved, old -> new: refused in what a user writes, renamed in a config a run stored
(`migrate_stored`), so that older runs still resume and evaluate."""


@dataclass(frozen=True, config=STRICT)
class ExperimentConfig:
    """One experiment, validated: the env, the run's length and seed, and a section for each stage."""

    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """Which environment to train on."""
    seed: Annotated[int, Field(ge=0)] = 0
    """Seed for Python, NumPy, torch and the environments."""
    total_steps: PositiveInt = 1_000_000
    """Environment steps to train for (one step of one env copy counts once, not once per agent)."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """The env copies, where they step, and the steps collected per update."""
    host: HostConfig = dataclasses.field(default_factory=HostConfig)
    """The learner's torch device and threads, and the memory check."""
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    """Evaluations during training, and the scores against random play."""
    expected: ExpectedConfig | None = None
    """The experiment's measured result, `{steps: N, seeds: K, team_return: [low, high]}` (or bands on
    the last evaluation, `eval: {vs_random/win_rate: [low, high]}`), checked by `marl-ppo reproduce`;
    training ignores it."""
    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
    """Returns, the critic's input and the PPO update."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """Network architecture and sharing."""
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    """Logging and checkpointing."""
    fast: FastConfig = dataclasses.field(default_factory=FastConfig)
    """Switches between our hand-written pieces and the library's."""
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    """Rollout workers on a Ray cluster (`rollout.vector: ray`)."""
    league: LeagueConfig = dataclasses.field(default_factory=LeagueConfig)
    """Opponent pools for competitive games: frozen snapshots, the rule that draws them, ratings."""

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        keys = data.kwargs if isinstance(data, ArgsKwargs) else data
        if isinstance(keys, dict):
            refuse_moved(keys)
        return data

    def __post_init__(self) -> None:
        ppo, model = self.ppo, self.model
        if ppo.critic == "team" and not model.share_critic:
            raise ValueError(
                "ppo.critic: team is one network per group (one value per env step, for every agent), so "
                "model.share_critic=false (one critic per agent) cannot apply; drop it, or use ppo.critic: state"
            )
        if ppo.actor_update == "sequential" and model.share_actor:
            raise ValueError(
                "ppo.actor_update=sequential (HAPPO) updates each agent's own actor in turn, and a shared "
                "actor has one set of weights for a group's agents; set model.share_actor=false"
            )
        if model.shared_cnn and ppo.actor_update == "sequential":
            raise ValueError(
                "model.shared_cnn=true trains one CNN from the critic's loss and every actor's, which "
                "ppo.actor_update=sequential (HAPPO) cannot give to one agent's turn; set model.shared_cnn=false"
            )
        if model.shared_cnn and (ppo.critic != "obs" or model.share_critic != model.share_actor):
            raise ValueError(
                "model.shared_cnn=true gives the critic the actor's CNN of the observations, so it needs "
                "ppo.critic: obs and model.share_critic equal to model.share_actor; set those, or "
                "model.shared_cnn=false"
            )
        self._check_batch()
        self._check_league()
        rollout = self.rollout
        if rollout.vector == "ray" and self.ray.min_workers > rollout.num_workers:
            raise ValueError(
                f"ray.min_workers={self.ray.min_workers} exceeds rollout.num_workers={rollout.num_workers}; "
                "lower ray.min_workers or raise rollout.num_workers"
            )

    def _check_league(self) -> None:
        """Refuse league settings that cannot apply (those that need the env's agents: `plan_run`)."""
        league = self.league
        if league.opponents is None:
            return
        if self.ppo.critic == "team":
            raise ValueError(
                "league.opponents trains one side against others, and ppo.critic: team values the sum of "
                "every side's rewards (0 in a zero-sum game); use ppo.critic: obs or state"
            )

    def _check_batch(self) -> None:
        """Refuse more minibatches than the rollout has sequence chunks or env steps."""
        chunks = self.sequence_chunks
        if chunks is not None and self.ppo.num_minibatches > chunks:
            raise ValueError(
                f"ppo.num_minibatches={self.ppo.num_minibatches} exceeds the {chunks} sequence chunks of a "
                f"rollout (rollout.num_envs={self.rollout.num_envs} x ceil(rollout.rollout_steps / "
                "ppo.chunk_length)); lower ppo.num_minibatches or ppo.chunk_length, or raise rollout.num_envs"
            )
        batch = self.batch_steps
        if batch is not None and self.ppo.num_minibatches > batch:
            raise ValueError(
                f"ppo.num_minibatches={self.ppo.num_minibatches} exceeds the batch of "
                f"rollout.rollout_steps*rollout.num_envs={self.batch_steps} env steps; lower ppo.num_minibatches"
            )

    @property
    def sequence_chunks(self) -> int | None:
        """Sequence chunks per rollout with a recurrent model (None for feed-forward networks, or while
        `rollout.num_envs` is unsettled)."""
        if self.model.recurrent is None or self.rollout.num_envs is None:
            return None
        length = self.ppo.chunk_length or self.rollout.rollout_steps
        return self.rollout.num_envs * -(-self.rollout.rollout_steps // length)

    @property
    def batch_steps(self) -> int | None:
        """Env steps per update, over all env copies (None while `rollout.num_envs` is unsettled)."""
        if self.rollout.num_envs is None:
            return None
        return self.rollout.rollout_steps * self.rollout.num_envs


def _holds(tree: dict[str, Any], dotted: str) -> bool:
    """Whether the nested dict `tree` sets the dotted key."""
    *sections, name = dotted.split(".")
    node: Any = tree
    for section in sections:
        node = node.get(section) if isinstance(node, dict) else None
    return isinstance(node, dict) and name in node


def refuse_moved(data: Mapping[str, Any]) -> None:
    """Raise a one-line ConfigError naming the new place of the first moved key (MOVED_KEYS) `data` sets."""
    for old, new in MOVED_KEYS.items():
        if _holds(dict(data), old):
            raise ConfigError(
                f"config key '{old}' moved to '{new}'; write it there in the experiment file or the overrides"
            )


def migrate_stored(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config a run stored (its config.yaml, a checkpoint's), its moved keys (MOVED_KEYS) at their new
    place and the switches of removed `fast` pieces (REMOVED_FAST_KEYS, REMOVED_OPTIMIZERS) dropped or
    renamed, the library piece with the same numbers taking their place; `rollout.compiled` false where
    it is missing (such a run stepped per step); nothing else changes, and a key already at the new place wins."""
    migrated = copy.deepcopy(dict(data))
    fast = migrated.get("fast")
    if isinstance(fast, Mapping):
        fast = {key: value for key, value in fast.items() if key not in REMOVED_FAST_KEYS}
        optimizer = fast.get("optimizer")
        if isinstance(optimizer, str) and optimizer in REMOVED_OPTIMIZERS:
            fast["optimizer"] = REMOVED_OPTIMIZERS[optimizer]
        migrated["fast"] = fast
    for old, new in MOVED_KEYS.items():
        if not _holds(migrated, old):
            continue
        *old_sections, old_name = old.split(".")
        parent = migrated
        for section in old_sections:
            parent = parent[section]
        value = parent.pop(old_name)
        *new_sections, new_name = new.split(".")
        target = migrated
        for section in new_sections:
            child = target.get(section)
            target[section] = child = dict(child) if isinstance(child, Mapping) else {}
            target = child
        target.setdefault(new_name, value)
    rollout = migrated.get("rollout")
    rollout = dict(rollout) if isinstance(rollout, Mapping) else {}
    rollout.setdefault("compiled", False)  # a run stored before the compiled rollout stepped per step
    migrated["rollout"] = rollout
    return migrated


def config_to_dict(config: ExperimentConfig) -> dict[str, Any]:
    """Plain nested dict of primitives (lists, not tuples), ready for YAML or a checkpoint."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
