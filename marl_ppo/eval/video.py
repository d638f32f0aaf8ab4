"""One episode rendered from the env's `rgb_array` frames, written as GIF (Pillow) or MP4 (imageio-ffmpeg).

An env that cannot render is refused with one line before any episode is played (`render_env`); one
whose rendering fails later (`_frame`) leaves the evaluation's eval.json written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import make_team_env
from marl_ppo.envs.registry import EnvError, resolve_factory
from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.eval.evaluate import MAX_EPISODE_STEPS, EvalError, eval_config, evaluation_step
from marl_ppo.eval.one_copy import OneCopy
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.stepper import PolicyActing, Stepper

VIDEO_FORMATS = ("gif", "mp4")
DEFAULT_FPS = 10
"""Frames per second when the env's metadata gives no `render_fps`."""


def check_video_format(name: str) -> None:
    """Raise EvalError unless `name` is a video format this module writes."""
    if name not in VIDEO_FORMATS:
        raise EvalError(f"--render '{name}' is not a video format; use one of {', '.join(VIDEO_FORMATS)}")


def render_env(config: ExperimentConfig) -> Any:
    """One copy of the configured env built with render_mode='rgb_array', to record an episode from.

    Refused with a one-line EvalError, before any episode is played, when the env's factory takes
    no `render_mode` (neither that parameter nor `**kwargs`), the env declares render modes
    (`metadata["render_modes"]`) without 'rgb_array', or its first frame after a reset fails.
    """
    env_id = config.env.id
    factory, _ = resolve_factory(env_id)
    if not takes_render_mode(factory):
        raise EvalError(
            f"env '{env_id}' takes no render_mode, so it cannot be rendered; add a render_mode parameter "
            "and return frames ((H, W, 3) arrays) from render() for --render, or drop --render"
        )
    probe = make_team_env(eval_config(config, 1))  # built as for training: which render modes it declares
    try:
        _check_render_modes(probe, env_id)
    finally:
        probe.close()
    try:
        env = make_team_env(eval_config(config, 1, render_mode="rgb_array"))
    except EnvError as err:  # e.g. a factory with **kwargs that passes render_mode on to an env without one
        raise EvalError(
            f"env '{env_id}' cannot be built with render_mode='rgb_array' for --render: {err}"
        ) from err
    try:
        _first_frame(env, env_id)  # an env without a display or OpenGL fails here, not after the episodes
    except BaseException:
        env.close()
        raise
    return env


def _first_frame(env: Any, env_id: str) -> np.ndarray:
    """The frame after a reset: proof that the env renders (the recording resets it again, with its seed)."""
    try:
        env.reset(seed=0)
    except Exception as err:
        raise EvalError(
            f"env '{env_id}' built with render_mode='rgb_array' failed to reset: {type(err).__name__}: "
            f"{' '.join(str(err).split())}; drop --render"
        ) from err
    return _frame(env, env_id)


