"""`marl-ppo eval`: load a run's checkpoint, rebuild its env (with overrides) and model, evaluate, render.

Writes `eval.json` (team, mean-agent and per-agent returns with 95% confidence intervals, and every
episode's values; the scores against random opponents and the policy's NashConv where the config
asks for them, and for a league run the NashConv of its pool's average policy) and, on request, one
rendered episode as GIF or MP4.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import build_config, merge, parse_overrides
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.eval.evaluate import (
    EvalError,
    EvalResult,
    eval_config,
    eval_seed,
    make_out_dir,
    run_episodes,
)
from marl_ppo.eval.exploitability import nash_conv, nash_conv_on
from marl_ppo.eval.loading import load_policy, resolve_checkpoint
from marl_ppo.eval.partners import OWN, partner_sides, play_seating
from marl_ppo.eval.players import partner_player, policy_player
from marl_ppo.eval.versus import VersusResult, play_vs_random
from marl_ppo.eval.video import check_video_format, record_episode, render_env, write_video
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import RunPlan, plan_eval
from marl_ppo.rollout.stepper import PolicyActing


@dataclass(frozen=True)
class EvalOutput:
    """What `evaluate_checkpoint` computed and where it wrote it."""

    result: EvalResult
    eval_json: Path
    video: Path | None
    versus: VersusResult | None = None
    """The scores against random opponents, where the config's `eval.vs_random` asks for them."""
    nash_conv: float | None = None
    """The policy's exploitability (NashConv, by OpenSpiel), where `eval.nash_conv` settles on."""
    pool: PoolAverage | None = None
    """The NashConv of the run's pool's average policy, for a league run where NashConv is on."""


@dataclass(frozen=True)
class PoolAverage:
    """NashConv of a league run's pool's average policy: the snapshots its opponents were drawn from
    when the checkpoint was written (the latest `league.pool_size`), each weighted alike, mixed by
    reach, as training logs `league/pool_nash_conv`. `nash_conv` is None where a snapshot's file is
    missing (`missing` names them)."""

    snapshots: list[str]
    nash_conv: float | None
    missing: list[str]

    def to_dict(self) -> dict[str, Any]:
        """As eval.json holds it."""
        return {"snapshots": self.snapshots, "nash_conv": self.nash_conv, "missing": self.missing}


PoolScore = Callable[[dict[str, Any], RunPlan, TeamSpec, Path], "PoolAverage | None"]
"""How `evaluate_checkpoint` scores a league run's pool: (checkpoint payload, plan, team, run
directory) -> its PoolAverage, or None for a run without a pool (`league.average.pool_average`; the
league's pools live above evaluation, so the caller hands it in)."""


