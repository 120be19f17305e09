"""``otelgpu demo``: real training and real serving under otelgpu, then the verdict and a report.

With no real GPU the simulated 8xH100 node is activated (``healthy-8xh100``, wall clock)
and faults are injected while the work runs: a thermal throttle on GPU 2 during training,
an XID 13 on GPU 5 during serving. Then, on CPU:

1. **training** (zero code: the training function below is plain PyTorch, otelgpu finds
   its steps, data wait and checkpoint by itself): a small MLP on a synthetic dataset
   whose items take a little time to load, a ``DataLoader`` with 2 worker processes,
   gradient accumulation over 2 micro-batches per optimizer step, a ``torch.save``
   checkpoint halfway;
2. **serving**: a tiny GPT-2 built from a config with ``transformers`` (random weights,
   nothing downloaded) generating tokens for concurrent requests on a thread pool, each
   request in ``otelgpu.request()`` (queue, first token from a streamer, output tokens,
   a few rejected requests).

At the end the recording is read back: the verdict card and the key figures are printed,
the self-contained HTML report is written next to the recording and its path printed.
Takes ``--seconds`` (default 16) plus the imports.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from otelgpu import environment_variables as ev
from otelgpu.commands import command_parser

DEFAULT_SCENARIO = "healthy-8xh100"
MODEL = "tiny-gpt2"
THROTTLED_GPU = 2
XID_GPU = 5


SUMMARY = "train and serve small real models under otelgpu, then show the verdict and report"
"""The line of ``otelgpu --help`` for this command."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = command_parser(subparsers, "demo", SUMMARY, __doc__)
    parser.add_argument(
        "--scenario",
        default=None,
        help=f"simulated-GPU scenario when there is no GPU (default {DEFAULT_SCENARIO})",
    )
    parser.add_argument(
        "--sim", action="store_true", help="use the simulated GPU even if a real one is present"
    )
    parser.add_argument(
        "--seconds", type=float, default=16.0, help="approximate work time (default 16)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed of the workload")
    parser.add_argument("--html", metavar="PATH", help="where to write the HTML report")
    parser.set_defaults(func=run)
    return parser


def real_nvml_present() -> bool:
    """True when a real NVIDIA driver library loads (without initialising it)."""
    if os.environ.get(ev.OTELGPU_SIM):
        return False
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def activate_sim(scenario: str, out: TextIO) -> Any:
    """Activate the simulated GPU in this process (wall clock); None if unavailable."""
    try:
        from otelgpu import sim

        handle = sim.activate(scenario, clock="wall")
    except Exception as exc:  # noqa: BLE001 - the demo still runs without GPU context
        print(f"  simulated GPU unavailable ({exc}); running without GPU context", file=out)
        return None
    print(f"  no GPU here: using the simulated GPU, scenario {scenario!r} (wall clock)", file=out)
    return handle


def _inject(sim_gpu: Any, out: TextIO, kind: str, **params: Any) -> None:
    if sim_gpu is None:
        return
    try:
        sim_gpu.inject(kind, **params)
        print(f"  injected fault: {kind} {params}", file=out)
    except Exception as exc:  # noqa: BLE001
        print(f"  could not inject {kind}: {exc}", file=out)


