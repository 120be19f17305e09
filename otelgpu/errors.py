"""Exceptions shared by the native and pure-Python twins (both raise exactly these)."""

from __future__ import annotations


class OtelGpuError(Exception):
    """Base class of every exception otelgpu raises on purpose."""


class ConfigurationError(OtelGpuError, ValueError):
    """A setting has an invalid value.

    Raised only at configuration time (``instrument()``, constructors), never on a
    hot path. The message names the setting and the accepted values.
    """

    def __init__(self, setting: str, value: object, accepted: str) -> None:
        self.setting = setting
        self.value = value
        self.accepted = accepted
        super().__init__(f"invalid value {value!r} for {setting}: expected {accepted}")


class CorruptDataError(OtelGpuError, ValueError):
    """Serialized data (a sketch's bytes, a recording) is truncated or malformed."""
