"""log.backends: TensorBoard, CSV, W&B (offline) and MLflow (sqlite) get the same scalar series; a
resumed run appends to the same W&B and MLflow runs; an unreachable tracker costs a warning, not the run."""

import json
import struct
import warnings

import numpy as np
import pytest

from marl_ppo.config import ConfigError, load_config
from marl_ppo.logs.backends import CsvBackend, TrackerWarning, read_scalars_csv, rows_of
from marl_ppo.logs.trackers import wandb_logged_in, wandb_mode
from marl_ppo.run.loop import train
from marl_ppo.run.resume import resume_config
from tests.helpers import ROOT

SPREAD = ROOT / "experiments/mpe/simple_spread.yaml"


@pytest.fixture
def no_wandb_env(monkeypatch, tmp_path):
    """No W&B or MLflow settings from the machine: no login, no mode, no server."""
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_TAGS"):
        monkeypatch.delenv(key, raising=False)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    import wandb

    wandb.teardown()  # W&B reads its environment once per process, at its first init


def _config(tiny_overrides, *extra):
    return load_config(SPREAD, [*tiny_overrides, "log.checkpoint_every=1", *extra])


def _tensorboard(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return sorted(
        (tag, p.step, float(np.float32(p.value)))
        for tag in events.Tags()["scalars"]
        for p in events.Scalars(tag)
    )


def _csv(run_dir):
    return sorted(
        (tag, step, float(np.float32(v))) for step, tag, v in read_scalars_csv(run_dir / "csv/scalars.csv")
    )


def _wandb_records(path):
    """The protobuf records of a `.wandb` file (LevelDB log blocks of 32 KiB after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data, position, block, pending, records = path.read_bytes(), 7, 32768, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _wandb(run_dir):
    """(run ids, scalar points) of every offline W&B run under the run directory, oldest first."""
    ids, points = [], []
    for directory in sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda p: p.name):
        for record in _wandb_records(next(directory.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.append(record.run.run_id)
            elif kind == "history":
                row = {  # a video is a dict, which W&B may also write flattened into nested keys
                    item.nested_key[0] if item.nested_key else item.key: json.loads(item.value_json)
                    for item in record.history.item
                    if len(item.nested_key) <= 1
                }
                step = row.pop("env_step")
                points += [
                    (tag, step, float(np.float32(v)))
                    for tag, v in row.items()
                    if not tag.startswith("_") and isinstance(v, int | float)
                ]
    return ids, sorted(points)


def _mlflow(run_dir):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    run = runs[0]
    points = sorted(
        (key, m.step, float(np.float32(m.value)))
        for key in run.data.metrics
        if not key.startswith("summary/")
        for m in client.get_metric_history(run.info.run_id, key)
    )
    return run, points


def test_four_backends_get_the_same_series_and_resume_appends_to_the_same_runs(
    tmp_path, tiny_overrides, no_wandb_env
):
    run_dir = tmp_path / "run"
    backends = "log.backends=[tensorboard,csv,wandb,mlflow]"
    train(_config(tiny_overrides, backends, "eval.every=50", "log.video=gif"), run_dir)
    first_ids, first_wandb = _wandb(run_dir)
    train(resume_config(run_dir, ["total_steps=200"]), run_dir, resume=True)

    tensorboard = _tensorboard(run_dir)
    assert {step for _, step, _ in tensorboard} >= {100, 200}
    assert any(tag == "rollout/team_return" for tag, _, _ in tensorboard)
    assert _csv(run_dir) == tensorboard
    ids, wandb_points = _wandb(run_dir)
    assert (
        len(ids) == 2 and len(set(ids)) == 1 and ids[0] == first_ids[0]
    )  # the resumed run is the same W&B run
    assert wandb_points == tensorboard
    assert set(first_wandb) < set(wandb_points)
    run, mlflow_points = _mlflow(run_dir)
    assert mlflow_points == tensorboard  # one MLflow run holds both halves
    assert run.info.status == "FINISHED"
    assert json.loads(run.data.params["ppo.pi_lr"]) == load_config(SPREAD).ppo.pi_lr
    assert run.data.metrics["summary/env_steps"] == 200
    summary = dict(
        tuple(row)
        for row in (line.split(",") for line in (run_dir / "csv/summary.csv").read_text().split()[1:])
    )
    assert int(summary["env_steps"]) == 200
    _the_videos_are_shown_where_they_can_be(run_dir, run)
    trackers = json.loads((run_dir / "trackers.json").read_text())
    assert trackers["wandb"]["id"] == ids[0] and trackers["mlflow"]["run_id"] == run.info.run_id


def _the_videos_are_shown_where_they_can_be(run_dir, mlflow_run):
    """Each run (the first and the resumed one) ended with a GIF in videos/, shown by TensorBoard (an
    animated image), W&B (a video row) and MLflow (an artifact)."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    videos = sorted(run_dir.glob("videos/episode_*.gif"))
    assert videos and all(path.read_bytes()[:6] == b"GIF89a" for path in videos)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    shown = events.Images("eval/video")
    assert {image.encoded_image_string for image in shown} == {path.read_bytes() for path in videos}
    media = [path for path in (run_dir / "wandb").rglob("*.gif") if "media" in path.parts]
    assert {path.read_bytes() for path in media} == {path.read_bytes() for path in videos}
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    artifacts = [a.path for a in client.list_artifacts(mlflow_run.info.run_id, "videos")]
    assert sorted(artifacts) == [f"videos/{path.name}" for path in videos]


def test_unreachable_trackers_cost_one_line_each_and_the_run_goes_on(
    tmp_path, tiny_overrides, no_wandb_env, monkeypatch
):
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: connection refused
    config = _config(
        tiny_overrides,
        "log.backends=[tensorboard,wandb,mlflow]",
        "log.mlflow.tracking_uri=http://127.0.0.1:9",
        "log.wandb.init_timeout_s=3",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(config, tmp_path / "run")
    assert result.env_steps == 100
    messages = [str(w.message) for w in caught if issubclass(w.category, TrackerWarning)]
    assert len(messages) == 2 and all("\n" not in m for m in messages)
    assert (
        messages[0].startswith("log.backends: wandb failed") and "the run goes on without it" in messages[0]
    )
    assert messages[1].startswith("log.backends: mlflow failed")
    assert any(tag == "train/loss_pi" for tag, _, _ in _tensorboard(tmp_path / "run"))


def test_a_tracker_that_fails_mid_run_is_dropped_with_one_warning(
    tmp_path, tiny_overrides, no_wandb_env, monkeypatch
):
    from marl_ppo.logs import trackers

    calls = []

    def broken(self, step, pairs):
        calls.append(step)
        raise ConnectionError("server went away")

    monkeypatch.setattr(trackers.WandbBackend, "scalars", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(_config(tiny_overrides, "log.backends=[csv,wandb]"), tmp_path / "run")
    assert result.env_steps == 100 and len(calls) == 1
    messages = [str(w.message) for w in caught if issubclass(w.category, TrackerWarning)]
    assert messages == [
        "log.backends: wandb failed (ConnectionError: server went away); the run goes on without it"
    ]
    assert max(step for step, _, _ in read_scalars_csv(tmp_path / "run/csv/scalars.csv")) == 100


def test_rows_keep_every_value_of_a_repeated_tag():
    pairs = [("a", 1.0), ("b", 2.0), ("a", 3.0), ("a", 4.0)]
    assert rows_of(pairs) == [{"a": 1.0, "b": 2.0}, {"a": 3.0}, {"a": 4.0}]


def test_the_csv_of_a_resumed_run_drops_what_the_stopped_process_logged_after_its_checkpoint(tmp_path):
    backend = CsvBackend(tmp_path, resume_step=None)
    for step in (10, 20, 30):
        backend.scalars(step, [("x", float(step)), ("x", -1.0)])
    backend.close()
    resumed = CsvBackend(tmp_path, resume_step=20)
    resumed.scalars(30, [("x", 0.5)])
    resumed.close()
    assert read_scalars_csv(tmp_path / "csv/scalars.csv") == [
        (10, "x", 10.0),
        (10, "x", -1.0),
        (20, "x", 20.0),
        (20, "x", -1.0),
        (30, "x", 0.5),
    ]


def test_wandb_runs_offline_without_a_login(tmp_path):
    config = load_config(SPREAD, [])
    assert not wandb_logged_in({"NETRC": str(tmp_path / "none")})
    assert wandb_mode(config.log.wandb, {"NETRC": str(tmp_path / "none")}) == "offline"
    assert wandb_mode(config.log.wandb, {"WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode(config.log.wandb, {"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    assert wandb_logged_in({"NETRC": str(netrc)})


def test_a_backend_named_twice_or_unknown_is_refused():
    with pytest.raises(ConfigError, match="log.backends"):
        load_config(SPREAD, ["log.backends=[csv,csv]"])
    with pytest.raises(ConfigError, match="log.backends"):
        load_config(SPREAD, ["log.backends=[neptune]"])


def test_report_and_compare_read_a_run_that_logged_csv_alone(tmp_path, tiny_overrides):
    import shutil

    from marl_ppo.analysis.runlogs import RETURN_TAGS, find_run_dirs, last_values, read_run

    run_dir = tmp_path / "run"
    train(_config(tiny_overrides, "log.backends=[tensorboard,csv]", "eval.every=50"), run_dir)
    from_tensorboard = read_run(run_dir).series
    last = last_values(run_dir, RETURN_TAGS)
    shutil.rmtree(run_dir / "tensorboard")
    assert find_run_dirs([tmp_path]) == [run_dir]
    from_csv = read_run(run_dir).series
    assert set(from_csv) == set(RETURN_TAGS) == set(from_tensorboard)
    for tag in RETURN_TAGS:
        assert np.array_equal(from_csv[tag][0], from_tensorboard[tag][0])
        assert np.allclose(from_csv[tag][1], from_tensorboard[tag][1], rtol=1e-6)  # TensorBoard keeps float32
    assert last_values(run_dir, RETURN_TAGS) == pytest.approx(last, rel=1e-6)
