"""TensorBoard event files, written and read back without TensorFlow (tensorboardX's
protocol buffers): `EventFile` for MetricWriter, `read_scalars` for the tests and tools."""

from __future__ import annotations

import os
import socket
import struct
import time


class EventFile:
    """One TensorBoard event file in `logdir`, written as TensorFlow writes them (TFRecord
    framing, tensorboardX's protocol buffers), synchronously: each `scalars` call is in the
    operating system's hands when it returns, like a line of metrics.jsonl. (tensorboardX's
    SummaryWriter queues events for a thread that flushes every two minutes: a killed run lost
    them.)

    `purge_step`: the run restarts at that step. The file then begins with TensorBoard's
    restart marker (SessionLog.START at `purge_step`), on which TensorBoard drops every event
    of the files before it at that step or later: the steps a resumed run replays appear once.
    `read_scalars` reads the files back the same way."""

    def __init__(self, logdir: str, purge_step: int | None = None):
        from tensorboardX.proto import event_pb2, summary_pb2  # before any file is made
        from tensorboardX.record_writer import masked_crc32c

        self._pb, self._crc = (event_pb2, summary_pb2), masked_crc32c
        os.makedirs(logdir, exist_ok=True)
        # TensorBoard reads a folder's files in name order: the start time leads the name.
        base = os.path.join(
            logdir, f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
        )
        name, n = f"{base}.{os.getpid()}", 1
        while os.path.lexists(name):  # never overwrite another run's file
            n += 1
            name = f"{base}.{os.getpid()}.{n}"
        self.path = name
        self._file = open(name, "xb")
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self._write(event_pb2.Event(wall_time=time.time(), step=purge_step, session_log=start))
        self._file.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """One event at `step` holding the scalar `values` (tag -> value)."""
        if not values:
            return
        event_pb2, summary_pb2 = self._pb
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values.items()]
        )
        self._write(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        self._file.flush()

    def _write(self, event) -> None:
        """One TFRecord: length, its masked CRC-32C, the serialised event, its masked CRC."""
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        crc = self._crc
        self._file.write(
            header + struct.pack("<I", crc(header)) + data + struct.pack("<I", crc(data))
        )

    def close(self) -> None:
        self._file.close()


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """The scalars TensorBoard shows from the event files in `logdir`: tag -> [(step, value)]
    in the order written. Files are read in name order and a restart marker (SessionLog.START
    at step s) drops the points at step s or later read before it, as TensorBoard does (its
    `purge_orphaned_data`); a record cut short by a kill, or failing its checksum, ends its
    file, as it does in TensorBoard."""
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c

    points: dict[str, list[tuple[int, float]]] = {}
    names = os.listdir(logdir) if os.path.isdir(logdir) else []
    for name in sorted(n for n in names if ".tfevents." in n):
        with open(os.path.join(logdir, name), "rb") as f:
            data = f.read()
        at = 0
        while at + 12 <= len(data):
            header, (header_crc,) = data[at : at + 8], struct.unpack("<I", data[at + 8 : at + 12])
            (length,) = struct.unpack("<Q", header)
            body = data[at + 12 : at + 12 + length]
            tail = data[at + 12 + length : at + 16 + length]
            if len(tail) < 4 or header_crc != masked_crc32c(header):
                break
            if struct.unpack("<I", tail)[0] != masked_crc32c(body):
                break
            at += 16 + length
            event = event_pb2.Event.FromString(body)
            if event.session_log.status == event_pb2.SessionLog.START:
                for tag, kept in points.items():
                    points[tag] = [(s, v) for s, v in kept if s < event.step]
            for value in event.summary.value:
                points.setdefault(value.tag, []).append((event.step, value.simple_value))
    return points
