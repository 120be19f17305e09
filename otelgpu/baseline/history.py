"""History from a Prometheus-compatible query API (Prometheus, VictoriaMetrics, Thanos,
Mimir all answer ``/api/v1/query_range``).

:class:`PromHistory` runs range and instant queries with optional HTTP headers (auth,
tenant); :class:`StoreError` says the store could not be asked (unreachable, error
answer). Blocking (urllib, bounded timeout); one caller thread.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PromHistory", "RangeSeries", "StoreError", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus-style duration (``90s``, ``15m``, ``7d``, ``1w``)."""
    text = text.strip()
    try:
        unit = _UNITS.get(text[-1:])
        value = float(text[:-1]) * unit if unit else float(text)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 15m, 6h, 7d)") from None
    if not value > 0 or math.isinf(value):
        raise ValueError(f"a duration must be > 0: {text!r}")
    return value


class StoreError(Exception):
    """The query API could not answer (connection, HTTP or PromQL error)."""


@dataclass
class RangeSeries:
    """One series of a range query: its labels and ``(unix_s, value)`` points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


class PromHistory:
    """Range queries against ``url`` (the API root, e.g. ``http://prom:9090``)."""

    def __init__(
        self, url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 60.0
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s

    def _get(self, path: str, params: Mapping[str, str]) -> object:
        query = urllib.parse.urlencode(params)
        request = urllib.request.Request(f"{self.url}{path}?{query}", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise StoreError(f"{self.url}{path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise StoreError(f"{self.url}{path}: {exc}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise StoreError(f"{self.url}{path}: {body!r:.500}")
        return body["data"]

    def instant(self, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        """The ``(labels, value)`` of each series of ``promql`` at ``at`` (unix seconds)."""
        data = self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
        assert isinstance(data, dict)
        out = []
        for item in data.get("result", []):
            value = float(item.get("value", [0, "nan"])[1])
            if not math.isnan(value) and not math.isinf(value):
                out.append((dict(item.get("metric", {})), value))
        return out

    def range(self, promql: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        """The series of ``promql`` between ``start`` and ``end`` (unix seconds)."""
        data = self._get(
            "/api/v1/query_range",
            {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"},
        )
        assert isinstance(data, dict)
        out = []
        for item in data.get("result", []):
            points = [
                (float(t), float(v))
                for t, v in item.get("values", [])
                if not math.isnan(float(v)) and not math.isinf(float(v))
            ]
            out.append(RangeSeries(dict(item.get("metric", {})), points))
        return out
