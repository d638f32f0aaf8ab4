"""`eval --render` on a tiny run of each catalog family writes the video or refuses in one line (exit 2)."""

import pytest

from marl_ppo.cli import main
from marl_ppo.config import yaml_value
from marl_ppo.envs.registry import env_spec
from tests.helpers import EPISODES, experiments

RENDERED = {
    # one id per family: "video" where its env draws rgb_array frames here, else "refused" (exit 2)
    "mpe2/simple_spread_v3": "video",
    "sisl/multiwalker_v9": "video",
    "butterfly/cooperative_pong_v6": "video",
    "classic/tictactoe_v3": "video",
    "lbf/foraging_8x8_2p_2f_coop_v3": "refused",  # its pyglet viewer draws only in a window ('human')
    "rware/rware_tiny_2ag_v2": "either",  # its pyglet viewer draws rgb_array frames where a display is
    "magent2/battle_v4": "video",
    "vmas/navigation": "refused",
    "mamujoco/HalfCheetah-2x3": "either",  # MuJoCo draws rgb_array frames where OpenGL (EGL, OSMesa) is
}


@pytest.mark.parametrize("env_id", sorted(RENDERED))
def test_eval_render_writes_a_video_or_refuses_in_one_line(env_id, tmp_path, capsys):
    spec = env_spec(env_id)
    if not spec.installed:
        pytest.skip(f"{env_id}: missing {', '.join(spec.missing_modules)}")
    pytest.importorskip("PIL")
    kwargs = [f"env.kwargs.{key}={yaml_value(value)}" for key, value in EPISODES[env_id][0].items()]
    run = tmp_path / "run"
    tiny = [
        "rollout.vector=sync",
        "rollout.num_envs=2",
        "rollout.rollout_steps=8",
        "total_steps=16",
        "log.progress=false",
        "eval.every=0",
    ]
    tiny += ["ppo.num_minibatches=1", "ppo.train_pi_iters=1", "ppo.train_vf_iters=1", *kwargs]
    assert main(["train", str(experiments()[env_id]), *tiny, "--run-dir", str(run)]) == 0
    capsys.readouterr()
    status = main(["eval", str(run), "--episodes", "1", "--render", "gif"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    expected = RENDERED[env_id]
    if expected == "either":
        expected = "video" if status == 0 else "refused"
    if expected == "video":
        assert status == 0, captured.err
        assert (run / "episode.gif").read_bytes()[:6] in (b"GIF87a", b"GIF89a")
    else:
        assert status == 2 and captured.err.startswith("error: ") and captured.err.count("\n") == 1
        assert (
            "render" in captured.err
            and not (run / "episode.gif").exists()
            and not (run / "eval.json").exists()
        )


def test_every_family_has_a_render_check():
    families = {env_id.split("/")[0] for env_id in EPISODES}
    assert families == {env_id.split("/")[0] for env_id in RENDERED}
