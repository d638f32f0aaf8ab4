"""A TensorBoard event file of scalars, written without TensorBoard's writer thread (`EventWriter`), and
TensorBoard's own SummaryWriter behind the same interface (`LibraryEventWriter`, `fast.event_writer: false`)."""

from __future__ import annotations

import functools
import itertools
import os
import socket
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np


class EventWriter:
    """A TensorBoard event file of scalars: one event per call, holding all of that step's values.

    One event with many values costs a fraction of one event per value (a batched VMAS rollout ends
    as many episodes per update as it has copies, each with several scalars); the reader sees the
    same scalars. Records are framed here, in the calling thread, with a C CRC-32C, where
    TensorBoard's own writer checksums every byte in Python on a background thread.
    `fast.event_writer: false` writes with TensorBoard's SummaryWriter instead.
    """

    BUFFER_BYTES = 1 << 20
    """Records collected in memory before they are written to the file."""

    def __init__(self, log_dir: Path, *, purge_step: int | None = None, flush_secs: float = 30) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        log_dir.mkdir(parents=True, exist_ok=True)
        # creation second first (the reader's order), then what tells writers of that second apart
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_WRITERS)}"
        self.path = log_dir / name
        self._file = open(self.path, "ab")  # noqa: SIM115 (open for the writer's lifetime)
        self._pending = bytearray()
        self._layouts: dict[tuple[str, ...], np.dtype] = {}
        self._flush_secs, self._flushed = flush_secs, time.monotonic()
        self._add(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:  # the reader discards events at and after this step read before it
            start = SessionLog(status=SessionLog.START)
            self._add(Event(wall_time=time.time(), step=purge_step, session_log=start))
        self.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Write `values` (tag: number) at `step`."""
        self.rows([step], {tag: [value] for tag, value in values.items()})

    def rows(self, steps: Sequence[int], columns: dict[str, Sequence[float] | np.ndarray]) -> None:
        """Write one event per row `i`, at `steps[i]`, holding every tag's value `columns[tag][i]`.

        The events are encoded here rather than through one protobuf object per event: each tag's
        bytes are fixed, so all rows' summaries are laid out by one numpy record array.
        """
        if not len(steps):
            return
        layout = self._layouts.get(tuple(columns))
        if layout is None:
            layout = self._layouts[tuple(columns)] = _summary_layout(list(columns))
        summaries = np.zeros(len(steps), dtype=layout)
        with np.errstate(over="ignore"):  # beyond float32's range is inf, as protobuf stores it
            for i, (tag, values) in enumerate(columns.items()):
                summaries[f"k{i}"] = _value_key(tag)
                summaries[f"v{i}"] = values  # float32, as TensorBoard's simple_value
        summary_bytes = summaries.tobytes()
        size = layout.itemsize
        head = b"\x09" + struct.pack("<d", time.time()) + b"\x10"  # Event.wall_time, then Event.step's key
        tail = b"\x2a" + _varint(size)  # Event.summary: key and length
        for row, step in enumerate(steps):
            event = head + _varint(int(step)) + tail + summary_bytes[row * size : (row + 1) * size]
            self._pending += tf_record(event)
        if len(self._pending) >= self.BUFFER_BYTES or time.monotonic() - self._flushed > self._flush_secs:
            self.flush()

    def _add(self, event: Any) -> None:
        self._pending += tf_record(event.SerializeToString())

    def flush(self) -> None:
        """Write every pending event to the file (it then survives a kill of this process)."""
        if self._pending:
            self._file.write(self._pending)
            self._pending.clear()
        self._file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        """Flush and close the file."""
        if not self._file.closed:
            self.flush()
            self._file.close()


_WRITERS = itertools.count()


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    if value < 0:
        raise ValueError(f"cannot log at negative step {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def _value_key(tag: str) -> bytes:
    """A `Summary.value` entry up to its number: the entry's key and length, `Value.tag`, and the key of
    `Value.simple_value` (a 4-byte float follows)."""
    name = tag.encode()
    value = b"\x0a" + _varint(len(name)) + name + b"\x15"
    return b"\x0a" + _varint(len(value) + 4) + value


def _summary_layout(tags: list[str]) -> np.dtype:
    """One row's serialized `Summary`: each tag's fixed bytes (`k<i>`), then its float32 (`v<i>`)."""
    fields = []
    for i, tag in enumerate(tags):
        fields += [(f"k{i}", f"S{len(_value_key(tag))}"), (f"v{i}", "<f4")]
    return np.dtype(fields)  # packed: no padding between fields


def tf_record(data: bytes) -> bytes:
    """`data` framed as a TFRecord: length, masked CRC-32C of the length, data, masked CRC-32C of the data."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data))


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def wait_for_a_later_event_file_name(log_dir: Path) -> None:
    """Make the next event file sort after the existing ones (TensorBoard reads them in name order).

    Event file names start with the creation second, then host and pid: a run resumed within the
    same second as an earlier writer (or on another host) could otherwise be read before it.
    """
    fields = [path.name.split(".") for path in log_dir.glob("events.out.tfevents.*")]
    stamps = [int(parts[3]) for parts in fields if parts[3].isdigit()]
    while stamps and int(time.time()) <= max(stamps):
        time.sleep(0.05)


class LibraryEventWriter:
    """torch.utils.tensorboard's SummaryWriter behind EventWriter's interface: one `add_scalar` per value."""

    def __init__(self, log_dir: Path, *, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Every value at `step`."""
        for tag, value in values.items():
            self.writer.add_scalar(tag, float(value), step)

    def rows(self, steps: Sequence[int], columns: dict[str, Sequence[float] | np.ndarray]) -> None:
        """Row i of every column at `steps[i]`."""
        for i, step in enumerate(steps):
            self.scalars(step, {tag: column[i] for tag, column in columns.items()})

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
