"""Helpers shared by the test modules (conftest.py holds the fixtures): no test module imports another."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import torch
import yaml
from marl_ppo_examples.early_leaver import EarlyLeaverEnv

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import build_vector_env, probe_layout
from marl_ppo.envs.registry import registered_specs
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.plan.copies import settle_copies

ROOT = Path(__file__).resolve().parent.parent
"""The repository root."""

T = TypeVar("T")


def vector_env(config: ExperimentConfig, device: torch.device | None = None) -> VectorEnv:
    """The config's vector env, its copies settled and its layout read from one probe copy first (as
    a plan settles and reads them)."""
    config = settle_copies(config)
    return build_vector_env(config, probe_layout(config), device)


def grad_of(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient, which a backward pass has filled."""
    assert parameter.grad is not None, "no gradient: backward did not reach this parameter"
    return parameter.grad


def within(seconds: float, call: Callable[[], T]) -> T:
    """`call()`'s result, or its exception raised here, waited for in a thread at most `seconds`: a bound
    on a hang (the test fails instead of waiting forever), never a check of speed."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds:g} s: it hangs"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# --- envs ---------------------------------------------------------------------------------------


class LateJoinerEnv(EarlyLeaverEnv):
    """agent_2 is absent at reset and joins after step 2 (its first observation arrives with step 2)."""

    def reset(self, seed=None, options=None):
        observations, infos = super().reset(seed, options)
        self.agents = ["agent_0", "agent_1"]
        return {a: observations[a] for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        observations, rewards, terminations, truncations, infos = super().step(actions)
        if self._t == 2 and "agent_2" not in self.agents:
            self.agents.append("agent_2")
            observations["agent_2"] = np.array([2, self._t], np.float32)
        return observations, rewards, terminations, truncations, infos


# --- rollouts and values ---------------------------------------------------------------------------


def collect_rollout(config, seed=0):
    """Build the config's vector env and a fresh model, and collect one full rollout."""
    from marl_ppo.models.team import TeamModel
    from marl_ppo.rollout.buffer import RolloutBuffer
    from marl_ppo.rollout.collector import Collector

    torch.manual_seed(seed)
    config = settle_copies(config)
    venv = build_vector_env(config, probe_layout(config))
    model = TeamModel(venv.spec, config)
    buffer = RolloutBuffer(venv.spec, config.rollout.rollout_steps, config.rollout.copies)
    collector = Collector(venv, model, torch.device("cpu"))
    collector.start(seed)
    return model, buffer, collector.collect(buffer)


def values_of(model, state, obs):
    """A feed-forward model's values in return units for one step of `len(state)` env copies, every
    agent acting, from the critics' own forward (learning's path): `state` `(E, S)`, `obs` per group
    `(E, A_g, D)`."""
    values = {}
    for name, group_obs in obs.items():
        critic, norm = model.group(name).critic, model.group(name).value_norm
        flags = torch.ones((1, *group_obs.shape[:-1]), dtype=torch.bool, device=group_obs.device)
        carry = torch.zeros(group_obs.shape[0], critic.carry_rows, 0, device=group_obs.device)
        raw, _ = critic(state.unsqueeze(0), group_obs.unsqueeze(0), carry, flags, flags)
        values[name] = norm.denormalize(raw[0])
    return values


def common_twin(net):
    """The same AgentMLP, weights shared, reading one input row that every agent sees (`common_input`)."""
    import copy

    twin = copy.copy(net)
    twin.common_input = True
    return twin


def rollout_log_probs(model, buffer, name):
    """Group `name`'s log-probabilities of the stored actions under `model`, `(T, E, A)`: each env copy's
    rollout replayed as one sequence from the carry stored at its first step."""
    storage, memory = buffer.groups[name], buffer.memory[name]
    dist, _ = model.group(name).actor(
        storage.obs, storage.action_mask, memory.actor_state[0], memory.is_first, storage.alive
    )
    return dist.log_prob(storage.actions)


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


# --- runs compared bit for bit -------------------------------------------------------------------


def scalars(run_dir):
    """Every non-`perf/` scalar the run logged, as TensorBoard's reader returns it: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {  # perf/ holds wall-clock timings, which differ between any two runs
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
        if not tag.startswith("perf/")
    }


def assert_identical(a, b, where="checkpoint"):
    """Nested dicts/lists of tensors and primitives are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_final_weights(run_a, run_b):
    """Two runs ended with bit-identical model weights."""
    from marl_ppo.checkpoint import load_checkpoint

    weights_a = load_checkpoint(run_a / "checkpoints/final.pt")["model"]
    weights_b = load_checkpoint(run_b / "checkpoints/final.pt")["model"]
    assert weights_a.keys() == weights_b.keys()
    for name, tensor in weights_a.items():
        assert torch.equal(tensor, weights_b[name]), name


