"""Peak dense FLOP/s per GPU model and dtype: the denominator of MFU.

Values are the vendors' datasheet figures for **dense** math (no 2:4 sparsity), per GPU,
in FLOP/s. Tensor-core dtypes (``bf16``, ``fp16``, ``fp8``, ``tf32``) use the tensor-core
peak; ``fp32`` is the non-tensor FP32 peak. An SKU not listed (or clocked differently) is
handled by the ``peak_flops`` setting (``OTELGPU_PEAK_FLOPS``), which wins over the table.

Models are matched on NVML's product name (``nvmlDeviceGetName``), first rule first, so
the more specific rules (``H100 NVL``, ``H100 PCIe``) come before the generic ``H100``.
"""

from __future__ import annotations

DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")
"""Dtypes the table knows (setting ``mfu_dtype``)."""

_T = 1e12

#: (name fragments that must all appear, lowercase; model label; {dtype: FLOP/s}).
PEAKS: tuple[tuple[tuple[str, ...], str, dict[str, float]], ...] = (
    (("b200",), "B200",
     {"bf16": 2250 * _T, "fp16": 2250 * _T, "fp8": 4500 * _T, "tf32": 1100 * _T, "fp32": 75 * _T}),
    (("h200", "nvl"), "H200 NVL",
     {"bf16": 835 * _T, "fp16": 835 * _T, "fp8": 1671 * _T, "tf32": 417 * _T, "fp32": 60 * _T}),
    (("h200",), "H200 SXM",
     {"bf16": 989 * _T, "fp16": 989 * _T, "fp8": 1979 * _T, "tf32": 494 * _T, "fp32": 67 * _T}),
    (("h100", "nvl"), "H100 NVL",
     {"bf16": 835 * _T, "fp16": 835 * _T, "fp8": 1671 * _T, "tf32": 417 * _T, "fp32": 60 * _T}),
    (("h100", "pcie"), "H100 PCIe",
     {"bf16": 756 * _T, "fp16": 756 * _T, "fp8": 1513 * _T, "tf32": 378 * _T, "fp32": 51 * _T}),
    (("h100",), "H100 SXM",
     {"bf16": 989 * _T, "fp16": 989 * _T, "fp8": 1979 * _T, "tf32": 494 * _T, "fp32": 67 * _T}),
    (("a100",), "A100",
     {"bf16": 312 * _T, "fp16": 312 * _T, "tf32": 156 * _T, "fp32": 19.5 * _T}),
    (("l40s",), "L40S",
     {"bf16": 362 * _T, "fp16": 362 * _T, "fp8": 733 * _T, "tf32": 183 * _T, "fp32": 91.6 * _T}),
    (("l4",), "L4",
     {"bf16": 121 * _T, "fp16": 121 * _T, "fp8": 242 * _T, "tf32": 60 * _T, "fp32": 30.3 * _T}),
    (("rtx 4090",), "RTX 4090",
     {"bf16": 165 * _T, "fp16": 165 * _T, "fp8": 330 * _T, "tf32": 82.6 * _T, "fp32": 82.6 * _T}),
)  # fmt: skip


def model_of(name: str) -> str | None:
    """The table's model label for an NVML product name (``None``: not in the table)."""
    low = name.lower()
    for fragments, model, _ in PEAKS:
        if all(f in low for f in fragments):
            return model
    return None


def peak_flops(name: str, dtype: str = "bf16") -> float | None:
    """Peak dense FLOP/s of one GPU named ``name`` for ``dtype`` (``None``: unknown)."""
    low = name.lower()
    for fragments, _, peaks in PEAKS:
        if all(f in low for f in fragments):
            return peaks.get(dtype)
    return None


def markdown_table() -> str:
    """The table as Markdown, TFLOP/s (for the docs)."""
    rows = ["| GPU | " + " | ".join(DTYPES) + " |", "|---" * (len(DTYPES) + 1) + "|"]
    for _, model, peaks in PEAKS:
        cells = [f"{peaks[d] / _T:g}" if d in peaks else "--" for d in DTYPES]
        rows.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


__all__ = ["DTYPES", "PEAKS", "markdown_table", "model_of", "peak_flops"]
