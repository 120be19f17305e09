"""Run every benchmark in one go (``make bench``); each writes benchmarks/results/<name>.md.

``python benchmarks/run_all.py [NAME ...]`` runs only the named ones (e.g. ``bench_export``).

Benchmarks are timings, so CI never runs them; the test suite checks correctness only.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
BENCHES: list[list[str]] = [
    ["bench_sketch.py"],
    ["bench_sampler.py", "--repeat", "7"],
    ["bench_pipeline.py"],
    ["bench_torch.py"],
    ["bench_torch.py", "--export", "{tmp}"],  # results/torch-export.md
    ["bench_vllm.py"],
    ["bench_diagnosis.py"],
    ["bench_export.py"],
    ["bench_instructions.py"],  # needs valgrind
    ["bench_gpu_collection.py"],
]


def main(only: list[str]) -> int:
    wanted = {n.removesuffix(".py") for n in only}
    failed = []
    with tempfile.TemporaryDirectory(prefix="otelgpu-bench-") as tmp:
        for name, *args in BENCHES:
            path = HERE / name
            if not path.exists() or (wanted and path.stem not in wanted):
                continue
            argv = [a.format(tmp=tmp) for a in args]
            label = " ".join([name, *argv])
            print(f"\n=== {label} ===", flush=True)
            t0 = time.perf_counter()
            rc = subprocess.call([sys.executable, str(path), *argv])
            print(f"--- {label}: exit {rc} in {time.perf_counter() - t0:.1f} s", flush=True)
            if rc:
                failed.append(label)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