# --------------------------------------------------------------------------- training
def train(seconds: float, seed: int, checkpoint_dir: str, on_half: Callable[[], None]) -> int:
    """Plain PyTorch training (no otelgpu code): returns optimizer steps taken."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    class SlowDataset(Dataset[tuple[Any, Any]]):
        """Synthetic samples that take ~1 ms each to "load" (decode, augment…)."""

        def __len__(self) -> int:
            return 1 << 20

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            time.sleep(0.001)
            g = torch.Generator().manual_seed(i)
            x = torch.randn(128, generator=g)
            return x, int(x[:4].sum() > 0)

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(SlowDataset(), batch_size=32, num_workers=2, shuffle=False)
    accumulate = 2
    deadline = time.monotonic() + seconds
    halfway = time.monotonic() + seconds / 2
    steps = 0
    saved = False
    for i, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accumulate
        loss.backward()
        if (i + 1) % accumulate:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
        now = time.monotonic()
        if not saved and now > halfway:
            on_half()
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                os.path.join(checkpoint_dir, "checkpoint.pt"),
            )
            saved = True
        if now > deadline:
            break
    return steps


# --------------------------------------------------------------------------- serving
def build_model(seed: int) -> tuple[Any, int]:
    """A tiny causal LM (random weights, built from a config: nothing is downloaded)."""
    import torch

    torch.manual_seed(seed)
    try:
        import transformers

        hf: Any = transformers  # partly typed: used through Any
        hf.utils.logging.set_verbosity_error()
        config = hf.GPT2Config(
            vocab_size=1024, n_positions=256, n_embd=128, n_layer=2, n_head=4, bos_token_id=0,
            eos_token_id=0,
        )  # fmt: skip
        return hf.GPT2LMHeadModel(config).eval(), int(config.vocab_size)
    except ImportError:  # transformers missing: the same idea with torch alone
        return _TinyLM(1024).eval(), 1024


class _TinyLM:
    """Fallback when transformers is not installed: an embedding + GRU + head, greedy."""

    def __init__(self, vocab: int) -> None:
        from torch import nn

        self.net = nn.ModuleDict(
            {"emb": nn.Embedding(vocab, 128), "rnn": nn.GRU(128, 128, batch_first=True),
             "head": nn.Linear(128, vocab)}
        )  # fmt: skip

    def eval(self) -> _TinyLM:
        self.net.eval()
        return self

    def generate(self, input_ids: Any, max_new_tokens: int, streamer: Any, **kw: Any) -> Any:
        import torch

        streamer.put(input_ids)
        ids = input_ids
        hidden: Any = None
        x = ids
        for _ in range(max_new_tokens):
            states, hidden = self.net["rnn"](self.net["emb"](x), hidden)
            nxt = self.net["head"](states[:, -1]).argmax(-1, keepdim=True)
            streamer.put(nxt)
            ids = torch.cat([ids, nxt], dim=1)
            x = nxt
        streamer.end()
        return ids


class _Streamer:
    """A transformers-style streamer: the first ``put`` is the prompt, then one per token."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        if self.request.output_tokens == 0:
            self.request.first_token()
        self.request.tokens(int(value.numel()))

    def end(self) -> None:
        return None


def serve(seconds: float, seed: int, on_half: Callable[[], None], out: TextIO) -> dict[str, int]:
    """Concurrent generation requests against the tiny model; outcome counts."""
    import torch

    import otelgpu

    model, vocab = build_model(seed)
    slots = threading.Semaphore(2)  # the "engine" runs two requests at a time; others queue
    outcomes: dict[str, int] = {}
    lock = threading.Lock()
    running = threading.Event()  # set while a request generates: the fault lands inside one

    def one(i: int, rng: random.Random) -> None:
        with otelgpu.request(model=MODEL, operation="text_completion") as r:
            prompt = rng.randint(8, 48)
            r.input_tokens(prompt)
            if rng.random() < 0.04:  # admission control: not enough KV-cache blocks
                r.error("kv_cache_exhausted")
                outcome = "error"
            else:
                with slots:
                    r.scheduled()
                    running.set()
                    ids = torch.randint(
                        1, vocab, (1, prompt), generator=torch.Generator().manual_seed(i)
                    )
                    with torch.no_grad():
                        model.generate(
                            ids,
                            attention_mask=torch.ones_like(ids),
                            max_new_tokens=rng.randint(8, 32),
                            do_sample=False,
                            pad_token_id=0,
                            streamer=_Streamer(r),
                        )
                outcome = "ok"
        with lock:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    halfway = time.monotonic() + seconds / 2
    fired = False
    i = 0
    with ThreadPoolExecutor(max_workers=6, thread_name_prefix="demo-request") as pool:
        while time.monotonic() < deadline:
            burst = rng.randint(3, 8)
            futures = [pool.submit(one, i + k, random.Random(rng.random())) for k in range(burst)]
            i += burst
            if not fired and time.monotonic() > halfway:
                # Between bursts no request runs: wait for one of this burst to start
                # generating, so the injected fault happens during (and is on) a request.
                running.clear()
                running.wait(timeout=1.0)
                on_half()
                fired = True
            for f in futures:
                f.result()
            time.sleep(rng.uniform(0.02, 0.15))
    return outcomes


