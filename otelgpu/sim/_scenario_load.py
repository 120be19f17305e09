"""Scenario loading: built-in names and files (bounded size, UTF-8, bounded nesting) or
dicts, validated into a :class:`Scenario`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from otelgpu.sim._scenario_check import parse_scenario
from otelgpu.sim._scenario_keys import MAX_NESTING, MAX_SCENARIO_BYTES, ScenarioError
from otelgpu.sim._scenario_model import Scenario

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]


def builtin_dir() -> Path:
    """Directory of the built-in scenarios."""
    return Path(str(resources.files("otelgpu.sim").joinpath("scenarios")))


def list_scenarios() -> list[str]:
    """Names of the built-in scenarios, sorted."""
    return sorted(p.stem for p in builtin_dir().glob("*.toml"))


def resolve_path(name_or_path: str | Path) -> Path:
    """A scenario file: a path (with ``/`` or ``.toml``) or a built-in name."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or text.endswith(".toml"):
        path = Path(text)
        if not path.is_file():
            raise ScenarioError(text, "file", text, "an existing TOML scenario file")
        return path
    path = builtin_dir() / f"{text}.toml"
    if not path.is_file():
        raise ScenarioError(
            text,
            "name",
            text,
            f"a built-in scenario ({', '.join(list_scenarios())}) or a path to a .toml file",
        )
    return path


def load_scenario(name_or_path: str | Path | Mapping[str, Any] | Scenario) -> Scenario:
    """Load and validate a scenario: a built-in name, a ``.toml`` path, a dict, or a
    :class:`Scenario` (returned as is). Raises :class:`ScenarioError`."""
    if isinstance(name_or_path, Scenario):
        return name_or_path
    if isinstance(name_or_path, Mapping):
        _check_nesting("<dict>", name_or_path)
        return parse_scenario(name_or_path, "<dict>", name=str(name_or_path.get("name", "custom")))
    path = resolve_path(name_or_path)
    source = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(source, "file", str(exc), "a readable TOML scenario file") from None
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ScenarioError(
            source, "file", f"{len(raw)}+ bytes", f"a file of at most {MAX_SCENARIO_BYTES} bytes"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            source, "encoding", f"byte {raw[exc.start]:#04x} at offset {exc.start}", "UTF-8 text"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, "syntax", str(exc), "valid TOML") from None
    except RecursionError:
        raise ScenarioError(
            source, "syntax", "nesting too deep", f"TOML nested at most {MAX_NESTING} levels"
        ) from None
    _check_nesting(source, data)
    return parse_scenario(data, source, name=path.stem)


def _check_nesting(source: str, data: Any) -> None:
    """Refuse documents nested deeper than :data:`MAX_NESTING` (iteratively: no recursion)."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        value, depth, key = stack.pop()
        if depth > MAX_NESTING:
            raise ScenarioError(
                source, key or "document", "nesting too deep", f"at most {MAX_NESTING} levels"
            )
        if isinstance(value, Mapping):
            stack += [(v, depth + 1, f"{key}.{k}" if key else str(k)) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, depth + 1, f"{key}[{i}]") for i, v in enumerate(value)]
