"""Shared benchmark harness: one timer, one result schema, the copy-bandwidth ceiling, tables and plots.

Every ``scripts/bench_*.py`` writes its results with :func:`write_rows`: ``<out>/<name>.csv`` and
``<out>/<name>.jsonl`` (one JSON object per row), each row carrying the common fields :data:`COMMON`
(``gpu``, ``date``, ``command``, ``torch``, ``triton``) beside its own columns. The kernel benchmarks build
:class:`Row` objects and hand them to :func:`finish`, which also prints a table and, when matplotlib is
importable, writes ``<out>/<name>.png``. CUDA-graph timings go through :func:`graph_ms`. The registered
benchmarks are listed in ``scripts/benchmarks.py``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

FIELDS_DOC = """
benchmark  which script and case (e.g. neurons/tutorial)
op         what is timed (lif, layer_norm, giou ...)
mode       fwd | bwd | fwd+bwd
provider   implementation (ours-triton, torch, spikingjelly-triton, ...)
dtype      input dtype
shape      the case's shape, as text
ms         median time in milliseconds (triton.testing.do_bench)
bytes      minimal bytes moved by the timed region (the roofline numerator)
gbps       bytes / time
copy_gbps  device-to-device copy bandwidth measured in the same process
roofline   (bytes / copy_gbps) / time: 1.0 means at the copy ceiling
gpu        device name
date       ISO date of the run
note       remarks (e.g. "eager timing (...)" where a CUDA graph could not be captured)
command    the command line of the run
torch      torch version
triton     triton version
"""


@dataclass
class Row:
    benchmark: str
    op: str
    mode: str
    provider: str
    dtype: str
    shape: str
    ms: float
    bytes: int
    gbps: float = 0.0
    copy_gbps: float = 0.0
    roofline: float = 0.0
    gpu: str = ""
    date: str = ""
    note: str = ""


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=os.environ.get("OUT", "bench_results"), help="folder for CSV and plot")
    p.add_argument("--quick", action="store_true", help="fewer shapes and repetitions (smoke test)")
    if extra is not None:
        extra(p)
    return p.parse_args()


def device() -> torch.device:
    if not torch.cuda.is_available():
        sys.exit("benchmarks need a CUDA GPU")
    return torch.device("cuda")


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def capture(calls: Sequence[Callable[[], object]], stream: torch.cuda.Stream | None = None,
            warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, list]:
    """``calls`` run ``warmup`` times on ``stream`` (a new side stream when None: compilation, lazily built backward
    graphs, the allocator), then captured once, in order, in one CUDA graph on the same stream. Returns the graph
    and the calls' outputs (keep them alive while replaying, so each call writes its own memory)."""
    if stream is None:
        stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = [c() for c in calls]
    torch.cuda.synchronize()
    return graph, outs


def graph_ms(calls: Callable[[], object] | Sequence[Callable[[], object]], quick: bool = False,
             stream: torch.cuda.Stream | None = None, warmup: int = 3,
             timer: Callable[[Callable[[], object]], float] | None = None) -> tuple[float, str]:
    """Milliseconds per call of ``calls`` (one callable or several) captured in one CUDA graph and replayed:
    the GPU time without the host's launch cost. Returns ``(ms, note)``.

    The calls are captured by :func:`capture` (``warmup`` runs on ``stream`` first), every output kept alive until
    the timing ends. The replays are timed by ``timer`` (default :func:`bench_ms` with ``quick``) and divided by
    the number of calls. If the calls cannot be captured (a provider that synchronises with the host, or no CUDA),
    they are timed eagerly the same way and ``note`` says so (``"eager timing (<error>)"``); otherwise ``note``
    is empty."""
    calls = [calls] if callable(calls) else list(calls)
    if not calls:
        raise ValueError("graph_ms needs at least one call to time, got none")
    if timer is None:
        def timer(fn: Callable[[], object]) -> float:
            return bench_ms(fn, quick)
    try:
        graph, outs = capture(calls, stream, warmup)
    except Exception as err:  # noqa: BLE001 - time it eagerly instead, and say so in the note
        if torch.cuda.is_available():
            torch.cuda.synchronize()

        def run() -> None:
            for c in calls:
                c()

        return timer(run) / len(calls), f"eager timing ({type(err).__name__})"
    ms = timer(graph.replay) / len(calls)
    del graph, outs
    return ms, ""


