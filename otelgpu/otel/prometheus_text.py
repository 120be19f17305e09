"""The Prometheus text formats for the pull endpoint, with each series' line prefix cached.

``prometheus_client`` writes every sample line from scratch: each label name validated and
escaped, each value escaped, the labels sorted, on every scrape. otelgpu's endpoint serves
the same ~1,000 series (8 GPUs) scrape after scrape, so that work was about half of a
scrape (tens of ms holding the GIL on the scrape's thread, which a busy host feels as
pauses). :class:`TextWriter` writes the same bytes -- the text format 0.0.4 and
OpenMetrics 1.x, any name escaping -- from a cache of each series' *prefix* (the escaped
name and the sorted, escaped label set; keyed by the name and the labels as given), so a
scrape only formats values. It uses ``prometheus_client``'s own escaping functions, and
on otelgpu's endpoint hands the GIL back every few samples (``otelgpu.otel.slicing``, on
the slice the scrape's collection began).

Byte-equality is checked, not assumed: the first scrape of each format in a process is
written both ways from the same collected families; if they differ (another
``prometheus_client`` version writes differently), a warning is logged and that format is
served by ``prometheus_client`` from then on. So is anything this module does not write
(OpenMetrics 2, a ``prometheus_client`` without the functions it uses).

The cache holds at most ``max_prefixes`` entries (cleared when full: memory is bounded
whatever the label churn). Thread-safe: concurrent scrapes share the cache (dict
operations under the GIL; an entry is the same string whoever computes it).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from otelgpu.otel import host_work, slicing

_logger = logging.getLogger("otelgpu")

Encoder = Callable[[Any], bytes]

SAMPLES_PER_TICK = 16
"""Samples written between two chances to hand the GIL back (~15 µs each warm)."""
THEIR_SAMPLES_PER_TICK = 4
"""The same for ``prometheus_client``'s writers in the first scrape's check (~25 µs each
for a GPU series of 8 labels, ~100 µs cold)."""

try:  # the escaping functions prometheus_client's own writers use (0.22 and later)
    from prometheus_client import exposition as _text
    from prometheus_client.openmetrics import exposition as _om
    from prometheus_client.utils import floatToGoString, parse_version
    from prometheus_client.validation import _is_valid_legacy_metric_name

    _escape = _om._escape
    _escape_metric_name = _om.escape_metric_name
    _escape_label_name = _om.escape_label_name
    _labelname_rune = _om._is_legacy_labelname_rune
    _compose_exemplar = _om._compose_exemplar_string
    ALLOWUTF8, UNDERSCORES = _om.ALLOWUTF8, _om.UNDERSCORES
    _AVAILABLE = True
except (ImportError, AttributeError):  # an older prometheus_client: its writers are used
    _AVAILABLE = False

_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


def _float(value: Any) -> str:
    return floatToGoString(value)  # type: ignore[no-untyped-call,no-any-return]


class _Families:
    """A registry stand-in over already collected families (what the writers iterate)."""

    __slots__ = ("_families",)

    def __init__(self, families: Sequence[Any]) -> None:
        self._families = families

    def collect(self) -> Iterable[Any]:
        return self._families


def _tick() -> None:
    """:func:`slicing.tick` on a scrape served by otelgpu's endpoint (a background thread),
    on the slice its collection began: a writer with a slice of its own held the GIL for
    the rest of the collection's slice and then a whole one more (1.2-1.9 ms stretches
    against a busy host). Nothing on a thread of the host's that writes a registry itself."""
    if host_work.is_background():
        slicing.tick()


def _theirs_in_slices(their: Encoder, families: Sequence[Any], kind: str) -> bytes:
    """``their(families)`` (``prometheus_client``'s answer), written a family -- or a piece
    of :data:`THEIR_SAMPLES_PER_TICK` samples of one -- at a time, with the GIL handed back
    between them (their writer takes ~25 µs per sample of the GPU families: one family of
    8 GPUs' series was a 1.8 ms stretch). The same bytes
    where a family's exposition is its metadata lines and then one line per sample, as it
    is for otelgpu's families; where it is not (a family with ``_created`` samples, which
    the text format gathers at the family's end), the caller's comparison fails and it
    asks for the whole answer again (:meth:`TextWriter._write`)."""
    eof = b"# EOF\n"
    chunks = []
    for family in families:
        for i, piece in enumerate(_family_pieces(family)):
            chunk = their(_Families([piece]))
            if kind != "text" and chunk.endswith(eof):
                chunk = chunk[: -len(eof)]
            if i:  # the family's HELP/TYPE/UNIT lines were its first piece's
                chunk = _without_metadata(chunk)
            chunks.append(chunk)
            _tick()
    if kind != "text":
        chunks.append(eof)
    return b"".join(chunks)


