"""Peak dense FLOP/s per GPU model and dtype: the denominator of MFU.

Every figure is **dense** (no 2:4 structured sparsity), per GPU, in FLOP/s. Vendor
datasheets print the tensor-core figures *with* sparsity (marked ``*``) for Hopper, Ada and
Blackwell; the table holds half of those. Tensor-core dtypes (``bf16``, ``fp16``, ``fp8``,
``tf32``) use the tensor-core peak with FP32 accumulation (what PyTorch's matmuls use: a
GeForce card runs FP16/FP8 with FP16 accumulation at twice that); ``fp32`` is the
non-tensor (CUDA-core) FP32 peak. An SKU not listed (or clocked differently, e.g. a
power-capped card) is handled by the ``peak_flops`` setting (``OTELGPU_PEAK_FLOPS``),
which wins over the table.

Sources (checked against the datasheet figures as republished on the pages named; the
datasheet's sparse figure halved where it only prints that):

* B200 -- NVIDIA HGX B200 datasheet, per-GPU column (1,000 W): FP16/BF16 4.5 PF*, FP8
  9 PF*, TF32 2.2 PF*, FP32 75 TF (reproduced in the DGX/HGX B200 table at
  zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html; the same dense
  figures on glennklockwood.com/garden/processors/B200). The GB200 part (1,200 W) is
  faster (BF16 2.5 PF dense) and is not a separate row: set ``peak_flops`` for it.
* H100 SXM / H200 SXM -- NVIDIA H100 and H200 datasheets: BF16/FP16 1,979 TF*, FP8
  3,958 TF*, TF32 989 TF*, FP32 67 TF (same GH100 silicon and clocks; dense matrix
  figures 989.4 / 1,978.9 / 494.7 on glennklockwood.com/garden/processors/h100).
* H100 NVL / H200 NVL -- NVIDIA H100 NVL and H200 NVL datasheets: BF16/FP16 1,671 TF*,
  FP8 3,341 TF*, TF32 835 TF*, FP32 60 TF. (Recalled from the datasheets; the stored
  pages searched held no copy of these two columns.)
* H100 PCIe -- NVIDIA H100 PCIe (80 GB) product brief / datasheet: BF16/FP16 1,513 TF*,
  FP8 3,026 TF*, TF32 756 TF*, FP32 51 TF.
* A100 -- NVIDIA A100 datasheet: BF16/FP16 312 TF (624*), TF32 156 TF (312*), FP32
  19.5 TF; no FP8.
* L40S -- NVIDIA L40S datasheet: BF16/FP16 362.05 TF (733*), FP8 733 TF (1,466*), TF32
  183 TF (366*), FP32 91.6 TF (table reproduced at mullet.se, product 355414).
* L4 -- NVIDIA L4 datasheet: FP16/BF16 242 TF*, FP8 485 TF*, TF32 120 TF*, FP32
  30.3 TF (figures quoted on store.sourcecode.com and grokipedia.com "NVIDIA L4 vs L40S").
* RTX 4090 -- NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 column,
  FP32 accumulation: FP16/BF16 165.2 TF (330.3*), FP8 330.3 TF (660.6*), TF32 82.6 TF,
  FP32 82.6 TF (waredb.com/processor/nvidia-geforce-rtx-4090).

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
     {"bf16": 362.05 * _T, "fp16": 362.05 * _T, "fp8": 733 * _T, "tf32": 183 * _T,
      "fp32": 91.6 * _T}),
    (("l4",), "L4",
     {"bf16": 121 * _T, "fp16": 121 * _T, "fp8": 242.5 * _T, "tf32": 60 * _T, "fp32": 30.3 * _T}),
    (("rtx 4090",), "RTX 4090",
     {"bf16": 165.2 * _T, "fp16": 165.2 * _T, "fp8": 330.3 * _T, "tf32": 82.6 * _T,
      "fp32": 82.6 * _T}),
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
