"""Compiled rollouts in training (`rollout.compiled`, `rollout.compiled.CompiledSource`): for the actions
a compiled rollout drew, the per-step collector fills the same buffer from the same env copies and
weights (equal bit for bit where no network computes, within 1e-5 of scale where JAX's forward
stands in for torch's: a GRU's carries too) and accounts the same episodes, across two rollouts; a
compiled run, feed-forward or GRU, repeats from its seed and resumes exactly; the plan settles the
switch once, with the reason for the start line."""

import numpy as np
import pytest
import torch

import marl_ppo.rollout.memory as memory_module
from marl_ppo.checkpoint import load_checkpoint, save_checkpoint
from marl_ppo.config import ConfigError, load_config
from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.copies import settle_copies
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.compiled import CompiledSource
from marl_ppo.run.build import build_collector
from marl_ppo.run.loop import train
from marl_ppo.run.resume import resume_config
from tests.helpers import K, Killed, assert_identical, crash_at_update, run_state_only, scalars, vector_env

pytestmark = pytest.mark.jax  # JAX is imported inside the tests, so that collecting them loads nothing

COPIES = 4
STEPS = 12
SEED = 11
CPU = torch.device("cpu")
ENVS = {
    "mpe_simple_spread_v3": "env.kwargs={max_steps: 5}",
    "smax_3m": "env.kwargs={max_steps: 5}",
}
"""Episodes of at most 5 steps: a 12-step rollout crosses resets and truncations, and episodes run on
from one rollout into the next."""
NETWORKS = {"mlp": (), "gru": ("model.recurrent=gru", "model.recurrent_size=8")}
"""Feed-forward networks (empty carries), and GRU ones (actor and critic) carrying 8 numbers a row."""
TOLERANCE = 1e-5
"""JAX's float32 forward against torch's: equal to 1e-5 of the values' scale (XLA's tanh and LayerNorm
round a few units in the last place away from torch's)."""


def _config(env, *extra):
    return settle_copies(
        load_config(
            None,
            [
                f"env.id=jaxmarl/{env}",
                f"rollout.num_envs={COPIES}",
                f"rollout.rollout_steps={STEPS}",
                "model.hidden_sizes=[16,16]",
                ENVS[env],
                *extra,
            ],
        )
    )


def _jax_env(config):
    venv = vector_env(config)
    assert isinstance(venv, JaxVectorEnv)
    return venv