def assert_same_runs(experiment, overrides, switches, tmp_path):
    """Train with our pieces and with `switches`; assert bitwise equal weights, Adam states and scalars."""
    from marl_ppo.checkpoint import load_checkpoint
    from marl_ppo.config import load_config
    from marl_ppo.run.loop import train

    runs = {}
    for name, extra in (("ours", []), ("library", switches)):
        train(load_config(experiment, [*overrides, *extra]), tmp_path / name)
        runs[name] = load_checkpoint(tmp_path / name / "checkpoints/final.pt")
    for key, ours in runs["ours"]["model"].items():
        assert torch.equal(ours, runs["library"]["model"][key]), key
    actor = runs["ours"]["trainer"]["actor_optimizer"]["state"]
    assert actor
    for index, state in actor.items():
        library = runs["library"]["trainer"]["actor_optimizer"]["state"][index]
        assert torch.equal(state["exp_avg_sq"], library["exp_avg_sq"])
    ours, library = scalars(tmp_path / "ours"), scalars(tmp_path / "library")
    assert ours.keys() == library.keys() and len(ours) > 15
    for tag in ours:
        assert ours[tag] == library[tag], tag


# --- resume ----------------------------------------------------------------------------------------

K = 3
"""Updates between checkpoints in the resume tests: 2K straight against K, a crash, and K more."""


class Killed(Exception):
    """Stands for the process dying (no final checkpoint)."""


def crash_at_update(monkeypatch, number):
    """Make train() die while running update `number` (1-based), after the ones before were logged."""
    import marl_ppo.run.loop as train_module

    real, calls = train_module._one_update, []

    def one_update(*args, **kwargs):
        calls.append(1)
        if len(calls) == number:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "_one_update", one_update)


def run_state_only(payload):
    # pickled env bytes are not canonical (shared references); _env_futures compares the envs instead
    skipped = ("wall_s", "timing", "envs")
    rollout = {key: value for key, value in payload["config"]["rollout"].items() if key != "vector"}
    config = {**payload["config"], "rollout": rollout}
    return {**{key: value for key, value in payload.items() if key not in skipped}, "config": config}


def _env_futures(payload, steps=30):
    """Observations and rewards of each saved env copy over `steps` more steps (auto-reset included)."""
    from marl_ppo.envs.spec import TeamArrays
    from marl_ppo.envs.vector.state import load_env_state

    futures = []
    for blob in payload["envs"]["states"]:
        adapter = load_env_state(blob.numpy().tobytes())
        out = TeamArrays.allocate(adapter.spec)
        actions = {"agent": np.ones((adapter.spec.group("agent").num_agents,), dtype=np.int64)}
        spread = out.groups["agent"]
        for _ in range(steps):
            if adapter.step(actions, out):
                adapter.reset(None, out)
            futures.append((spread.obs.copy(), spread.reward.copy()))
    return futures


def assert_same_run_state(path_a, path_b):
    """Two checkpoints hold the same run state, and their env copies continue identically."""
    from marl_ppo.checkpoint import load_checkpoint

    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    # weights, optimizer moments, normalizers, every RNG, collector and logger state, the counters
    assert_identical(run_state_only(a), run_state_only(b))
    for (obs_a, reward_a), (obs_b, reward_b) in zip(_env_futures(a), _env_futures(b), strict=True):
        assert np.array_equal(obs_a, obs_b) and np.array_equal(reward_a, reward_b)


def wait_for_checkpoint(process, run_dir, updates, timeout=60.0):
    """Wait until latest.pt holds at least `updates` updates; return it."""
    from marl_ppo.checkpoint import CheckpointError, load_checkpoint

    path = run_dir / "checkpoints/latest.pt"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if path.exists():
            try:
                saved = load_checkpoint(path)
            except CheckpointError:  # replaced between exists() and the read
                continue
            if saved["updates"] >= updates:
                return saved
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"no checkpoint with {updates} updates after {timeout} s")


# --- command-line runs -----------------------------------------------------------------------------

