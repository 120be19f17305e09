"""The terminal view of live snapshots: a redrawn dashboard on a TTY, plain lines otherwise.

Why ``rich``: a maintained console library that redraws a region in place with cursor
movement only (no alternate screen, no curses terminfo dependence), so it works over SSH,
in tmux and in CI logs; it degrades by itself when the terminal is dumb. Without ``rich``
(or with ``--plain``, or when stdout is not a TTY) the view prints one plain line per
process per refresh, and one line per GPU health event as it arrives.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

Snapshot = dict[str, Any]
_Part = tuple[str, str, float]  # a key of the recent window, its format, a scale

_THROUGHPUT: tuple[_Part, ...] = (
    ("samples_per_s", "{:,.0f} samples/s", 1),
    ("tokens_per_s", "{:,.0f} tokens/s", 1),
)
_COMPUTE: tuple[_Part, ...] = (
    ("mfu", "MFU {:.1f} %", 100),
    ("tensor_activity", "tensor {:.0f} %", 100),
)


def _ms(v: Any) -> str:
    return "n/a" if not isinstance(v, int | float) else f"{v * 1e3:.1f} ms"


def _pct(v: Any) -> str:
    return "n/a" if not isinstance(v, int | float) else f"{v * 100:.0f} %"


def _gib(v: Any) -> str:
    return "n/a" if not isinstance(v, int | float) else f"{v / 2**30:.1f}"


def _uptime(doc: Snapshot) -> str:
    s = max(0, int((doc.get("time_unix_nano", 0) - doc.get("started_unix_nano", 0)) / 1e9))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _clock(ns: Any) -> str:
    return (
        time.strftime("%H:%M:%S", time.localtime(ns / 1e9)) if isinstance(ns, int) else "--:--:--"
    )


# --------------------------------------------------------------------------- plain lines
def plain_lines(doc: Snapshot) -> list[str]:
    """One line summarising a snapshot (plus nothing else: events are printed separately)."""
    parts = [f"{_clock(doc.get('time_unix_nano'))} pid={doc.get('pid')} up={_uptime(doc)}"]
    train = doc.get("train")
    if train:
        recent = train.get("recent") or {}
        q = train.get("step_time_s") or {}
        text = (
            f"steps={train.get('steps', 0)} "
            f"step_p50={_ms(q.get('p50'))} step_p99={_ms(q.get('p99'))}"
        )
        if "samples_per_s" in recent:
            text += f" samples/s={recent['samples_per_s']:.0f}"
        if recent.get("phases"):
            text += " phases=" + ",".join(
                f"{p}:{s * 100:.0f}%"
                for p, s in sorted(recent["phases"].items(), key=lambda kv: -kv[1])
            )
        if "mfu" in recent:
            text += f" mfu={recent['mfu'] * 100:.1f}%"
        parts.append(text)
    inference = doc.get("inference")
    if inference:
        recent = inference.get("recent") or {}
        lat = inference.get("latency_s") or {}
        ttft = inference.get("ttft_s") or {}
        text = (
            f"requests={inference.get('requests', 0)} "
            f"p50={_ms(lat.get('p50'))} p99={_ms(lat.get('p99'))}"
            f" ttft_p99={_ms(ttft.get('p99'))}"
        )
        if recent:
            text += (
                f" rps={recent.get('requests_per_s', 0):.1f}"
                f" errors={_pct(recent.get('error_rate'))}"
                f" queue_p50={_ms(recent.get('queue_p50_s'))}"
            )
        parts.append(text)
    for g in doc.get("gpus") or ():
        text = (
            f"gpu{g.get('index')} util={_pct(g.get('utilization'))}"
            f" mem={_gib(g.get('memory_used_bytes'))}/{_gib(g.get('memory_total_bytes'))}GiB"
            f" power={g.get('power_w') or 0:.0f}W temp={g.get('temperature_c')}C"
        )
        if g.get("tensor_activity") is not None:
            text += f" tensor={_pct(g['tensor_activity'])}"
        if g.get("throttle_reasons"):
            text += " throttle=" + ",".join(g["throttle_reasons"])
        if g.get("lost"):
            text += " LOST"
        parts.append(text)
    return [" | ".join(parts)]


def event_line(doc: Snapshot, event: dict[str, Any]) -> str:
    gpus = {g.get("uuid"): g.get("index") for g in doc.get("gpus") or ()}
    where = f"gpu{gpus[event['uuid']]}" if event.get("uuid") in gpus else event.get("uuid", "")
    return (
        f"{_clock(event.get('time_unix_nano'))} EVENT {event.get('kind')} {where} "
        f"{event.get('detail', '')} (pid {doc.get('pid')})"
    )


# --------------------------------------------------------------------------- rich
def _bar(fraction: Any, width: int = 12) -> str:
    if not isinstance(fraction, int | float):
        return " " * width
    n = max(0, min(width, round(fraction * width)))
    return "█" * n + "░" * (width - n)


def _parts_row(grid: Any, label: str, values: Mapping[str, Any], parts: Sequence[_Part]) -> None:
    """One row ``label`` of the ``parts`` that ``values`` holds, or none if it holds none.

    A part is (key, format, scale): ``values[key] * scale`` formatted."""
    shown = [fmt.format(values[key] * scale) for key, fmt, scale in parts if key in values]
    if shown:
        grid.add_row(label, "  ".join(shown))


def _section(doc: Snapshot, key: str, title: str, color: str, empty: str) -> Any:
    """A panel of ``doc[key]``'s rows (labels in ``color``), or a dim ``empty`` line."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style=f"bold {color}", no_wrap=True)
    grid.add_column(no_wrap=True)
    data = doc.get(key)
    if data:
        _ROWS[key](grid, data)
    else:
        grid.add_row(title, Text(empty, style="dim"))
    return Panel(grid, title=title, border_style=color)


