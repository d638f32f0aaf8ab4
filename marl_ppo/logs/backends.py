"""Where a run's scalars go (`log.backends`): one `LogBackend` per tracker, each given the same values.

A backend receives every logged step as `(tag, value)` pairs (a tag may repeat when several episodes
end at the same env step), the resolved config once, and the finished run's summary. TensorBoard
and CSV write into the run directory; W&B and MLflow (`logs/trackers.py`, which opens them all) may talk to a server, so
they are `Guarded`: the first error costs a one-line warning and the run goes on without them.
"""

from __future__ import annotations

import csv
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import yaml

Pairs = Sequence[tuple[str, float]]
"""One logged step's scalars: `(tag, value)`, in the order logged; a tag may repeat."""


class LogBackend(Protocol):
    """A tracker the run logger writes through."""

    name: str

    def scalars(self, step: int, pairs: Pairs) -> None:
        """Record the scalars of env step `step`."""

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """Record the run's resolved config (nested dict of primitives)."""

    def summary(self, values: Mapping[str, Any]) -> None:
        """Record the finished run's summary (summary.json's values)."""

    def video(self, step: int, path: Path) -> None:
        """Show a recorded episode (a GIF or MP4 file in the run directory), where the tracker can."""

    def flush(self) -> None:
        """Write what is pending (before a checkpoint)."""

    def close(self) -> None:
        """Flush and release the tracker; the run is finished or stopped."""


class TrackerWarning(UserWarning):
    """A tracker failed; the run goes on without it."""


def flat_config(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value (`{"ppo.pi_lr": 0.0007, ...}`); lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[prefix + str(key)] = value
    return flat


def rows_of(pairs: Pairs) -> list[dict[str, float]]:
    """The pairs as few dicts as keep every value: a tag's k-th value goes into the k-th dict."""
    rows: list[dict[str, float]] = []
    seen: dict[str, int] = {}
    for tag, value in pairs:
        k = seen.get(tag, 0)
        seen[tag] = k + 1
        if k == len(rows):
            rows.append({})
        rows[k][tag] = float(value)
    return rows


class TensorBoardBackend:
    """Event files under `<run_dir>/tensorboard`; the config and summary as text."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, *, resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = run_dir / "tensorboard"
        if resume_step is not None:
            wait_for_a_later_event_file_name(log_dir)
        # purge_step: TensorBoard's reader drops the killed run's events from this step on
        purge_step = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step, flush_secs=30)
        self.resumed = resume_step is not None

    def scalars(self, step: int, pairs: Pairs) -> None:
        """One event holding every scalar of `step`: the Summary `add_scalar` writes for one value, with
        all of them (a repeated tag keeps each value, as separate `add_scalar` calls keep them).
        One event per logged step rather than one per scalar keeps logging off the profile."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value)) for tag, value in pairs])
        self.writer._get_file_writer().add_summary(summary, step)  # what add_scalar writes through

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """The config as YAML text (TensorBoard's Text tab); a resumed run has it already."""
        if not self.resumed:
            text = yaml.safe_dump(dict(config), sort_keys=False)
            self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)

    def summary(self, values: Mapping[str, Any]) -> None:
        """The summary as JSON text, at the last env step."""
        text = json.dumps(dict(values), indent=2)
        self.writer.add_text(
            "summary", "    " + text.replace("\n", "\n    "), int(values.get("env_steps", 0))
        )

    def video(self, step: int, path: Path) -> None:
        """A GIF as an animated image under `eval/video` (the Images tab); TensorBoard shows no MP4."""
        if path.suffix != ".gif":
            return
        from PIL import Image
        from tensorboard.compat.proto.summary_pb2 import Summary

        with Image.open(path) as gif:
            width, height = gif.size
        image = Summary.Image(
            height=height, width=width, colorspace=3, encoded_image_string=path.read_bytes()
        )
        self.writer._get_file_writer().add_summary(
            Summary(value=[Summary.Value(tag="eval/video", image=image)]), step
        )

    def flush(self) -> None:
        """Write pending events to disk."""
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def wait_for_a_later_event_file_name(log_dir: Path) -> None:
    """Make the next event file sort after the existing ones (TensorBoard reads them in name order).

    Event file names start with the creation second, then host and pid: a run resumed within the
    same second as an earlier writer (or on another host) could otherwise be read before it.
    """
    fields = [path.name.split(".") for path in log_dir.glob("events.out.tfevents.*")]
    stamps = [int(parts[3]) for parts in fields if parts[3].isdigit()]
    while stamps and int(time.time()) <= max(stamps):
        time.sleep(0.05)