def evaluate_checkpoint(
    target: Path | str,
    *,
    episodes: int = 10,
    deterministic: bool = False,
    overrides: Sequence[str] = (),
    render: str | None = None,
    out: Path | str | None = None,
    seed: int | None = None,
    partners: Mapping[str, str] | None = None,
    pool_score: PoolScore | None = None,
) -> EvalOutput:
    """Evaluate a run's checkpoint (with key=value overrides, e.g. `env.kwargs.*`), write eval.json and a video.

    `partners`: seat -> partner (`eval.partners`' forms): those seats played by the partners, the
    rest by the run's policy. `pool_score`: where NashConv is on, the score of a league run's pool
    (`marl-ppo eval` passes `league.average.pool_average`)."""
    if episodes < 1:
        raise EvalError(f"--episodes {episodes} must be at least 1")
    if render is not None:
        check_video_format(render)
        if partners:
            raise EvalError("--render records the policy alone; drop --render or --partner")
    checkpoint, run_dir = resolve_checkpoint(target)
    payload = load_checkpoint(checkpoint)
    plan = plan_eval(build_config(merge(payload["config"], parse_overrides(overrides))))
    config, device = plan.config, plan.device
    seed = eval_seed(config) if seed is None else seed
    if render is not None and plan.batched:
        raise EvalError(
            f"env '{config.env.id}' is a batched env (VMAS, JaxMARL), which cannot be rendered yet; drop --render"
        )
    recorded = render_env(config) if render is not None else None  # an env that cannot render stops here
    out_dir = Path(out) if out is not None else run_dir
    make_out_dir(out_dir)  # before playing: a folder that cannot be made wastes no episodes
    try:
        played = _play(
            payload, plan, episodes, seed, deterministic, dict(partners or {}), run_dir, pool_score
        )
        summary = {
            "checkpoint": str(checkpoint),
            "trained_env_steps": payload.get("env_steps"),
            "env": {"id": config.env.id, "kwargs": config.env.kwargs},
            "overrides": list(overrides),
            **played.result.to_dict(),
            "vs_random": played.versus.to_dict() if played.versus is not None else None,
            "nash_conv": played.nash_conv,
            "pool_nash_conv": played.pool.to_dict() if played.pool is not None else None,
            "partners": played.partners,
            "video": None,
        }
        eval_json = out_dir / "eval.json"
        eval_json.write_text(json.dumps(summary, indent=2) + "\n")  # kept if the recording fails
        video = None
        if recorded is not None:
            video = out_dir / f"episode.{render}"
            try:
                frames, fps = record_episode(
                    recorded, played.spec, played.model, device, seed=seed, deterministic=deterministic
                )
                write_video(frames, video, fps=fps)
            except EvalError as err:
                raise EvalError(f"{err} (the evaluation's numbers are in {eval_json})") from err
            eval_json.write_text(json.dumps({**summary, "video": video.name}, indent=2) + "\n")
    finally:
        if recorded is not None:
            recorded.close()
    return EvalOutput(played.result, eval_json, video, played.versus, played.nash_conv, played.pool)


@dataclass(frozen=True)
class _Played:
    """The evaluation episodes' results, and the policy and team layout that played them."""

    result: EvalResult
    versus: VersusResult | None
    model: TeamModel
    spec: TeamSpec
    nash_conv: float | None = None
    partners: dict[str, dict[str, Any]] | None = None
    """Seat -> its partner and agents, where partners played some seats."""
    pool: PoolAverage | None = None


def _play(
    payload: dict[str, Any],
    plan: RunPlan,
    episodes: int,
    seed: int,
    deterministic: bool,
    partners: dict[str, str],
    run_dir: Path,
    pool_score: PoolScore | None,
) -> _Played:
    """The evaluation episodes (with partners on their seats), those against random opponents and the
    NashConv (the policy's and a league pool's average's) where configured."""
    config, device = plan.config, plan.device
    scores_nash_conv = nash_conv_on(config)  # NashConv asked where it cannot be computed stops here
    venv = build_vector_env(eval_config(config, episodes), plan.layout, device)
    try:
        spec = venv.spec
        model = load_policy(payload, spec, config, device)
        seated = None
        if partners:
            sides = partner_sides(spec, list(partners))
            players = [policy_player(OWN, model, deterministic=deterministic)] + [
                partner_player(text, spec, device, agents=sides[seat], deterministic=deterministic)
                for seat, text in partners.items()
            ]
            result = play_seating(
                venv,
                device,
                players,
                sides,
                range(len(sides)),
                episodes=episodes,
                seed=seed,
                deterministic=deterministic,
            )
            seated = {seat: {"partner": text, "agents": list(sides[seat])} for seat, text in partners.items()}
        else:
            result = run_episodes(
                venv, model, device, episodes=episodes, seed=seed, deterministic=deterministic
            )
        versus = None
        if config.eval.vs_random is not None:
            policy = PolicyActing(model, venv.num_envs, device, deterministic=deterministic)
            versus = play_vs_random(
                venv,
                policy,
                device,
                mode=config.eval.vs_random,
                episodes_per_side=episodes,
                seed=seed,
                teams=config.eval.teams,
            )
    finally:
        venv.close()
    value = nash_conv(model, config.env.id, config.env.kwargs) if scores_nash_conv else None
    pool = pool_score(payload, plan, spec, run_dir) if scores_nash_conv and pool_score is not None else None
    return _Played(result, versus, model, spec, value, seated, pool)