def _training(left: Any, train: Mapping[str, Any]) -> None:
    """The training panel's rows: steps, step time, throughput, phase shares, MFU."""
    from rich.text import Text

    recent = train.get("recent") or {}
    q = train.get("step_time_s") or {}
    left.add_row("steps", f"{train.get('steps', 0):,}   last {_ms(recent.get('last_s'))}")
    left.add_row("step time", f"p50 {_ms(q.get('p50'))}  p99 {_ms(q.get('p99'))}")
    if recent:
        left.add_row(
            "last 10 s",
            f"p50 {_ms(recent.get('p50_s'))}  p99 {_ms(recent.get('p99_s'))}  "
            f"{recent.get('steps_per_s', 0):.1f} steps/s",
        )
    _parts_row(left, "throughput", recent, _THROUGHPUT)
    phases = sorted((recent.get("phases") or {}).items(), key=lambda kv: -kv[1])
    for phase, share in phases:
        if share >= 0.005:  # a phase that took no time is noise here
            left.add_row(
                f"  {phase}",
                Text.assemble((_bar(share, 20), "cyan"), f" {share * 100:4.0f} %"),
            )
    _parts_row(left, "compute", recent, _COMPUTE)


def _inference(right: Any, inference: Mapping[str, Any]) -> None:
    """The inference panel's rows: requests, latency, TTFT, queue, errors, output rate."""
    from rich.text import Text

    recent = inference.get("recent") or {}
    lat = inference.get("latency_s") or {}
    ttft = inference.get("ttft_s") or {}
    right.add_row(
        "requests",
        f"{inference.get('requests', 0):,}   {recent.get('requests_per_s', 0):.1f} req/s",
    )
    right.add_row("latency", f"p50 {_ms(lat.get('p50'))}  p99 {_ms(lat.get('p99'))}")
    right.add_row("TTFT", f"p50 {_ms(ttft.get('p50'))}  p99 {_ms(ttft.get('p99'))}")
    if recent:
        rate = recent.get("error_rate") or 0
        right.add_row("queue", f"p50 {_ms(recent.get('queue_p50_s'))}")
        right.add_row(
            "errors",
            Text(f"{rate * 100:.1f} % (last 10 s)", style="bold red" if rate >= 0.05 else ""),
        )
        right.add_row("output", f"{recent.get('output_tokens_per_s', 0):,.0f} tokens/s")


_ROWS: dict[str, Callable[[Any, Mapping[str, Any]], None]] = {
    "train": _training,
    "inference": _inference,
}


