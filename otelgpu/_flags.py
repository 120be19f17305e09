"""The one parser of boolean values otelgpu reads (settings, variables, the build).

Standard library only: ``setup.py`` loads this file by path (the package is not
importable while it is being built), so the build and the runtime read
``OTELGPU_NO_EXTENSIONS`` with the same rule.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def parse_bool(raw: object) -> bool:
    """``raw`` as a boolean: a bool, or one of :data:`TRUE` / :data:`FALSE` (any case).

    Raises ``ValueError`` for anything else.
    """
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        value = raw.strip().lower()
        if value in TRUE:
            return True
        if value in FALSE:
            return False
    raise ValueError(raw)


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """A switch variable: on unless unset, empty or one of :data:`FALSE` (any case).

    Used for ``OTELGPU_NO_EXTENSIONS`` (at build and at import time), where any other
    value, e.g. ``2``, also means "on".
    """
    env = os.environ if environ is None else environ
    return env.get(name, "").strip().lower() not in ("", *FALSE)


__all__ = ["FALSE", "TRUE", "env_flag", "parse_bool"]
