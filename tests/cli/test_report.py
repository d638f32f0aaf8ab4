"""Reports from TensorBoard logs of known values: IQM, confidence intervals, seed counts, tables, figures."""

import json

import numpy as np
import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

import marl_ppo
from marl_ppo.analysis.curves import binned_curve
from marl_ppo.analysis.report import iqm_estimates, write_report
from marl_ppo.analysis.runlogs import find_run_dirs, group_configurations, read_run
from marl_ppo.cli import main
from marl_ppo.config import config_to_dict, load_config

pytest.importorskip("rliable")
pytest.importorskip("matplotlib")

# per configuration, per seed: (final training return, eval returns at env steps 100, 200, 300)
LOGS = {
    "0.001": [(-30.0, [-60.0, -20.0, -25.0]), (-31.0, [-50.0, -21.0, -26.0]), (-35.0, [-40.0, -22.0, -30.0])],
    "0.002": [(-10.0, [-50.0, -9.0, -10.0]), (-10.0, [-50.0, -9.0, -10.0]), (-10.0, [-50.0, -9.0, -10.0])],
}


def write_run(run_dir, overrides, final_return, eval_returns):
    """A run directory as training writes it: config.yaml and TensorBoard scalars of known values."""
    run_dir.mkdir(parents=True)
    config = config_to_dict(load_config(None, overrides))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    writer = SummaryWriter(str(run_dir / "tensorboard"))
    for episode in range(150):  # 150 episodes of 2 steps: the last 100 (return_window) at the final return
        writer.add_scalar("rollout/team_return", final_return if episode >= 50 else -80.0, 2 * (episode + 1))
    for step, value in zip((100, 200, 300), eval_returns, strict=True):
        writer.add_scalar("eval/team_return", value, step)
    writer.close()


@pytest.fixture
def runs(tmp_path):
    for lr, seeds in LOGS.items():
        for seed, (final, evals) in enumerate(seeds):
            # log.progress and vector say how a run ran, not what it trained: they do not split configurations
            extra = ["log.progress=false", "rollout.vector=subprocess"] if seed == 1 else []
            write_run(
                tmp_path / "runs" / f"lr{lr}" / f"seed{seed}",
                [f"ppo.pi_lr={lr}", f"seed={seed}", *extra],
                final,
                evals,
            )
    write_run(tmp_path / "runs" / "other" / "seed0", ["env.id=envs/matrix_game_v0"], 5.0, [1.0, 2.0, 3.0])
    return tmp_path / "runs"


def test_report_gives_iqm_ci_and_seeds_per_configuration(runs, tmp_path):
    files = write_report([runs], tmp_path / "report", reps=500)
    by_label = {row.configuration.label: row for row in files.rows}
    assert set(by_label) == {"ppo.pi_lr=0.001", "ppo.pi_lr=0.002", "other"}
    first, second = by_label["ppo.pi_lr=0.001"], by_label["ppo.pi_lr=0.002"]
    assert len(first.configuration.runs) == 3 and first.env_steps == 300
    final, last_eval, best = (first.estimates[m] for m in ("final_return", "final_eval", "max_eval"))
    assert final is not None and last_eval is not None and best is not None
    assert final.seeds == 3 and final.iqm == pytest.approx(-32.0)  # 3 seeds: nothing trimmed, the mean
    assert last_eval.iqm == pytest.approx(-27.0) and best.iqm == pytest.approx(-21.0)
    assert -35.0 <= final.low < final.iqm < final.high <= -30.0  # bootstrap bounds within the seeds' range
    for metric, value in (("final_return", -10.0), ("final_eval", -10.0), ("max_eval", -9.0)):
        estimate = second.estimates[metric]
        assert estimate is not None
        assert (estimate.iqm, estimate.low, estimate.high) == pytest.approx((value, value, value))

    markdown = files.markdown.read_text()
    assert (
        "| ppo.pi_lr=0.002 | 3 | 300 | -10.00 [-10.00, -10.00] | -10.00 [-10.00, -10.00] | -9.00 [-9.00, -9.00] |"
        in markdown
    )
    assert "| other | 1 | 300 | 5.00 (one seed) | 3.00 (one seed) | 3.00 (one seed) |" in markdown
    assert "## mpe2/simple_spread_v3" in markdown and "## envs/matrix_game_v0" in markdown
    assert sorted(p.name for p in files.figures) == [
        "curves_envs_matrix_game_v0.png",
        "curves_mpe2_simple_spread_v3.png",
    ]
    for figure in files.figures:
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000
        assert f"]({figure.name})" in markdown