def _model(spec, config):
    """Weights away from their initialisation (logits far from uniform) and a value normaliser away from
    the identity, so that each step's numbers differ from the next."""
    torch.manual_seed(2)
    model = TeamModel(spec, config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
        for name in model.group_names():
            norm = model.group(name).value_norm
            norm.mean.fill_(-2.5)
            norm.var.fill_(6.0)
    return model


def _replaying(monkeypatch, buffer):
    """Make the collector's samples the buffer's actions, step by step and group by group."""
    queue = [buffer.groups[name].actions[t] for t in range(buffer.steps) for name in buffer.groups]
    monkeypatch.setattr(memory_module.FirstStep, "sample", lambda self: queue.pop(0).clone())
    return queue


EXACT = ("obs", "actions", "rewards", "terminated", "truncated", "alive", "action_mask")
COMPUTED = ("logp", "values", "final_values")


@pytest.mark.parametrize("network", sorted(NETWORKS))
@pytest.mark.parametrize("env", sorted(ENVS))
def test_the_collector_fills_the_same_buffer_for_a_compiled_rollouts_actions(env, network, monkeypatch):
    config = _config(env, *NETWORKS[network])
    compiled_env, per_step_env = _jax_env(config), _jax_env(config)
    model = _model(compiled_env.spec, config)
    source = CompiledSource(compiled_env, model, CPU, steps=STEPS, seed=SEED)
    collector = Collector(per_step_env, model, CPU)
    source.start(SEED)
    collector.start(SEED)
    episodes, truncated = [], False
    for _ in range(2):  # the second rollout starts where the first left the episodes and flags
        compiled = RolloutBuffer(compiled_env.spec, STEPS, COPIES, memory=model.memory_layout())
        per_step = RolloutBuffer(compiled_env.spec, STEPS, COPIES, memory=model.memory_layout())
        got = source.collect(compiled)
        queue = _replaying(monkeypatch, compiled)
        want = collector.collect(per_step)
        assert not queue and compiled.full and per_step.full
        assert torch.equal(compiled.state, per_step.state)
        assert torch.equal(compiled.episode_over, per_step.episode_over)
        for name, storage in per_step.groups.items():
            for field in EXACT:
                assert torch.equal(getattr(compiled.groups[name], field), getattr(storage, field)), field
            for field in COMPUTED:
                torch.testing.assert_close(
                    getattr(compiled.groups[name], field),
                    getattr(storage, field),
                    rtol=TOLERANCE,
                    atol=TOLERANCE,
                    msg=field,
                )
            assert torch.equal(compiled.memory[name].is_first, per_step.memory[name].is_first)
            for field in ("actor_state", "critic_state"):  # JAX's carries against torch's
                torch.testing.assert_close(
                    getattr(compiled.memory[name], field),
                    getattr(per_step.memory[name], field),
                    rtol=TOLERANCE,
                    atol=TOLERANCE,
                    msg=field,
                )
                carried = getattr(per_step.memory[name], field)
                assert carried.shape[-1] == (8 if network == "gru" else 0)
                assert network == "mlp" or carried[1:].abs().max() > 0.1
            torch.testing.assert_close(
                got.last_values[name], want.last_values[name], rtol=TOLERANCE, atol=TOLERANCE
            )
            assert torch.equal(got.last_alive[name], want.last_alive[name])
            truncated |= bool(storage.truncated.any())
        assert [_numbers(e) for e in got.episodes] == [_numbers(e) for e in want.episodes]
        for a, b in zip(got.episodes, want.episodes, strict=True):
            assert a.agent_returns.dtype == np.float64 and np.array_equal(a.agent_returns, b.agent_returns)
        assert got.env_steps == want.env_steps == STEPS * COPIES
        assert source.env_steps == collector.env_steps
        episodes += got.episodes
    # running returns and lengths, the arrays, flags and carries the next step reads
    saved, expected = source.state_dict(), collector.state_dict()
    for name, memory in expected["memory"].items():
        for field in ("actor", "critic"):
            torch.testing.assert_close(
                saved["memory"][name].pop(field), memory.pop(field), rtol=0, atol=TOLERANCE
            )
    assert_identical(saved, expected)
    assert len(episodes) >= COPIES and truncated
    assert all((e.won is None) == env.startswith("mpe") for e in episodes)


def _numbers(episode):
    """An episode's record but its per-agent returns (an array, compared apart)."""
    return episode.team_return, episode.length, episode.end_step, episode.won


def _filled(source, model):
    buffer = RolloutBuffer(source.venv.spec, STEPS, COPIES, memory=model.memory_layout())
    result = source.collect(buffer)
    return buffer, result


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_a_launched_rollout_is_taken_up_only_where_it_is_the_rollout_collect_would_run(network, monkeypatch):
    """`launch` on the value a parameter is about to take: once the parameter holds it, `collect` takes
    the launched rollout up, filling the buffer bit for bit as a rollout run there; where the parameter
    took another value, or the source was loaded since, `collect` runs its own."""
    import jax.numpy as jnp

    config = _config("mpe_simple_spread_v3", *NETWORKS[network])

    def second_rollout(write, launch=None, load=False):
        """The buffer and result of a source's second rollout, after `write` changed the weights
        between the two; `launch(model)`, where given, names the parameters' launched values first."""
        venv = _jax_env(config)
        model = _model(venv.spec, config)
        source = CompiledSource(venv, model, CPU, steps=STEPS, seed=SEED)
        source.start(SEED)
        _filled(source, model)
        saved = source.state_dict()
        if launch is not None:
            source.launch(launch(model))
        with torch.no_grad():
            write(model)
        if load:
            source.load_state_dict(saved, episodes=False)  # its counter alone: the copies stay
        runs = []
        run = source.rollout.run

        def counted(*args):
            runs.append(1)
            return run(*args)

        monkeypatch.setattr(source.rollout, "run", counted)
        buffer, result = _filled(source, model)
        monkeypatch.undo()
        return buffer, result, len(runs)

    def first_weight(model):
        return next(model.parameters())

    def moved(by):
        return lambda model: first_weight(model).add_(by)

    def launched(by):
        return lambda model: {
            id(first_weight(model)): jnp.asarray((first_weight(model).detach() + by).numpy())
        }

    def same(a, b):
        (a_buffer, a_result), (b_buffer, b_result) = a, b
        assert torch.equal(a_buffer.state, b_buffer.state)
        for name, storage in a_buffer.groups.items():
            for field in (*EXACT, *COMPUTED):
                assert torch.equal(getattr(storage, field), getattr(b_buffer.groups[name], field)), field
            for field in ("is_first", "actor_state", "critic_state"):
                assert torch.equal(
                    getattr(a_buffer.memory[name], field), getattr(b_buffer.memory[name], field)
                )
            assert torch.equal(a_result.last_values[name], b_result.last_values[name])
        assert [_numbers(e) for e in a_result.episodes] == [_numbers(e) for e in b_result.episodes]

    *reference, runs = second_rollout(moved(0.05))
    assert runs == 1
    *taken, runs = second_rollout(moved(0.05), launched(0.05))
    assert runs == 0
    same(taken, reference)
    *other, runs = second_rollout(moved(0.07), launched(0.05))  # the weights moved on past the launch
    assert runs == 1
    same(other, second_rollout(moved(0.07))[:2])
    *loaded, runs = second_rollout(moved(0.05), launched(0.05), load=True)  # the source was loaded
    assert runs == 1
    same(loaded, reference)


def test_the_rollout_key_comes_from_the_seed_and_the_rollouts_number():
    config = _config("mpe_simple_spread_v3")
    venv = _jax_env(config)
    model = _model(venv.spec, config)
    source = CompiledSource(venv, model, CPU, steps=STEPS, seed=SEED)
    first = np.asarray(source.rollout_key())
    source.env_steps = STEPS * COPIES
    second = np.asarray(source.rollout_key())
    other = CompiledSource(venv, model, CPU, steps=STEPS, seed=SEED + 1)
    assert first.dtype == np.uint32 and first.shape == (2,)
    assert not np.array_equal(first, second) and not np.array_equal(first, np.asarray(other.rollout_key()))
    source.env_steps = 0
    assert np.array_equal(np.asarray(source.rollout_key()), first)


def test_the_plan_settles_the_switch_with_the_reason_for_its_start_line():
    def settled(*extra, env="mpe_simple_spread_v3"):
        return plan_run(_config(env, *extra))

    plan = settled()
    assert plan.config.rollout.compiled is True
    assert plan.describe().endswith("; rollout: compiled (lax.scan over 12 steps)")
    source, _ = build_collector(plan)
    assert isinstance(source, CompiledSource)
    off = settled("rollout.compiled=false")
    assert off.config.rollout.compiled is False and off.describe().endswith(
        "; rollout: per-step (rollout.compiled=false)"
    )
    assert isinstance(build_collector(off)[0], Collector)
    gru = settled("model.recurrent=gru")
    assert gru.config.rollout.compiled is True
    assert gru.describe().endswith("; rollout: compiled (lax.scan over 12 steps)")
    assert isinstance(build_collector(gru)[0], CompiledSource)
    lstm = settled("model.recurrent=lstm")
    assert lstm.config.rollout.compiled is False
    assert lstm.describe().endswith(
        "; rollout: per-step (group 'agent' has an LSTM network; the compiled rollout covers GRU and "
        "feed-forward ones)"
    )
    with pytest.raises(ConfigError) as refused:
        settled("model.recurrent=lstm", "rollout.compiled=true")
    assert str(refused.value) == (
        "rollout.compiled=true: group 'agent' has an LSTM network; the compiled rollout covers GRU and "
        "feed-forward ones; set rollout.compiled: auto or false"
    )
    league = plan_run(_config("smax_3m", "league.opponents=uniform"))
    assert league.config.rollout.compiled is False and league.describe().endswith(
        "; rollout: per-step (league.opponents=uniform acts snapshots beside the learner at every step)"
    )
    other = plan_run(load_config(None, ["env.id=mpe2/simple_spread_v3", "rollout.vector=sync"]))
    assert other.config.rollout.compiled is False and "rollout:" not in other.describe()
    with pytest.raises(
        ConfigError, match="rollout.compiled=true: env 'mpe2/simple_spread_v3' is not a JaxMARL env"
    ):
        plan_run(load_config(None, ["env.id=mpe2/simple_spread_v3", "rollout.compiled=true"]))


RUN_STEPS = STEPS * COPIES  # env steps per update


def _run_config(*extra):
    return _config(
        "mpe_simple_spread_v3",
        f"total_steps={2 * K * RUN_STEPS}",
        f"log.checkpoint_every={K}",
        "ppo.train_pi_iters=2",
        "ppo.train_vf_iters=2",
        "ppo.num_minibatches=2",
        "log.progress=false",
        *extra,
    )


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_a_compiled_run_repeats_from_its_seed_and_resumes_exactly(network, tmp_path, monkeypatch):
    config = _run_config(*NETWORKS[network])
    straight = train(config, tmp_path / "straight")
    again = train(config, tmp_path / "again")
    recorded = load_checkpoint(tmp_path / "straight/checkpoints/final.pt")
    assert recorded["config"]["rollout"]["compiled"] is True
    assert_identical(
        run_state_only(recorded), run_state_only(load_checkpoint(tmp_path / "again/checkpoints/final.pt"))
    )
    assert straight.episodes == again.episodes > COPIES

    crash_at_update(monkeypatch, K + 2)  # update K+1 was logged after the checkpoint at K: must be purged
    with pytest.raises(Killed):
        train(config, tmp_path / "resumed")
    monkeypatch.undo()
    saved = load_checkpoint(tmp_path / "resumed/checkpoints/latest.pt")
    assert saved["updates"] == K
    for carry in ("actor", "critic"):  # the carries the next rollout starts from are saved with it
        carried = saved["collector"]["memory"]["agent"][carry]
        assert carried.shape[-1] == (8 if network == "gru" else 0)
        assert network == "mlp" or carried.abs().max() > 0.1
    resumed = train(config, tmp_path / "resumed", resume=True)
    assert (resumed.updates, resumed.env_steps, resumed.episodes) == (
        2 * K,
        2 * K * RUN_STEPS,
        straight.episodes,
    )
    assert_identical(
        run_state_only(recorded), run_state_only(load_checkpoint(tmp_path / "resumed/checkpoints/final.pt"))
    )
    assert scalars(tmp_path / "resumed") == scalars(tmp_path / "straight")


def test_a_jax_run_stored_before_the_switch_resumes_per_step(tmp_path, monkeypatch):
    crash_at_update(monkeypatch, K + 1)
    with pytest.raises(Killed):
        train(_run_config("rollout.compiled=false"), tmp_path / "old")
    monkeypatch.undo()
    for path in (tmp_path / "old/checkpoints").glob("*.pt"):  # as a run written before the key stored it
        payload = torch.load(path, weights_only=True)
        payload["config"]["rollout"].pop("compiled")
        save_checkpoint(path, payload)
    config = resume_config(tmp_path / "old")
    assert config.rollout.compiled is False  # it stepped per step, and goes on so
    resumed = train(config, tmp_path / "old", resume=True)
    assert resumed.updates == 2 * K
    assert load_checkpoint(tmp_path / "old/checkpoints/final.pt")["config"]["rollout"]["compiled"] is False
