"""`marl-ppo reproduce`: the seeds' IQM against the experiment file's expected band, exit 1 outside."""

import itertools
import re

import pytest
import yaml

from marl_ppo.cli import main
from tests.helpers import ROOT

pytest.importorskip("rliable")

TINY_MATRIX = {
    "env": {"id": "envs/matrix_game_v0"},
    "rollout": {"num_envs": 2, "rollout_steps": 4},
    "total_steps": 1000,
    "ppo": {"num_minibatches": 1, "train_pi_iters": 1, "train_vf_iters": 1},
    "model": {"hidden_sizes": [8]},
}


def _experiment(tmp_path, band):
    path = tmp_path / "matrix.yaml"
    path.write_text(
        yaml.safe_dump({**TINY_MATRIX, "expected": {"steps": 8, "seeds": 1, "team_return": band}})
    )
    return path


def test_a_band_out_of_reach_exits_1_with_the_figure_against_the_band(tmp_path, capsys):
    out = tmp_path / "runs"
    experiment = _experiment(tmp_path, [1000.0, 2000.0])  # the matrix game pays at most 20
    assert main(["reproduce", str(experiment), "--out", str(out)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("reproduce matrix: team return IQM ")
    assert last.endswith(" over 1 seed(s) at 8 env steps; expected [1000.00, 2000.00]: OUTSIDE")
    figure = float(last.split("IQM ")[1].split(" ")[0])
    assert -20.0 <= figure <= 20.0
    assert yaml.safe_load((out / "matrix" / "seed0" / "config.yaml").read_text())["total_steps"] == 8

    # a band around the figure passes, reusing the finished run (the band changes nothing trained)
    _experiment(tmp_path, [figure - 0.01, figure + 0.01])
    assert main(["reproduce", str(experiment), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0 finished, 1 skipped" not in printed and "[1/" not in printed  # nothing was trained again
    assert printed.strip().splitlines()[-1].endswith(": inside")


def test_reproduce_without_an_expected_block_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(TINY_MATRIX))
    assert main(["reproduce", str(path), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "has no expected: block; add one, e.g. expected: {steps:" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("expected", "message"),
    [
        (
            "{steps: 8, seeds: 1, team_return: [3, 2]}",
            "config key 'expected.team_return' must be [low, high] with finite low <= high",
        ),
        ("{steps: 8, seeds: 1, team_return: [1]}", "config key 'expected.team_return'"),
        ("{steps: 8, seeds: 1}", "config key 'expected' needs a band: team_return: [low, high], eval:"),
        (
            "{steps: 8, seeds: 1, league: {league/pool_nash_conv: [0, 1]}}",
            "names tags under league/ without the prefix",
        ),
        (
            "{steps: 8, seeds: 1, eval: {eval/team_return: [0, 1]}}",
            "names tags under eval/ without the prefix",
        ),
        (
            "{steps: 8, seeds: 1, eval: {team_return: [2, 1]}}",
            "config key 'expected.eval.team_return' must be [low, high]",
        ),
    ],
)
def test_a_bad_expected_block_is_a_config_error(tmp_path, capsys, expected, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(TINY_MATRIX) + f"expected: {expected}\n")
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def _evaluated(tmp_path, expected):
    path = tmp_path / "matrix.yaml"
    path.write_text(
        yaml.safe_dump({**TINY_MATRIX, "eval": {"every": 8, "episodes": 2}, "expected": expected})
    )
    return path


def test_an_eval_band_checks_the_last_evaluation_of_each_seed(tmp_path, capsys):
    """A game's team return is 0 whatever it learned, so its band is on the last evaluation's tag."""
    from marl_ppo.analysis.runlogs import last_values

    out = tmp_path / "runs"
    experiment = _evaluated(tmp_path, {"steps": 16, "seeds": 2, "eval": {"team_return": [1000.0, 2000.0]}})
    assert main(["reproduce", str(experiment), "--out", str(out)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("reproduce matrix: eval/team_return IQM ")
    assert last.endswith(" over 2 seed(s) at 16 env steps; expected [1000.00, 2000.00]: OUTSIDE")
    figure = float(last.split("IQM ")[1].split(" ")[0])
    seeds = [
        last_values(out / "matrix" / f"seed{k}", ["eval/team_return"])["eval/team_return"] for k in (0, 1)
    ]
    assert seeds[0] is not None and seeds[1] is not None
    assert figure == pytest.approx(
        (seeds[0] + seeds[1]) / 2, abs=0.005
    )  # fewer than 4 seeds: the IQM is the mean

    # both bands are checked, the team return's first; one outside fails the whole
    _evaluated(
        tmp_path,
        {
            "steps": 16,
            "seeds": 2,
            "team_return": [-100.0, 100.0],
            "eval": {"team_return": [figure - 0.01, figure + 0.01]},
        },
    )
    assert main(["reproduce", str(experiment), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("reproduce matrix: team return IQM ") and lines[-2].endswith(": inside")
    assert lines[-1].startswith("reproduce matrix: eval/team_return IQM ") and lines[-1].endswith(": inside")
    _evaluated(
        tmp_path,
        {"steps": 16, "seeds": 2, "team_return": [1000.0, 2000.0], "eval": {"team_return": [-100.0, 100.0]}},
    )
    assert main(["reproduce", str(experiment), "--out", str(out)]) == 1

    # a tag the evaluation never wrote is one line, naming the seeds and the fix
    _evaluated(tmp_path, {"steps": 16, "seeds": 2, "eval": {"vs_random/win_rate": [0.5, 1.0]}})
    assert main(["reproduce", str(experiment), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "expected.eval names 'eval/vs_random/win_rate', which seed0, seed1 never logged" in err
    assert err.count("\n") == 1


def test_an_eval_band_without_evaluations_stops_reproduce_in_one_line_but_not_train(tmp_path, capsys):
    path = tmp_path / "plain.yaml"
    path.write_text(
        yaml.safe_dump({**TINY_MATRIX, "expected": {"steps": 8, "seeds": 1, "eval": {"team_return": [0, 1]}}})
    )
    assert main(["reproduce", str(path), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "expected.eval bands the last periodic evaluation, but eval.every is not set" in err
    assert err.count("\n") == 1 and not (tmp_path / "runs").exists()
    assert (
        main(["train", str(path), "total_steps=8", "--run-dir", str(tmp_path / "run")]) == 0
    )  # train ignores it


def test_a_league_band_checks_the_last_snapshots_pool_average(tmp_path, capsys):
    """A naive self-play run with a pool (`league.opponents: latest`) is banded on the NashConv of its
    pool's average policy, which training logs at each snapshot."""
    from marl_ppo.analysis.runlogs import last_values

    kuhn = {
        "env": {"id": "classic/kuhn_poker"},
        "ppo": {"critic": "obs", "num_minibatches": 1, "train_pi_iters": 1, "train_vf_iters": 1},
        "model": {"share_actor": True, "hidden_sizes": [8]},
        "rollout": {"num_envs": 2, "rollout_steps": 8, "vector": "sync"},
        "eval": {"nash_conv": True},
        "league": {"opponents": "latest", "snapshot_every": 1, "rating_episodes": 0},
        "expected": {"steps": 32, "seeds": 1, "league": {"pool_nash_conv": [0.0, 0.917]}},
    }
    path = tmp_path / "kuhn.yaml"
    path.write_text(yaml.safe_dump(kuhn))
    out = tmp_path / "runs"
    assert main(["reproduce", str(path), "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("reproduce kuhn: league/pool_nash_conv IQM ") and last.endswith(": inside")
    logged = last_values(out / "kuhn" / "seed0", ["league/pool_nash_conv"])["league/pool_nash_conv"]
    assert logged is not None and float(last.split("IQM ")[1].split(" ")[0]) == pytest.approx(
        logged, abs=0.005
    )

    # without a league there is nothing to band: one line, before any training
    path.write_text(yaml.safe_dump({**kuhn, "league": {}}))
    assert main(["reproduce", str(path), "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "expected.league bands what a league run logs, but league.opponents is not set" in err
    assert err.count("\n") == 1 and not (tmp_path / "none").exists()


def test_every_expected_block_in_the_experiments_is_valid():
    from marl_ppo.config import load_config

    found = [
        path for path in sorted((ROOT / "experiments").rglob("*.yaml")) if "expected:" in path.read_text()
    ]
    assert len(found) >= 4
    for path in found:
        expected = load_config(path).expected
        assert expected is not None, path
        bands = [*(expected.eval or {}).values(), *(expected.league or {}).values()]
        for low, high in [expected.team_return or (0, 0), *bands]:
            assert low <= high, path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experiment", "band"),
    [
        ("experiments/examples/matrix_game_v0.yaml", "[19.00, 20.00]"),
        ("experiments/examples/masked_guess_v0.yaml", "[15.50, 16.00]"),
    ],
)
def test_the_example_games_reproduce_their_bands(experiment, band, tmp_path, capsys):
    assert main(["reproduce", str(ROOT / experiment), "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(f"expected {band}: inside")


@pytest.mark.slow
def test_the_default_experiment_reproduces_a_short_band(tmp_path, capsys):
    """simple_spread at 100k env steps, seeds 0 and 1 (a few minutes each on 2 cores): a random policy
    scores about -81, and a learner that stalls stays near it."""
    text = (ROOT / "experiments/mpe/simple_spread.yaml").read_text()
    short = tmp_path / "simple_spread_100k.yaml"
    short.write_text(
        text.replace(
            "expected: {steps: 1_000_000, seeds: 3, team_return: [-35.0, -30.0]}",
            "expected: {steps: 100_000, seeds: 2, team_return: [-60.0, -50.0]}",
        )
    )
    assert "steps: 100_000" in short.read_text()
    assert main(["reproduce", str(short), "--out", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("expected [-60.00, -50.00]: inside")


def test_every_experiment_file_has_a_row_in_the_results_table():
    results = (ROOT / "docs/results.md").read_text()
    files = sorted(
        path.relative_to(ROOT / "experiments").as_posix() for path in (ROOT / "experiments").rglob("*.yaml")
    )
    assert len(files) >= 40 and [f for f in files if f"| `{f}` |" not in results] == []


MEASURED = re.compile(r"\bIQM\b|95% CI|CPU-min|\bmin\b|\bminutes?\b|Expected result|\bseeds? \d")
"""What a measured result reads like: an IQM, a confidence interval, a timing, per-seed figures."""


def test_experiment_headers_say_what_runs_and_leave_the_results_to_docs_results_md():
    # one home per result: the header names the task, how the team return is scored and the random
    # policy's score, and points to docs/results.md; no comment in the file carries a timing
    files = sorted((ROOT / "experiments").rglob("*.yaml"))
    lines = {path.relative_to(ROOT).as_posix(): path.read_text().splitlines() for path in files}
    headers = {  # the opening comment lines, joined into one line of prose
        name: " ".join(
            line[1:].strip() for line in itertools.takewhile(lambda line: line.startswith("#"), text)
        )
        for name, text in lines.items()
    }
    comments = {name: "\n".join(line.partition("#")[2] for line in text) for name, text in lines.items()}
    assert len(files) >= 40
    assert {name: found for name, header in headers.items() if (found := MEASURED.findall(header))} == {}
    timings = re.compile(r"CPU-min|\bmin\b|\bminutes?\b")
    assert {name: found for name, text in comments.items() if (found := timings.findall(text))} == {}
    for needed in ("team return", "random", "docs/results.md"):
        assert [name for name, header in headers.items() if needed not in header.lower()] == [], needed


COMPARED = {
    "ippo": {"ppo.critic"},
    "happo": {"ppo.actor_update", "model.share_actor"},
    "league": {"league.opponents"},
}
"""A variant file's suffix -> the keys its comparison with the base file is about. HAPPO is its
sequential update of an actor per agent (Kuba et al. 2022; HARL ships MAPPO with shared actors and
HAPPO with an actor per agent), so the pair differs in both; a league's file may also set the league's
other keys."""


def test_a_shipped_comparison_names_in_its_header_every_other_key_it_differs_in():
    """`X_ippo.yaml` and `X_happo.yaml` are read beside `X.yaml` (or `X_vN.yaml`): where they differ in a
    key besides the one compared, the variant's header names that key and says why, so `compare` over
    the pair is not taken for like for like by mistake."""
    from marl_ppo.analysis.runlogs import flatten_config
    from marl_ppo.config import config_to_dict, load_config

    pairs, unexplained = 0, {}
    for variant in sorted((ROOT / "experiments").rglob("*.yaml")):
        stem, _, suffix = variant.stem.rpartition("_")
        if suffix not in COMPARED:
            continue
        header = " ".join(
            line[1:].strip()
            for line in itertools.takewhile(
                lambda line: line.startswith("#"), variant.read_text().splitlines()
            )
        )
        for base in variant.parent.glob(f"{stem}*.yaml"):
            if base == variant or not re.fullmatch(re.escape(stem) + r"(_v\d+)?", base.stem):
                continue
            pairs += 1
            ours, theirs = (flatten_config(config_to_dict(load_config(path))) for path in (variant, base))
            differing = {key for key in ours.keys() | theirs.keys() if ours.get(key) != theirs.get(key)}
            others = sorted(
                key
                for key in differing - COMPARED[suffix]
                if not key.startswith("expected") and not (suffix == "league" and key.startswith("league."))
            )
            assert COMPARED[suffix] & differing, (variant.name, base.name)
            missing = [key for key in others if key not in header]
            if missing:
                unexplained[f"{variant.name} vs {base.name}"] = missing
    assert pairs >= 9 and unexplained == {}