def bench_ms(fn: Callable[[], object], quick: bool = False, grad_to_none: Sequence[torch.Tensor] | None = None) -> float:
    """Median milliseconds of ``fn`` with triton.testing.do_bench (CUDA events, L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10 if quick else 25, rep=30 if quick else 100, grad_to_none=grad_to_none,
                          return_mode="median"))


def peak_mib(fn: Callable[[], object]) -> float:
    """MiB that one call of ``fn`` allocates at its peak above what was allocated before it (after a
    synchronisation, so earlier work's memory is settled)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """GB/s of ``x.clone()`` on a ``nbytes`` tensor, counting bytes read plus written."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    ms = bench_ms(lambda: x.clone())
    x = None  # (not del: the lambda refers to it)
    torch.cuda.empty_cache()
    return 2 * nbytes / ms / 1e6


def fill(rows: list[Row], copy_gbps: float) -> None:
    date = _dt.date.today().isoformat()
    name = gpu_name()
    for r in rows:
        r.gbps = r.bytes / r.ms / 1e6 if r.ms > 0 else 0.0
        r.copy_gbps = copy_gbps
        r.roofline = (r.bytes / copy_gbps / 1e6) / r.ms if r.ms > 0 and copy_gbps > 0 else 0.0
        r.gpu, r.date = name, date


def print_table(rows: list[Row], copy_gbps: float) -> None:
    print(f"\nGPU: {gpu_name()}   copy bandwidth: {copy_gbps:.0f} GB/s   date: {_dt.date.today().isoformat()}")
    cols = ["benchmark", "mode", "dtype", "shape", "provider", "ms", "gbps", "roofline", "note"]
    table = [[r.benchmark, r.mode, r.dtype, r.shape, r.provider, f"{r.ms:.4f}", f"{r.gbps:.0f}", f"{r.roofline:.2f}",
              r.note] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) if table else len(c) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)))
    sys.stdout.flush()


#: the fields every result row carries beside its own columns (see :func:`write_rows`)
COMMON = ("gpu", "date", "command", "torch", "triton")


def run_info() -> dict[str, str]:
    """The common fields of this run: the device, the ISO date, the command line and the versions."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = ""
    return {"gpu": gpu_name(), "date": _dt.date.today().isoformat(),
            "command": shlex.join(["python", *sys.argv]), "torch": torch.__version__, "triton": triton_version}


def as_dicts(rows: Sequence[Row | dict], **common: object) -> list[dict]:
    """``rows`` (:class:`Row` or dicts) as dicts in the one result schema: each row's own columns, then the
    common fields (:func:`run_info`, updated with ``common``) it does not set itself."""
    info = {**run_info(), **common}
    out = []
    for r in rows:
        d = asdict(r) if isinstance(r, Row) else dict(r)
        for k, v in info.items():
            if d.get(k) in (None, ""):
                d[k] = v
        out.append(d)
    return out


def append_row(row: Row | dict, out: str | os.PathLike, name: str, **common: object) -> None:
    """Append one row to ``<out>/<name>.jsonl`` as it is measured (a run cut short keeps what it had);
    :func:`write_rows` at the end rewrites the file with every row of the run."""
    path = Path(out) / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(as_dicts([row], **common)[0], default=str) + "\n")


def write_rows(rows: Sequence[Row | dict], out: str | os.PathLike, name: str, **common: object) -> tuple[Path, Path]:
    """Write ``rows`` to ``<out>/<name>.csv`` and ``<out>/<name>.jsonl`` in the one result schema
    (:func:`as_dicts`; extra keyword arguments are common fields of this run, e.g. ``gpus=2``). The CSV's
    columns are every row's columns in order of first appearance; lists and dicts are written as JSON text."""
    dicts = as_dicts(rows, **common)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, jsonl_path = out / f"{name}.csv", out / f"{name}.jsonl"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for d in dicts for k in d)))
        w.writeheader()
        for d in dicts:
            w.writerow({k: json.dumps(v, default=str) if isinstance(v, (list, dict)) else v for k, v in d.items()})
    with open(jsonl_path, "w") as f:
        for d in dicts:
            f.write(json.dumps(d, default=str) + "\n")
    return csv_path, jsonl_path