CSV_COLUMNS = ("step", "tag", "value")


class CsvBackend:
    """`<run_dir>/csv/scalars.csv`, one row per value (`step,tag,value`), plus `hparams.csv` and `summary.csv`.

    A resumed run drops the rows a stopped process wrote after its checkpoint, as TensorBoard's reader does.
    """

    name = "csv"

    def __init__(self, run_dir: Path, *, resume_step: int | None) -> None:
        self.directory = run_dir / "csv"
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "scalars.csv"
        if resume_step is not None and path.is_file():
            kept = [row for row in read_scalars_csv(path) if row[0] <= resume_step]
            _write_rows(path, kept)
        new = not path.is_file()
        self.file: TextIO = path.open("a", newline="")
        self.writer = csv.writer(self.file)
        if new:
            self.writer.writerow(CSV_COLUMNS)

    def scalars(self, step: int, pairs: Pairs) -> None:
        """One row per value."""
        self.writer.writerows((step, tag, repr(float(value))) for tag, value in pairs)

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """`hparams.csv`: `key,value` per dotted config key (values as JSON)."""
        rows = [(key, json.dumps(value)) for key, value in flat_config(config).items()]
        _write_table(self.directory / "hparams.csv", ("key", "value"), rows)

    def summary(self, values: Mapping[str, Any]) -> None:
        """`summary.csv`: `key,value` per summary field."""
        _write_table(self.directory / "summary.csv", ("key", "value"), list(values.items()))

    def video(self, step: int, path: Path) -> None:
        """A table shows no video: the file stays in the run directory."""

    def flush(self) -> None:
        """Write buffered rows to disk."""
        self.file.flush()

    def close(self) -> None:
        """Close the scalar file."""
        self.file.close()


def read_scalars_csv(path: Path) -> list[tuple[int, str, float]]:
    """The `(step, tag, value)` rows of a `scalars.csv`, in the order written."""
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        next(reader, None)
        return [(int(step), tag, float(value)) for step, tag, value in reader]


def _write_rows(path: Path, rows: Sequence[tuple[int, str, float]]) -> None:
    _write_table(path, CSV_COLUMNS, [(step, tag, repr(value)) for step, tag, value in rows])


def _write_table(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Write a CSV file atomically (a kill leaves the old file or the new one)."""
    temporary = path.with_suffix(".tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    temporary.replace(path)


class Guarded:
    """A tracker whose first failure costs a one-line warning: it is then dropped, the run goes on."""

    def __init__(self, backend: LogBackend) -> None:
        self.backend: LogBackend | None = backend
        self.name = backend.name

    def _call(self, action: Callable[[LogBackend], None]) -> None:
        if self.backend is None:
            return
        try:
            action(self.backend)
        except Exception as err:  # a tracker must never cost the run
            self.backend = None
            warn_tracker(self.name, err)

    def scalars(self, step: int, pairs: Pairs) -> None:
        """Forward, or drop the tracker."""
        self._call(lambda backend: backend.scalars(step, pairs))

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """Forward, or drop the tracker."""
        self._call(lambda backend: backend.hyperparameters(config))

    def summary(self, values: Mapping[str, Any]) -> None:
        """Forward, or drop the tracker."""
        self._call(lambda backend: backend.summary(values))

    def video(self, step: int, path: Path) -> None:
        """Forward, or drop the tracker."""
        self._call(lambda backend: backend.video(step, path))

    def flush(self) -> None:
        """Forward, or drop the tracker."""
        self._call(lambda backend: backend.flush())

    def close(self) -> None:
        """Forward, or drop the tracker."""
        self._call(lambda backend: backend.close())


def warn_tracker(name: str, err: BaseException) -> None:
    """The one-line warning of a failed tracker."""
    reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
    warnings.warn(
        f"log.backends: {name} failed ({reason}); the run goes on without it", TrackerWarning, stacklevel=3
    )