def _family_pieces(family: Any) -> list[Any]:
    """``family`` as copies of :data:`THEIR_SAMPLES_PER_TICK` samples each (itself when
    small)."""
    samples = family.samples
    if len(samples) <= THEIR_SAMPLES_PER_TICK:
        return [family]
    pieces = []
    for start in range(0, len(samples), THEIR_SAMPLES_PER_TICK):
        piece = copy.copy(family)
        piece.samples = samples[start : start + THEIR_SAMPLES_PER_TICK]
        pieces.append(piece)
    return pieces


def _without_metadata(chunk: bytes) -> bytes:
    """``chunk`` without its leading ``# ``-lines (a family's HELP, TYPE and UNIT)."""
    while chunk.startswith(b"# "):
        end = chunk.find(b"\n")
        chunk = b"" if end < 0 else chunk[end + 1 :]
    return chunk


class TextWriter:
    """Writes a registry in the Prometheus text formats (see the module docstring)."""

    def __init__(self, *, max_prefixes: int = 50_000) -> None:
        self._max = max_prefixes
        self._prefixes: dict[tuple[Any, ...], str] = {}
        #: Format key -> True (ours, verified), False (prometheus_client's); absent: the
        #: next scrape of that format verifies.
        self._verified: dict[tuple[str, str], bool] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ negotiation
    def encoder(self, accept: str | None) -> tuple[Encoder, str]:
        """``prometheus_client``'s ``choose_encoder(accept)``, with its encoder replaced by
        this writer's where it writes that format: (encoder, content type)."""
        from prometheus_client.exposition import choose_encoder

        their, content_type = choose_encoder(accept or "")
        if not _AVAILABLE:
            return their, content_type
        if their is _text.generate_latest:
            return partial(self._write, "text", UNDERSCORES, "", their), content_type
        if isinstance(their, partial):
            escaping = their.keywords.get("escaping", UNDERSCORES)
            if their.func is _text.generate_latest and not their.args:
                return partial(self._write, "text", escaping, "", their), content_type
            version = their.keywords.get("version", "1.0.0")
            if (
                their.func is _om.generate_latest
                and not their.args
                and parse_version(version) < (2, 0, 0)
            ):
                return partial(self._write, "openmetrics", escaping, version, their), content_type
        return their, content_type

    def _write(
        self, kind: str, escaping: str, version: str, their: Encoder, registry: Any
    ) -> bytes:
        key = (kind, escaping)
        verified = self._verified.get(key)
        if verified is False:
            return their(registry)
        families = list(registry.collect())
        try:
            ours = self.write(families, kind, escaping)
        except Exception as exc:  # noqa: BLE001 - the scrape still gets its answer
            _logger.warning(
                "otelgpu: Prometheus %s writer failed (%r); using prometheus_client's", kind, exc
            )
            self._verified[key] = False
            return their(_Families(families))
        if verified is None:
            with self._lock:
                if key not in self._verified:
                    theirs = _theirs_in_slices(their, families, kind)
                    same = theirs == ours
                    if not same:  # the verdict rests on their answer written whole
                        theirs = their(_Families(families))
                        same = theirs == ours
                    self._verified[key] = same
                    if not same:
                        _logger.warning(
                            "otelgpu: the Prometheus %s output differs from prometheus_client's "
                            "(another version?); prometheus_client writes it from now on",
                            kind,
                        )
                        return theirs
        return ours

    # ------------------------------------------------------------------ writing
    def write(
        self, families: Iterable[Any], kind: str = "text", escaping: str = "underscores"
    ) -> bytes:
        """The exposition of ``families`` (``prometheus_client`` metric families): ``kind``
        ``text`` (0.0.4) or ``openmetrics`` (1.x), with ``escaping`` of names."""
        if len(self._prefixes) > self._max:
            self._prefixes = {}
        out: list[str] = []
        family = self._text_family if kind == "text" else self._om_family
        for metric in families:
            family(metric, escaping, out, _tick)
            _tick()
        if kind != "text":
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")

    def _prefix(self, kind: str, escaping: str, name: str, labels: dict[str, str]) -> str:
        """A sample line up to its value (cached): the escaped name and label set."""
        key = (kind, escaping, name, *labels.items())
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._build_prefix(kind, escaping, name, labels)
            self._prefixes[key] = prefix
        return prefix

    @staticmethod
    def _build_prefix(kind: str, escaping: str, name: str, labels: dict[str, str]) -> str:
        if kind == "text":
            labelstr = ""
            if labels:
                labelstr = ",".join(
                    f'{_escape_label_name(k, escaping)}="{_escape(v, ALLOWUTF8, False)}"'  # type: ignore[arg-type]
                    for k, v in sorted(labels.items())
                )
            if escaping != ALLOWUTF8 or _is_valid_legacy_metric_name(name):
                if labelstr:
                    labelstr = "{" + labelstr + "}"
                return _escape_metric_name(name, escaping) + labelstr
            comma = "," if labelstr else ""
            return "{" + _escape_metric_name(name, escaping) + comma + labelstr + "}"
        legacy = escaping != ALLOWUTF8 or _is_valid_legacy_metric_name(name)
        labelstr = "" if legacy else _escape_metric_name(name, escaping) + ("," if labels else "")
        if labels:
            labelstr += ",".join(
                f'{_escape_label_name(k, escaping)}="{_escape(v, ALLOWUTF8, _labelname_rune)}"'
                for k, v in sorted(labels.items())
            )
        if labelstr:
            labelstr = "{" + labelstr + "}"
        return (_escape(name, escaping, _labelname_rune) if legacy else "") + labelstr

    def _text_family(
        self, metric: Any, escaping: str, out: list[str], tick: Callable[[], None]
    ) -> None:
        mname, mtype = metric.name, metric.type
        # The OpenMetrics types as the text format names them (prometheus_client's rules).
        if mtype == "counter":
            mname += "_total"
        elif mtype == "info":
            mname += "_info"
            mtype = "gauge"
        elif mtype == "stateset":
            mtype = "gauge"
        elif mtype == "gaugehistogram":
            mtype = "histogram"
        elif mtype == "unknown":
            mtype = "untyped"
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        escaped = _escape_metric_name(mname, escaping)
        out.append(f"# HELP {escaped} {doc}\n")
        out.append(f"# TYPE {escaped} {mtype}\n")
        om_samples: dict[str, list[str]] = {}
        prefix = self._prefix
        for i, s in enumerate(metric.samples):
            if not i % SAMPLES_PER_TICK:  # a histogram family is hundreds of lines
                tick()
            timestamp = ""
            if s.timestamp is not None:
                timestamp = f" {int(float(s.timestamp) * 1000):d}"
            value = _float(s.value)
            line = f"{prefix('text', escaping, s.name, s.labels)} {value}{timestamp}\n"
            for suffix in _OM_SUFFIXES:
                if s.name == metric.name + suffix:
                    om_samples.setdefault(suffix, []).append(line)
                    break
            else:
                out.append(line)
        for suffix, lines in sorted(om_samples.items()):
            escaped = _escape_metric_name(metric.name + suffix, escaping)
            out.append(f"# HELP {escaped} {doc}\n")
            out.append(f"# TYPE {escaped} gauge\n")
            out.extend(lines)

    def _om_family(
        self, metric: Any, escaping: str, out: list[str], tick: Callable[[], None]
    ) -> None:
        mname = _escape_metric_name(metric.name, escaping)
        out.append(f"# HELP {mname} {_escape(metric.documentation, ALLOWUTF8, _labelname_rune)}\n")
        out.append(f"# TYPE {mname} {metric.type}\n")
        if metric.unit:
            out.append(f"# UNIT {mname} {metric.unit}\n")
        prefix = self._prefix
        for i, s in enumerate(metric.samples):
            if not i % SAMPLES_PER_TICK:
                tick()
            if s.native_histogram:  # not written before OpenMetrics 2
                continue
            exemplar = _compose_exemplar(metric, s, s.exemplar) if s.exemplar else ""  # type: ignore[no-untyped-call]
            timestamp = "" if s.timestamp is None else f" {s.timestamp}"
            value = "" if s.value is None else _float(s.value)
            line = prefix("openmetrics", escaping, s.name, s.labels)
            out.append(f"{line} {value}{timestamp}{exemplar}\n")


__all__ = ["TextWriter"]
