"""Renders the metric tables of ``docs/metrics*.md`` from the catalog.

Each table sits between ``<!-- catalog:BLOCK -->`` and ``<!-- /catalog:BLOCK -->`` lines;
:func:`update` rewrites them from :mod:`otelgpu.metrics.catalog`, :func:`stale` says which
differ (the tests assert none does). Run ``python -m otelgpu.metrics.markdown`` after
changing the catalog.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

from otelgpu.metrics import catalog
from otelgpu.metrics.spec import MetricSpec

DOCS = ("metrics.md", "metrics-torch.md", "metrics-vllm.md", "diagnosis.md")
"""The pages under ``docs/`` that hold catalog tables."""

_BLOCK = re.compile(r"(<!-- catalog:([\w-]+) -->\n)(.*?)(<!-- /catalog:\2 -->)", re.S)


def _blocks() -> dict[str, tuple[tuple[MetricSpec, ...], dict[str, str]]]:
    requests = tuple(catalog.BY_NAME[name] for name in catalog.VLLM_RUNTIME_SOURCES)
    return {
        "gpu": ((*catalog.GPU_METRICS, *catalog.SAMPLER_METRICS), {}),
        "runtime": ((*catalog.RUNTIME_METRICS, *catalog.INTERNAL_METRICS), {}),
        "torch": (catalog.TORCH_METRICS, {}),
        "vllm-requests": (requests, catalog.VLLM_RUNTIME_SOURCES),
        "vllm": (catalog.VLLM_METRICS, {}),
        "diagnosis": (catalog.DIAGNOSIS_METRICS, {}),
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "\N{EN DASH}"


def table(specs: Iterable[MetricSpec], sources: dict[str, str] | None = None) -> str:
    """One markdown table: name, kind, unit, attributes, status, source, description."""
    lines = [
        "| Name | Kind | Unit | Attributes | Status | Source | Description |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in specs:
        attrs = ", ".join(f"`{a}`" for a in m.attributes)
        source = (sources or {}).get(m.name, m.source)
        lines.append(
            f"| `{m.name}` | {m.kind.value} | `{m.unit}` | {_cell(attrs)} | {m.status.value} "
            f"| {_cell(source)} | {_cell(m.description)} |"
        )
    return "\n".join(lines) + "\n"


def render(text: str) -> str:
    """``text`` with every catalog block regenerated."""
    blocks = _blocks()

    def replace(match: re.Match[str]) -> str:
        specs, sources = blocks[match.group(2)]
        return match.group(1) + table(specs, sources) + match.group(4)

    return _BLOCK.sub(replace, text)


def block_names(text: str) -> list[str]:
    """The catalog blocks ``text`` holds."""
    return [m.group(2) for m in _BLOCK.finditer(text)]


def stale(docs_dir: Path) -> list[str]:
    """The pages whose catalog tables differ from the catalog (empty when up to date)."""
    return [
        name
        for name in DOCS
        if render(text := (docs_dir / name).read_text(encoding="utf-8")) != text
    ]


def update(docs_dir: Path) -> list[str]:
    """Regenerate the catalog tables of every page; returns the pages changed."""
    changed = stale(docs_dir)
    for name in changed:
        path = docs_dir / name
        path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    docs_dir = Path(args[0]) if args else Path("docs")
    for name in update(docs_dir):
        print(f"updated {docs_dir / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