def plot(rows: list[Row], path: Path, title: str) -> None:
    """One panel per (benchmark, mode, dtype): GB/s per provider over the shapes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    panels = sorted({(r.benchmark, r.mode, r.dtype) for r in rows})
    if not panels:
        return
    ncol = min(3, len(panels))
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.5 * ncol, 3.6 * nrow), squeeze=False)
    for ax, (bench, mode, dtype) in zip(axes.flat, panels):
        sub = [r for r in rows if (r.benchmark, r.mode, r.dtype) == (bench, mode, dtype)]
        shapes = list(dict.fromkeys(r.shape for r in sub))
        for prov in dict.fromkeys(r.provider for r in sub):
            pts = {r.shape: r.gbps for r in sub if r.provider == prov}
            xs = [i for i, s in enumerate(shapes) if s in pts]
            ax.plot(xs, [pts[shapes[i]] for i in xs], marker="o", label=prov)
        if sub:
            ax.axhline(sub[0].copy_gbps, color="grey", linestyle="--", linewidth=1, label="copy bandwidth")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("GB/s")
        ax.set_title(f"{bench} {mode} {dtype}", fontsize=9)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{title} on {gpu_name()}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def finish(rows: list[Row], copy_gbps: float, out: str | os.PathLike, name: str, title: str,
           extra: Sequence[dict] | None = None) -> None:
    """Fill in the rows' bandwidths, device and date, write them (:func:`write_rows`; ``extra[i]``: more columns
    of ``rows[i]``, after the :class:`Row` ones, which keep their values), plot them and print a table."""
    if extra is not None and len(extra) != len(rows):
        raise ValueError(f"extra needs one dict per row: got {len(extra)} for {len(rows)} rows")
    fill(rows, copy_gbps)
    out = Path(out)
    written: list[Row | dict] = list(rows)
    if extra is not None:
        written = [{**asdict(r), **{k: v for k, v in e.items() if k not in asdict(r)}} for r, e in zip(rows, extra)]
    csv_path, jsonl_path = write_rows(written, out, name)
    plot(rows, out / f"{name}.png", title)
    print_table(rows, copy_gbps)
    print(f"csv: {csv_path}  jsonl: {jsonl_path}")


# ----------------------------------------------------------------------------- peer worker processes


def worker_result(path: Path) -> tuple[dict, Callable[[], None]]:
    """What a peer's worker process (e.g. SpikingJelly, which picks its kernels at import) leaves for
    its parent in ``path``: ``rows`` (``asdict`` of :class:`Row`), ``skipped`` and ``error``, rewritten
    atomically by the returned ``save()`` after every change, so a worker stopped at the time budget
    keeps what it measured."""
    result: dict = {"rows": [], "skipped": [], "error": None}

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(path)

    return result, save


def run_worker(script: str | os.PathLike, label: str, worker_args: Sequence[str], env: dict[str, str], quick: bool,
               deadline: float, out: Path, name: str, skipped: list[str]) -> list[Row]:
    """Run ``script`` with ``worker_args`` (its worker mode) in a child process with ``env`` until
    ``deadline`` (``time.time()``), and return the rows it left in ``<out>/.<name>-<label>.json``
    (see :func:`worker_result`); its failures and skipped cases go to ``skipped``, prefixed ``label``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f".{name}-{label}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(script).resolve()), *worker_args, "--worker-out", str(path), "--out", str(out)]
    if quick:
        cmd.append("--quick")
    left = deadline - time.time()
    if left < 20:
        skipped.append(f"{label}: out of time budget")
        return []
    try:
        proc = subprocess.run(cmd, env=env, timeout=left, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            skipped.append(f"{label}: child exited with {proc.returncode}: {' | '.join(tail)}")
    except subprocess.TimeoutExpired:
        skipped.append(f"{label}: stopped at the time budget; kept the rows it had")
    if not path.exists():
        return []
    result = json.loads(path.read_text())
    path.unlink(missing_ok=True)
    if result["error"]:
        skipped.append(f"{label}: {result['error']}")
    skipped += result["skipped"]
    return [Row(**r) for r in result["rows"]]