def takes_render_mode(factory: Callable[..., Any]) -> bool:
    """Whether an env factory accepts `render_mode` (a parameter of that name, or `**kwargs`)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call decide
        return True
    return any(
        p.kind is p.VAR_KEYWORD or (p.name == "render_mode" and p.kind is not p.POSITIONAL_ONLY)
        for p in parameters
    )


def _check_render_modes(env: Any, env_id: str) -> None:
    modes = (getattr(env, "metadata", None) or {}).get("render_modes")
    if modes is not None and "rgb_array" not in modes:
        raise EvalError(
            f"env '{env_id}' declares render modes {list(modes)} (metadata['render_modes']), not "
            "'rgb_array', so it cannot be recorded; drop --render"
        )


def _frame(env: Any, env_id: str) -> np.ndarray:
    try:
        frame = env.render()
    except Exception as err:  # the env's own failure, e.g. an assertion on its render mode
        text = " ".join(str(err).split())
        raise EvalError(
            f"env '{env_id}' failed to render with render_mode='rgb_array': render() raised "
            f"{type(err).__name__}: {text}; {_render_fix(env_id, err, text)}"
        ) from err
    if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[-1] in (3, 4)):
        raise EvalError(
            f"env '{env_id}' returned {type(frame).__name__} from render() with render_mode='rgb_array', "
            "not an (H, W, 3) image; it cannot be recorded"
        )
    return np.ascontiguousarray(frame[..., :3], dtype=np.uint8)


def _render_fix(env_id: str, err: Exception, text: str) -> str:
    """What to do about a failed render: for MuJoCo without a display, pick its off-screen backend."""
    mujoco = "mujoco" in f"{env_id} {type(err).__module__}".lower()
    if mujoco and any(word in text for word in ("OpenGL", "GLFW", "EGL", "display", "DISPLAY")):
        return (
            "without a display, MuJoCo renders off-screen when started with MUJOCO_GL=egl (with a GPU) or "
            "MUJOCO_GL=osmesa (CPU only) before the command; or drop --render"
        )
    return "drop --render"


class _Recording(OneCopy):
    """The env being recorded: a frame after the reset and after every step (the episode's last frame is
    its last position: the copy does not reset when the episode ends)."""

    def __init__(self, env: Any, spec: TeamSpec) -> None:
        super().__init__(env, spec)
        self.frames: list[np.ndarray] = []

    def reset(self, seed: int) -> TeamArrays:
        """Reset the env with `seed`; the first frame."""
        arrays = super().reset(seed)
        self.frames = [_frame(self.env, self.spec.env_id)]
        return arrays

    def step(self, actions: Mapping[str, np.ndarray]) -> TeamArrays:
        """One step of the episode and its frame."""
        arrays = super().step(actions)
        self.frames.append(_frame(self.env, self.spec.env_id))
        return arrays


def record_episode(
    env: Any,
    spec: TeamSpec,
    model: TeamModel,
    device: torch.device,
    *,
    seed: int,
    deterministic: bool,
) -> tuple[list[np.ndarray], float]:
    """Frames of one episode (the reset frame, then one per step) of an env made by `render_env`; the
    caller closes the env."""
    recording = _Recording(env, spec)
    stepper = Stepper(recording, max_episode_steps=MAX_EPISODE_STEPS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        stepper.reset(seed)
        acting = PolicyActing(model, 1, device, deterministic=deterministic)
        while not evaluation_step(stepper, acting):
            pass
    fps = float((getattr(env, "metadata", None) or {}).get("render_fps") or DEFAULT_FPS)
    return recording.frames, fps


def write_video(frames: Sequence[np.ndarray], path: Path, *, fps: float) -> None:
    """Write `frames` to `path` as GIF or MP4 by its suffix (the MP4 writer needs the `video` extra)."""
    kind = path.suffix.lstrip(".")
    check_video_format(kind)
    if not frames:
        raise EvalError(f"no frames to write to '{path}'")
    if kind == "gif":
        _write_gif(frames, path, fps)
    else:
        _write_mp4(frames, path, fps)


def _write_gif(frames: Sequence[np.ndarray], path: Path, fps: float) -> None:
    try:
        from PIL import Image
    except ImportError:
        raise EvalError("GIF output needs Pillow; install it with pip install 'marl-ppo[video]'") from None
    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(
        path, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0, optimize=False
    )


def _write_mp4(frames: Sequence[np.ndarray], path: Path, fps: float) -> None:
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401  (imageio's ffmpeg backend)
    except ImportError:
        raise EvalError(
            "MP4 output needs imageio and imageio-ffmpeg; install them with pip install 'marl-ppo[video]' "
            "or use --render gif"
        ) from None
    with imageio.get_writer(path, fps=fps, codec="libx264", macro_block_size=2) as writer:
        for frame in frames:
            height, width = frame.shape[0] // 2 * 2, frame.shape[1] // 2 * 2  # H.264 needs even sizes
            writer.append_data(frame[:height, :width])  # type: ignore[attr-defined]  # imageio's v2 writer, untyped