TINY_MATRIX: dict[str, Any] = {
    "env": {"id": "envs/matrix_game_v0"},
    "rollout": {"num_envs": 2, "rollout_steps": 4},
    "total_steps": 8,
    "ppo": {"num_minibatches": 1, "train_pi_iters": 1, "train_vf_iters": 1},
    "model": {"hidden_sizes": [8]},
}
"""An experiment of one 8-step update on the matrix game, for commands that only need a run."""


def fake_run(path, env_id, critic, seed, finals):
    """A finished run directory as training writes it: config, evaluations and the absolute metric."""
    path.mkdir(parents=True)
    (path / "tensorboard").mkdir()
    config = {
        "env": {"id": env_id},
        "seed": seed,
        "ppo": {"critic": critic},
        "total_steps": 300,
        "eval": {"every": 100},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    with (path / "evaluations.jsonl").open("w") as handle:
        for step, value in zip((100, 200, 300), finals, strict=True):
            episodes = [value - 1.0, value + 1.0]
            handle.write(
                json.dumps({"step": step, "team_return_mean": value, "team_return": episodes}) + "\n"
            )
    best = max(finals)
    absolute = {"step": 300, "per_episode": {"team_return": [best - 0.5, best + 0.5, best, best]}}
    (path / "absolute_metric.json").write_text(json.dumps(absolute))


# --- the catalog -----------------------------------------------------------------------------------

CATALOG = [spec for spec in registered_specs() if spec.family != "envs"]
CATALOG_MPE2, CATALOG_LBF, CATALOG_RWARE, CATALOG_VMAS = (
    [spec.id.split("/", 1)[1] for spec in CATALOG if spec.family == family]
    for family in ("mpe2", "lbf", "rware", "vmas")
)


def experiments() -> dict[str | None, Path]:
    """The first experiment file of each env id, by path order."""
    found: dict[str | None, Path] = {}
    for path in sorted((ROOT / "experiments").rglob("*.yaml")):
        env_id = (yaml.safe_load(path.read_text()).get("env") or {}).get("id")
        found.setdefault(env_id, path)
    return found


TERM, TRUNC = "terminated", "truncated"
_LBF = (
    {"field_size": [5, 5], "max_num_food": 1, "force_coop": False, "max_episode_steps": 50},
    {TERM, TRUNC},
)
EPISODES: dict[str, tuple[dict[str, Any], set[str]]] = {
    # id: (env kwargs that keep episodes short, how its episodes are seen to end under random actions)
    **{f"mpe2/{name}": ({"max_cycles": 5}, {TRUNC}) for name in CATALOG_MPE2},
    "sisl/multiwalker_v9": ({"max_cycles": 100}, {TERM, TRUNC}),  # falls, and the time limit
    "sisl/pursuit_v5": (
        {"x_size": 5, "y_size": 5, "n_evaders": 1, "n_pursuers": 3, "n_catch": 1, "max_cycles": 60},
        {TERM, TRUNC},
    ),
    "butterfly/pistonball_v6": ({"max_cycles": 5}, {TRUNC}),
    "butterfly/cooperative_pong_v6": ({"max_cycles": 40}, {TERM, TRUNC}),
    "butterfly/knights_archers_zombies_v11": ({"max_cycles": 150}, {TERM, TRUNC}),
    "classic/rps_v2": ({"max_cycles": 3}, {TRUNC}),
    "classic/connect_four_v3": ({}, {TERM}),
    "classic/tictactoe_v3": ({}, {TERM}),
    "classic/hanabi_v5": ({}, {TERM}),  # the third life lost (or the deck out)
    "classic/kuhn_poker": ({}, {TERM}),
    "classic/leduc_poker": ({}, {TERM}),
    **{f"lbf/{name}": _LBF for name in CATALOG_LBF},
    **{f"rware/{name}": ({"max_steps": 10}, {TRUNC}) for name in CATALOG_RWARE},
    "magent2/battle_v4": ({"max_cycles": 30}, {TRUNC}),
    **{f"vmas/{name}": ({"max_steps": 5}, {TRUNC}) for name in CATALOG_VMAS},
    "mamujoco/HalfCheetah-2x3": ({"max_episode_steps": 20}, {TRUNC}),
    "mamujoco/Ant-4x2": ({"max_episode_steps": 40}, {TERM, TRUNC}),  # falls, and the time limit
    "mamujoco/Walker2d-2x3": ({"max_episode_steps": 12}, {TERM, TRUNC}),
}
"""Each catalog id's env kwargs that keep its episodes short, and how its episodes end under random
actions."""
