"""Paths shared by the report tests (a module of its own: ``conftest`` names collide
across test directories)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ARTIFACTS = ROOT / "build" / "artifacts"
"""Test artifacts (screenshots, terminal captures) for a person to look at."""
