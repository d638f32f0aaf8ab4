"""`marl-ppo eval`: load a run's checkpoint, rebuild its env (with overrides) and model, evaluate, render.

Writes `eval.json` (team, mean-agent and per-agent returns with 95% confidence intervals, and every
episode's values; the scores against random opponents and the policy's NashConv where the config
asks for them) and, on request, one rendered episode as GIF or MP4.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from marl_ppo.checkpoint import CheckpointError, load_checkpoint
from marl_ppo.config import ExperimentConfig, build_config, merge, parse_overrides
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
from marl_ppo.eval.versus import VersusResult, play_vs_random
from marl_ppo.eval.video import check_video_format, record_episode, render_env, write_video
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import RunPlan, plan_eval
from marl_ppo.rollout.stepper import PolicyActing


def resolve_checkpoint(target: Path | str) -> tuple[Path, Path]:
    """(checkpoint file, directory for the results) for a run directory or a checkpoint file."""
    target = Path(target)
    if target.is_dir():
        for name in ("final.pt", "latest.pt"):
            if (target / "checkpoints" / name).is_file():
                return target / "checkpoints" / name, target
        raise CheckpointError(
            f"run directory '{target}' has no checkpoints/final.pt or checkpoints/latest.pt; "
            "pass a run directory that has trained, or a checkpoint file"
        )
    if not target.is_file():
        raise CheckpointError(f"'{target}' is neither a run directory nor a checkpoint file")
    run_dir = target.parent.parent if target.parent.name == "checkpoints" else target.parent
    return target, run_dir


def load_policy(
    payload: dict[str, Any], spec: TeamSpec, config: ExperimentConfig, device: torch.device
) -> TeamModel:
    """The checkpoint's TeamModel for `spec`; a clear error when the env or network no longer fits it."""
    if list(spec.agents) != list(payload["agents"]):
        raise EvalError(
            f"the env now has agents {list(spec.agents)} but the checkpoint was trained with "
            f"{list(payload['agents'])}; evaluate on an env with the same agents"
        )
    model = TeamModel(spec, config).to(device)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError:
        raise EvalError(
            "the checkpoint's weights do not fit the networks for this env and config (an override changed "
            "observation or action sizes, or the model); override only what keeps the spaces"
        ) from None
    model.eval()
    return model


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


def evaluate_checkpoint(
    target: Path | str,
    *,
    episodes: int = 10,
    deterministic: bool = False,
    overrides: Sequence[str] = (),
    render: str | None = None,
    out: Path | str | None = None,
    seed: int | None = None,
) -> EvalOutput:
    """Evaluate a run's checkpoint (with key=value overrides, e.g. `env.kwargs.*`), write eval.json and a video."""
    if episodes < 1:
        raise EvalError(f"--episodes {episodes} must be at least 1")
    if render is not None:
        check_video_format(render)
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
        played = _play(payload, plan, episodes, seed, deterministic)
        summary = {
            "checkpoint": str(checkpoint),
            "trained_env_steps": payload.get("env_steps"),
            "env": {"id": config.env.id, "kwargs": config.env.kwargs},
            "overrides": list(overrides),
            **played.result.to_dict(),
            "vs_random": played.versus.to_dict() if played.versus is not None else None,
            "nash_conv": played.nash_conv,
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
    return EvalOutput(played.result, eval_json, video, played.versus, played.nash_conv)


@dataclass(frozen=True)
class _Played:
    """The evaluation episodes' results, and the policy and team layout that played them."""

    result: EvalResult
    versus: VersusResult | None
    model: TeamModel
    spec: TeamSpec
    nash_conv: float | None = None


def _play(payload: dict[str, Any], plan: RunPlan, episodes: int, seed: int, deterministic: bool) -> _Played:
    """The evaluation episodes, those against random opponents and the NashConv where configured."""
    config, device = plan.config, plan.device
    scores_nash_conv = nash_conv_on(config)  # NashConv asked where it cannot be computed stops here
    venv = build_vector_env(eval_config(config, episodes), plan.layout, device)
    try:
        spec = venv.spec
        model = load_policy(payload, spec, config, device)
        result = run_episodes(venv, model, device, episodes=episodes, seed=seed, deterministic=deterministic)
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
    return _Played(result, versus, model, spec, value)
