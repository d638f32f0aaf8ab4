"""A zero-sum game's team return is 0 by its rules: `eval` shows each agent's return instead."""

import json

from marl_ppo.cli import main


def test_eval_of_a_zero_sum_game_shows_each_agents_return_and_points_to_vs_random(tmp_path, capsys):
    run_dir = tmp_path / "rps"
    args = ["env.id=classic/rps_v2", "total_steps=64", "rollout.num_envs=2", "log.progress=false"]
    assert main(["train", *args, "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    played = json.loads((run_dir / "eval.json").read_text())
    means = {agent: stats["mean"] for agent, stats in played["agents"].items()}
    assert played["team_return"]["mean"] == 0.0 and any(m != 0.0 for m in means.values())
    assert lines[1] == (
        f"zero-sum: the team return is 0 in every episode; per agent player_0 {means['player_0']:+.2f}, "
        f"player_1 {means['player_1']:+.2f}; add eval.vs_random=seats to score the policy against random players"
    )
    assert means["player_0"] == -means["player_1"]
