"""Shared benchmark harness: one CSV schema, the copy-bandwidth ceiling, tables and plots.

Every ``scripts/bench_*.py`` builds :class:`Row` objects and hands them to
:func:`finish`, which prints a table, writes ``<out>/<name>.csv`` and, when
matplotlib is importable, ``<out>/<name>.png``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
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


def bench_ms(fn: Callable[[], object], quick: bool = False, grad_to_none: Sequence[torch.Tensor] | None = None) -> float:
    """Median milliseconds of ``fn`` with triton.testing.do_bench (CUDA events, L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10 if quick else 25, rep=30 if quick else 100, grad_to_none=grad_to_none,
                          return_mode="median"))


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


def write_csv(rows: list[Row], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(Row)])
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


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


def finish(rows: list[Row], copy_gbps: float, out: str | os.PathLike, name: str, title: str) -> None:
    fill(rows, copy_gbps)
    out = Path(out)
    write_csv(rows, out / f"{name}.csv")
    plot(rows, out / f"{name}.png", title)
    print_table(rows, copy_gbps)
    print(f"csv: {out / f'{name}.csv'}")


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
