"""The local recording: OTLP/JSON lines, as the OpenTelemetry Collector's file exporter writes.

Each line is one ``ExportTraceServiceRequest``, ``ExportMetricsServiceRequest`` or
``ExportLogsServiceRequest`` in OTLP/JSON (lowerCamelCase keys, enums as integers,
64-bit integers as strings, trace and span ids as hex). Any OTLP tool that reads the
collector's ``file`` exporter output (e.g. the collector's ``otlpjsonfile`` receiver)
reads it. Encoding uses ``opentelemetry-exporter-otlp-proto-common``'s encoders and
protobuf's ``json_format``; nothing is encoded by hand.

The file is size-bounded: when a line would take it past ``max_bytes`` it is rotated to
``<path>.1`` (``.1`` → ``.2`` …, keeping ``backups`` old files). Writers share one
:class:`RecordingFile` (thread-safe, one lock per line).
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import Message  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def _ids_to_hex(node: Any) -> Any:
    """OTLP/JSON writes trace/span ids as hex, protobuf's JSON as base64: convert."""
    if isinstance(node, dict):
        return {
            k: (
                base64.b64decode(v).hex()
                if k in _ID_KEYS and isinstance(v, str)
                else _ids_to_hex(v)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_ids_to_hex(v) for v in node]
    return node


def _ids_to_base64(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (
                base64.b64encode(bytes.fromhex(v)).decode()
                if k in _ID_KEYS and isinstance(v, str)
                else _ids_to_base64(v)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_ids_to_base64(v) for v in node]
    return node


def to_json_line(message: Message) -> str:
    """One OTLP/JSON line (no trailing newline) for an Export*ServiceRequest."""
    as_dict = json_format.MessageToDict(message, use_integers_for_enums=True)
    return json.dumps(_ids_to_hex(as_dict), separators=(",", ":"))


def read_recording(path: str | os.PathLike[str]) -> Iterator[Message]:
    """Yield the Export*ServiceRequest messages of one recording file, in order.

    Lines that are not valid OTLP/JSON (e.g. a line cut short by a crash) are skipped.
    """
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                data = _ids_to_base64(json.loads(line))
            except (ValueError, TypeError):
                continue
            message: Message
            if "resourceSpans" in data:
                message = ExportTraceServiceRequest()
            elif "resourceMetrics" in data:
                message = ExportMetricsServiceRequest()
            elif "resourceLogs" in data:
                message = ExportLogsServiceRequest()
            else:
                continue
            try:
                yield json_format.ParseDict(data, message)
            except json_format.ParseError:
                continue


class RecordingFile:
    """An append-only, size-rotated JSON-lines file (thread-safe).

    Rotation is best effort and never ends the recording: if the file was removed or
    renamed under us (a tmp cleaner, logrotate, a user), the rename is skipped and a new
    file is opened at ``path``; if it cannot be opened (directory gone, disk full), the
    write raises ``OSError`` (the exporter reports a failed export) and the next write
    tries to open it again.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int, backups: int) -> None:
        self.path = Path(path)
        self._max_bytes = max_bytes
        self._backups = backups
        self._lock = threading.Lock()
        self._closed = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - long-lived
        self._size = self._file.tell()
        self.lines_written = 0
        self.rotations = 0

    def write_line(self, line: str) -> None:
        data = line + "\n"
        size = len(data.encode("utf-8"))
        with self._lock:
            if self._closed:
                return
            if self._file.closed:  # a failed rotation or reopen: try again now
                self._open()
            if self._size and self._size + size > self._max_bytes:
                self._rotate()
            self._file.write(data)
            self._file.flush()
            self._size += size
            self.lines_written += 1

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._size = self._file.tell()

    def _rotate(self) -> None:
        self._file.close()
        try:
            if self._backups == 0:
                self.path.unlink(missing_ok=True)
            else:
                for n in range(self._backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{n}")
                    if older.exists():
                        older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
                if self.path.exists():
                    self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        except OSError:
            pass  # keep recording into a fresh file rather than stop (see the class doc)
        self.rotations += 1
        self._open()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if not self._file.closed:
                self._file.close()


class RecordingSpanExporter(SpanExporter):
    """Writes each batch of spans as one ExportTraceServiceRequest line."""

    def __init__(self, recording: RecordingFile) -> None:
        self._recording = recording

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._recording.write_line(to_json_line(encode_spans(spans)))
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        # The file is shared with the metric exporter; its owner (the runtime) closes it.
        return None


class RecordingMetricExporter(MetricExporter):
    """Writes each collection as one ExportMetricsServiceRequest line."""

    def __init__(self, recording: RecordingFile, preferred_temporality: Any = None) -> None:
        super().__init__(preferred_temporality=preferred_temporality)
        self._recording = recording

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            self._recording.write_line(to_json_line(encode_metrics(metrics_data)))
        except (OSError, ValueError):
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None
