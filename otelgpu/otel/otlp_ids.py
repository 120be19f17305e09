"""Trace and span ids between OTLP/JSON and protobuf's JSON mapping.

OTLP/JSON writes ``traceId``/``spanId``/``parentSpanId`` as hex; protobuf's JSON
mapping (``json_format``) writes and parses bytes as base64. The recording writer turns
base64 into hex, the reader hex into base64; every other value is left as it is.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

__all__ = ["ID_KEYS", "ids_to_base64", "ids_to_hex"]

ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})
"""The OTLP/JSON keys whose values are ids."""


def _map_ids(node: Any, convert: Callable[[str], str]) -> Any:
    """A copy of the JSON tree ``node`` with ``convert`` applied to every string id."""
    if isinstance(node, dict):
        return {
            k: convert(v) if k in ID_KEYS and isinstance(v, str) else _map_ids(v, convert)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_map_ids(v, convert) for v in node]
    return node


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode()


def ids_to_hex(node: Any) -> Any:
    """Protobuf's JSON (base64 ids) to OTLP/JSON (hex ids)."""
    return _map_ids(node, _b64_to_hex)


def ids_to_base64(node: Any) -> Any:
    """OTLP/JSON (hex ids) to what protobuf's JSON parser wants (base64 ids); a malformed
    hex id raises ``ValueError``."""
    return _map_ids(node, _hex_to_b64)