# --------------------------------------------------------------------------- the demo
def sketch_speed(n: int = 100_000) -> tuple[float, float | None]:
    """ns per ``add`` for the pure-Python sketch and the native one (None if not built)."""
    from otelgpu import _impl
    from otelgpu.sketch import PyQuantileSketch

    values = [random.Random(3).lognormvariate(-4, 1) for _ in range(n)]

    def per_add(cls: Any) -> float:
        sketch = cls(relative_accuracy=0.01)
        add = sketch.add
        t0 = time.perf_counter_ns()
        for v in values:
            add(v)
        return (time.perf_counter_ns() - t0) / n

    pure = per_add(PyQuantileSketch)
    native_mod = None if _impl.NO_EXTENSIONS else _impl.native_module("otelgpu.sketch._sketch_c")
    native = per_add(native_mod.QuantileSketch) if native_mod is not None else None
    return pure, native


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import otelgpu
    from otelgpu import _runtime

    out = out or sys.stdout
    try:
        import torch
    except ImportError:
        print(
            "otelgpu demo needs PyTorch (pip install torch; `make demo` installs it)",
            file=sys.stderr,
        )
        return 1
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    print("otelgpu demo", file=out)
    sim_gpu = None
    if args.sim or not real_nvml_present():
        sim_gpu = activate_sim(args.scenario or DEFAULT_SCENARIO, out)
    else:
        print("  real NVIDIA driver found: sampling the real GPU", file=out)

    # The demo's model trains on the CPU: on the simulated node its steps stand for a job
    # on all eight GPUs (on a real GPU, the default ``auto`` finds the devices torch uses).
    settings: dict[str, Any] = {"step_devices": "all"} if sim_gpu is not None else {}
    handle = otelgpu.instrument(
        service_name=os.environ.get("OTEL_SERVICE_NAME") or "otelgpu-demo",
        metric_export_interval_ms=1000,
        frameworks="torch",
        **settings,
    )
    runtime = _runtime.current()
    if runtime is None:
        print("  otelgpu is disabled (OTEL_SDK_DISABLED / OTELGPU_DISABLED)", file=out)
        return 0
    sampler = runtime.sampler
    devices = getattr(sampler, "devices", ()) if sampler is not None else ()
    print(f"  sampling {len(devices)} GPU(s): {devices[0].name if devices else 'none'}", file=out)
    out.flush()

    train_s = args.seconds * 0.55
    serve_s = args.seconds * 0.45
    print(
        f"  training a small MLP for {train_s:.0f} s "
        "(DataLoader, 2 workers, grad accumulation, checkpoint) …",
        file=out,
    )
    out.flush()
    with tempfile.TemporaryDirectory(prefix="otelgpu-demo-") as ckpt:
        steps = train(
            train_s,
            args.seed,
            ckpt,
            lambda: _inject(
                sim_gpu, out, "throttle", gpu=THROTTLED_GPU, reason="hw_thermal", duration_s=4
            ),
        )
    print(
        f"  {steps} optimizer steps; serving {MODEL} "
        f"(transformers, random weights) for {serve_s:.0f} s …",
        file=out,
    )
    out.flush()
    outcomes = serve(
        serve_s, args.seed, lambda: _inject(sim_gpu, out, "xid", gpu=XID_GPU, code=13), out
    )
    time.sleep(0.3)  # the XID waiter and the sampler deliver late events
    health = runtime.health_counts()
    recording = handle.recording_path
    exporters = ", ".join(handle.settings.exporters) or "none"
    handle.shutdown()  # final flush: the recording now holds the whole run
    print(
        f"  served {sum(outcomes.values())} requests "
        f"({', '.join(f'{n} {k}' for k, n in sorted(outcomes.items()))})",
        file=out,
    )
    print(f"  GPU health events seen live: {sum(health.values())}", file=out)

    print("", file=out)
    if recording is not None and recording.exists():
        _report(recording, args, out)
    else:
        print(f"telemetry went to: {exporters} (no local recording to report on)", file=out)

    pure, native = sketch_speed()
    if native is not None:
        print(
            f"\nsketch add(): native {native:.0f} ns, pure Python {pure:.0f} ns "
            f"({pure / native:.0f}x faster native)",
            file=out,
        )
    else:
        print(f"\nsketch add(): pure Python {pure:.0f} ns (native core not built)", file=out)
    if sim_gpu is not None:
        with contextlib.suppress(Exception):
            sim_gpu.deactivate()
    return 0


def _report(recording: Path, args: argparse.Namespace, out: TextIO) -> None:
    from otelgpu.report import analysis, model, text

    run = model.load([recording])
    text.verdict_card(run, out)
    t = analysis.training(run)
    if t is not None and t.step_quantiles:
        print(
            f"  training   {t.steps} steps, "
            f"step time {analysis.fmt_quantiles(t.step_quantiles, 's')}",
            file=out,
        )
    i = analysis.inference(run)
    if i is not None and i.latency:
        print(
            f"  serving    {i.requests} requests, latency {analysis.fmt_quantiles(i.latency, 's')}",
            file=out,
        )
        if i.ttft:
            print(
                f"             time to first token {analysis.fmt_quantiles(i.ttft, 's')}", file=out
            )
    print(f"\n  recording  {recording}", file=out)
    print(f"  full text  otelgpu report {recording}", file=out)
    html_path = Path(args.html) if args.html else recording.with_suffix("").with_suffix(".html")
    try:
        from otelgpu.report import html

        html_path.write_text(html.render(run), encoding="utf-8")
        print(f"  HTML report {html_path.resolve()}", file=out)
    except RuntimeError as exc:  # plotly not installed
        print(f"  HTML report not written: {exc}", file=out)