def render(docs: Sequence[Snapshot], title: str, events: Sequence[str]) -> Any:
    """A ``rich`` renderable of the snapshots (one or more processes)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    blocks: list[Any] = []
    for doc in docs:
        top = Table.grid(expand=True, padding=(0, 4))
        top.add_column(ratio=1)
        top.add_column(ratio=1)
        top.add_row(
            _section(doc, "train", "training", "cyan", "no steps yet"),
            _section(doc, "inference", "inference", "magenta", "no requests yet"),
        )
        gpus = Table(expand=True, box=None, padding=(0, 1), header_style="bold")
        for name, justify in (
            ("GPU", "right"),
            ("name", "left"),
            ("util", "left"),
            ("tensor", "right"),
            ("memory GiB", "right"),
            ("power", "right"),
            ("temp", "right"),
            ("clocks", "left"),
        ):
            gpus.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for g in doc.get("gpus") or ():
            util = g.get("utilization")
            reasons = g.get("throttle_reasons") or []
            temp = g.get("temperature_c")
            gpus.add_row(
                str(g.get("index")),
                str(g.get("name", "")).replace("NVIDIA ", ""),
                Text.assemble((_bar(util), "green"), f" {_pct(util):>5}"),
                _pct(g.get("tensor_activity")) if g.get("tensor_activity") is not None else "-",
                f"{_gib(g.get('memory_used_bytes'))}/{_gib(g.get('memory_total_bytes'))}",
                f"{g.get('power_w') or 0:.0f} W",
                Text(
                    f"{temp} °C", style="bold red" if isinstance(temp, int) and temp >= 85 else ""
                ),
                Text("LOST", style="bold red")
                if g.get("lost")
                else Text(",".join(reasons), style="bold yellow")
                if reasons
                else Text("ok", style="green"),
            )
        head = Text.assemble(
            (f"pid {doc.get('pid')}", "bold"),
            f"  {doc.get('service') or ''}  up {_uptime(doc)}",
        )
        blocks.append(Group(head, top, Panel(gpus, title="GPUs", border_style="blue")))
    if not docs:
        blocks.append(Text("waiting for an instrumented process…", style="dim"))
    ev = Text(
        "\n".join(events[-6:]) if events else "none so far", style="yellow" if events else "dim"
    )
    blocks.append(Panel(ev, title="GPU health events", border_style="yellow"))
    return Panel(Group(*blocks), title=title, border_style="bold")


# --------------------------------------------------------------------------- the loop
class View:
    """Polls ``fetch()`` every ``interval_s`` and shows the snapshots until ``done()``."""

    def __init__(
        self,
        fetch: Callable[[], list[Snapshot]],
        *,
        out: TextIO,
        interval_s: float = 1.0,
        plain: bool | None = None,
        title: str = "otelgpu top",
    ) -> None:
        self.fetch = fetch
        self.out = out
        self.interval_s = interval_s
        isatty = getattr(out, "isatty", lambda: False)()
        if plain is None:
            plain = not isatty
        if not plain:
            try:
                import rich  # noqa: F401
            except ImportError:
                plain = True
        self.plain = plain
        self.title = title
        self.events: list[str] = []
        self._seen: set[tuple[Any, ...]] = set()
        self.last: list[Snapshot] = []
        self._live: Any = None
        self._console: Any = None

    def _new_events(self, docs: Iterable[Snapshot]) -> list[str]:
        fresh = []
        for doc in docs:
            for e in doc.get("events") or ():
                key = (doc.get("pid"), e.get("time_unix_nano"), e.get("kind"), e.get("uuid"))
                if key not in self._seen:
                    self._seen.add(key)
                    fresh.append(event_line(doc, e))
        self.events.extend(fresh)
        del self.events[:-200]
        return fresh

    def echo(self, line: str) -> None:
        """Print a line above the dashboard (e.g. the child's output)."""
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.out, flush=True)

    def __enter__(self) -> View:
        if not self.plain:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.out)
            self._live = Live(
                render([], self.title, []),
                console=self._console,
                auto_refresh=False,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def tick(self) -> list[Snapshot]:
        """Fetch once and show it."""
        docs = self.fetch()
        if docs:
            self.last = docs
        fresh = self._new_events(docs)
        if self._live is not None:
            for line in fresh:
                self._live.console.print(line, style="yellow", markup=False, highlight=False)
            self._live.update(render(self.last, self.title, self.events), refresh=True)
        else:
            for line in fresh:
                print(line, file=self.out)
            for doc in docs:
                for line in plain_lines(doc):
                    print(line, file=self.out)
            self.out.flush()
        return docs

    def loop(self, done: Callable[[], bool], max_ticks: int | None = None) -> None:
        ticks = 0
        while True:
            start = time.monotonic()
            self.tick()
            ticks += 1
            if done() or (max_ticks is not None and ticks >= max_ticks):
                return
            while time.monotonic() - start < self.interval_s:
                if done():
                    break
                time.sleep(0.05)
