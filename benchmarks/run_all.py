"""Run every benchmark in one go (``make bench``); each writes benchmarks/results/<name>.md.

Benchmarks are timings, so CI never runs them; the test suite checks correctness only.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = [
    "bench_sketch.py",
    "bench_sampler.py",
    "bench_pipeline.py",
    "bench_torch.py",
    "bench_vllm.py",
    "bench_diagnosis.py",
]


def main() -> int:
    failed = []
    for name in BENCHES:
        path = HERE / name
        if not path.exists():
            continue
        print(f"\n=== {name} ===", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(path)])
        print(f"--- {name}: exit {rc} in {time.perf_counter() - t0:.1f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