def test_iqm_trims_a_quarter_of_the_seeds_from_each_end():
    estimates = iqm_estimates({"a": [0.0, 1.0, 2.0, 100.0], "b": [3.0] * 5}, reps=200, seed=0)
    assert estimates["a"].iqm == pytest.approx(1.5) and estimates["a"].seeds == 4  # mean of 1 and 2
    assert (estimates["b"].iqm, estimates["b"].low, estimates["b"].high) == (3.0, 3.0, 3.0)


def test_training_returns_are_averaged_per_span_of_env_steps():
    steps = np.array([1, 2, 3, 4, 9, 10])
    values = np.array([1.0, 1.0, 3.0, 3.0, 7.0, 7.0])
    edges = np.array([0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
    # spans (0,2], (2,4], (8,10]; the empty spans (4,6] and (6,8] are interpolated between 3 and 7
    np.testing.assert_allclose(binned_curve(steps, values, edges), [1.0, 3.0, 13 / 3, 17 / 3, 7.0])


def test_runs_are_found_below_a_directory_and_read_completely(runs):
    run_dirs = find_run_dirs([runs])
    assert len(run_dirs) == 7
    run = read_run(runs / "lr0.001" / "seed2")
    steps, values = run.series["rollout/team_return"]
    assert len(steps) == 150 and steps[-1] == 300 and values[-1] == -35.0
    labels = [c.label for c in group_configurations([read_run(d) for d in run_dirs])]
    assert sorted(labels) == ["other", "ppo.pi_lr=0.001", "ppo.pi_lr=0.002"]


def test_report_cli_writes_table_and_figures(runs, tmp_path, capsys):
    assert (
        main(
            [
                "report",
                str(runs / "lr0.001"),
                str(runs / "lr0.002"),
                "--out",
                str(tmp_path / "out"),
                "--reps",
                "200",
            ]
        )
        == 0
    )
    assert "6 run(s) in 2 configuration(s)" in capsys.readouterr().out
    assert (tmp_path / "out" / "report.md").is_file()
    assert (tmp_path / "out" / "curves_mpe2_simple_spread_v3.png").is_file()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root / "missing", "does not exist; pass run directories"),
        (lambda root: root, "no run directory (config.yaml with tensorboard/ or csv/) in or under"),
    ],
)
def test_bad_report_input_is_one_line_and_exit_status_2(tmp_path, capsys, make, message):
    assert main(["report", str(make(tmp_path)), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_configs_written_by_an_older_version_get_todays_defaults():
    """A run whose config.yaml predates a key groups with runs that wrote the key's default; one that
    predates the sections has its keys moved to their place."""
    from marl_ppo.analysis.runlogs import with_defaults

    filled = with_defaults({"seed": 3, "env": {"id": "mpe2/simple_spread_v3"}})
    assert filled["seed"] == 3 and filled["eval"]["every"] is None and filled["eval"]["episodes"] == 10
    assert with_defaults({"seed": 3, "gamma": 0.9, "eval_every": 5}) == with_defaults(
        {"seed": 3, "ppo": {"gamma": 0.9}, "eval": {"every": 5}}
    )
    foreign = {"seed": 3, "no_such_key": 1, "num_envs": 4}
    # a config stored before rollout.compiled ran per step: the migration says so
    assert with_defaults(foreign) == {
        "seed": 3,
        "no_such_key": 1,
        "rollout": {"num_envs": 4, "compiled": False},
    }


def test_a_report_over_duplicated_runs_counts_each_seed_once(tmp_path, capsys):
    """A seed sweep and a grid sweep of the default value into one directory: each seed counted once."""
    root = tmp_path / "runs" / "simple_spread"
    for seed, final in enumerate((-30.0, -40.0)):
        write_run(root / f"seed{seed}", [f"seed={seed}"], final, [-50.0, -40.0, final])
        # the grid sweep's run of the default pi_lr: the same configuration and seed, the same returns
        write_run(root / "ppo.pi_lr=0.0007" / f"seed{seed}", [f"seed={seed}"], final, [-50.0, -40.0, final])
    out = tmp_path / "report"
    assert main(["report", str(root), "--out", str(out), "--reps", "200"]) == 0
    captured = capsys.readouterr()
    assert "2 run(s) in 1 configuration(s)" in captured.out
    assert (
        "warning: 2 run(s) repeat the configuration and seed of another and are not counted" in captured.err
    )
    markdown = (out / "report.md").read_text()
    assert "| ppo.pi_lr=0.0007 | 2 | 300 | -35.00 [-40.00, -30.00] |" in markdown  # the first found is kept
    assert f"{root / 'seed0'} (seed 0), {root / 'seed1'} (seed 1)" in markdown.split("Not counted")[1]
    rows = write_report([root], tmp_path / "again", reps=200).rows
    estimate = rows[0].estimates["final_return"]
    assert estimate is not None
    assert len(rows) == 1 and estimate.seeds == 2 and estimate.iqm == pytest.approx(-35.0)
    assert len(rows[0].configuration.duplicates) == 2


def test_runs_that_differ_only_in_their_expected_block_are_one_configuration(tmp_path, capsys):
    """Seed 0 ran before the experiment file had its `expected:` band, seed 1 after: one configuration
    of 2 seeds, since the band says what a run should reach, not what it trained."""
    root = tmp_path / "runs" / "tiny"
    write_run(root / "seed0", ["seed=0"], -30.0, [-50.0, -40.0, -30.0])
    band = ["expected.steps=300", "expected.seeds=2", "expected.team_return=[-45,-25]"]
    write_run(root / "seed1", ["seed=1", *band], -40.0, [-50.0, -40.0, -40.0])
    assert "expected" in yaml.safe_load((root / "seed1" / "config.yaml").read_text())
    rows = write_report([root], tmp_path / "report", reps=200).rows
    assert len(rows) == 1
    final = rows[0].estimates["final_return"]
    assert final is not None
    assert final.seeds == 2 and final.iqm == pytest.approx(-35.0)
    assert rows[0].configuration.label == "tiny" and not rows[0].configuration.duplicates
    assert main(["report", str(root), "--out", str(tmp_path / "again"), "--reps", "200"]) == 0
    assert "2 run(s) in 1 configuration(s)" in capsys.readouterr().out


def test_env_steps_are_the_steps_a_finished_run_trained_not_its_last_episode_end(tmp_path):
    """Its last episode ended at step 300 but the run trained 320 steps (summary.json): the row says 320.
    A run with no summary.json (still running, or killed) is counted to its last logged return."""
    root = tmp_path / "runs" / "long_episodes"
    write_run(root / "seed0", ["seed=0"], -30.0, [-50.0, -40.0, -30.0])
    (root / "seed0" / "summary.json").write_text(json.dumps({"env_steps": 320, "team_return_mean": -30.0}))
    write_run(root / "seed1", ["seed=1"], -40.0, [-50.0, -40.0, -40.0])
    rows = write_report([root / "seed0"], tmp_path / "finished", reps=200).rows
    assert [row.env_steps for row in rows] == [320]
    rows = write_report([root], tmp_path / "both", reps=200).rows
    assert [row.env_steps for row in rows] == [300]  # the least of the seeds: seed 1 has no summary
    assert "| long_episodes | 2 | 300 |" in (tmp_path / "both" / "report.md").read_text()


def test_runs_of_other_code_are_another_configuration_unless_merged(tmp_path, capsys):
    """Before/after runs of one config by two versions of marl_ppo: two rows, labelled by the code,
    and one row of 4 seeds with --merge-code."""
    root = tmp_path / "runs"
    for code, finals in (("before", (-40.0, -42.0)), ("after", (-30.0, -32.0))):
        for seed, final in enumerate(finals):
            run_dir = root / code / f"seed{seed}"
            write_run(run_dir, [f"seed={seed}"], final, [-50.0, -40.0, final])
            tree = ("a" if code == "before" else "b") * 40
            record = {"version": "0.1.0", "commit": "c" * 40, "tree": tree, "dirty": False}
            (run_dir / "code.json").write_text(json.dumps(record))
    write_run(root / "old" / "seed0", ["seed=0"], -50.0, [-50.0, -50.0, -50.0])  # before code.json existed
    rows = write_report([root], tmp_path / "split", reps=200).rows
    labels = {row.configuration.label: row.estimates["final_return"] for row in rows}
    assert sorted(labels) == ["code=0.1.0@aaaaaaaa", "code=0.1.0@bbbbbbbb", "code=unknown"]
    newest = labels["code=0.1.0@bbbbbbbb"]
    assert newest is not None and newest.iqm == pytest.approx(-31.0) and newest.seeds == 2
    assert (
        main(["report", str(root), "--out", str(tmp_path / "merged"), "--reps", "200", "--merge-code"]) == 0
    )
    assert "2 run(s) in 1 configuration(s)" in capsys.readouterr().out  # seeds 0 and 1, the rest repeats


def test_a_run_records_the_code_that_trained_it_and_a_resume_by_other_code(tmp_path, monkeypatch):
    from marl_ppo.run import code_record

    today = {"version": "0.1.0", "commit": "1" * 40, "tree": "2" * 40, "dirty": False}
    monkeypatch.setattr(code_record, "current_code", lambda: dict(today))
    code_record.write_code_record(tmp_path, resume=False)
    assert json.loads((tmp_path / "code.json").read_text()) == today
    assert code_record.code_label(tmp_path) == "0.1.0@22222222"
    code_record.write_code_record(tmp_path, resume=True)  # resumed by the same code: unchanged
    assert code_record.code_label(tmp_path) == "0.1.0@22222222"
    today.update(tree="3" * 40, dirty=True)
    code_record.write_code_record(tmp_path, resume=True)
    record = json.loads((tmp_path / "code.json").read_text())
    assert record["tree"] == "2" * 40 and record["resumes"] == [today]
    assert code_record.code_label(tmp_path) == "0.1.0@22222222+resumed"


def test_the_running_code_is_this_checkout():
    from marl_ppo.run.code_record import current_code

    code = current_code()
    assert code["version"] == marl_ppo.__version__
    if code["commit"] is not None:  # a git checkout: a 40-digit commit and the package's tree
        assert len(code["commit"]) == 40 and len(code["tree"]) == 40 and isinstance(code["dirty"], bool)


def test_report_names_configurations_and_marks_each_evaluation(runs, tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, path, **_: drawn.append(figure))
    out = tmp_path / "named"
    args = ["report", str(runs / "lr0.001"), str(runs / "lr0.002"), "--out", str(out), "--reps", "100"]
    assert main([*args, "--name", "slow=ppo.pi_lr=0.001", "--name", "fast = ppo.pi_lr=0.002"]) == 0
    markdown = (out / "report.md").read_text()
    assert "| fast | 3 | 300 | -10.00 [-10.00, -10.00] |" in markdown and "| slow | 3 |" in markdown
    (axes,) = drawn[0].axes
    assert [line.get_label() for line in axes.get_lines()] == ["slow (3 seeds)", "fast (3 seeds)"]
    assert [list(line.get_xdata()) for line in axes.get_lines()] == [[100.0, 200.0, 300.0]] * 2
    assert all(line.get_marker() == "o" for line in axes.get_lines())  # every evaluation shows as a point
    assert axes.xaxis.get_major_formatter()(200_000) == "200 k"
    capsys.readouterr()
    assert main([*args, "--name", "fast=ppo.pi_lr=0.003"]) == 2
    assert capsys.readouterr().err == (
        "error: --name fast=ppo.pi_lr=0.003: no configuration reads 'ppo.pi_lr=0.003'; they read "
        "'ppo.pi_lr=0.001'; 'ppo.pi_lr=0.002'\n"
    )
    assert main([*args, "--name", "fast"]) == 2
    assert "--name 'fast' must be NAME=CONFIGURATION" in capsys.readouterr().err
