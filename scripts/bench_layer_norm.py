"""Layer-norm benchmark: ours (Triton) against torch.nn.functional.layer_norm and torch.compile of it.

    python scripts/bench_layer_norm.py --out DIR [--budget SECONDS] [--no-compile] [--no-sweep]
    python scripts/bench_layer_norm.py --out DIR --focus      # the missed shapes + the sweep, fp16, < 1 minute
    python scripts/bench_layer_norm.py --out DIR --quick      # smoke run
    python scripts/bench_layer_norm.py --out DIR --dry-run    # no GPU: tiny shapes in Triton's interpreter, fake times

Sections (fp16 in full; bf16 for ours and torch; fp32 on a few shapes):

  a  rows [M, N], M = 4096, N = 512 ... 16384
  b  conv features as rows [T*B*H*W, C] = [4*32*56*56, C], C = 32 ... 512
  c  channels-first [T, B, C, H, W] with T = 4, B = 32 at the SEW-ResNet stage shapes:
     ours in place against permute + F.layer_norm + permute (``torch-permute``: the
     result left as a channels-last view; ``torch-permute-copy``: made contiguous again)
     and torch.compile of the latter.

Reference providers, fp16, every shape:

  same-bytes  one PyTorch kernel that moves the same bytes as the mode: ``x.clone()`` for
              fwd (read x, write y), ``torch.add(x, dy)`` for bwd (read x and dy, write dx).
              It is what a single memory-bound kernel reaches at this size, launch and
              ramp-up included: the practical ceiling where the problem is small.
  ours-op     bwd only: the backward op called directly (kernels only, no autograd).
  ours-dx     bwd only: the same without dW/dB (the main kernel alone, no partial sums,
              no finishing sum).

Timing: every call is captured in one CUDA graph together with calls on other copies
of the inputs (so a replay moves >= 160 MB and no call finds its inputs in L2), the
replays are timed with triton.testing.do_bench (median, L2 flushed before each replay)
and divided by the number of calls. The graph removes Python launch overhead from
every provider alike. If a provider cannot be captured it is timed eagerly (noted).

Bytes (the roofline numerator, parameters ignored): fwd = read x + write y;
bwd = read x and dy + write dx + read mean and rstd (8 bytes per row);
fwd+bwd = the sum. ``roofline`` = achieved GB/s over the copy bandwidth measured in
the same run (a 1 GiB clone). Targets: fwd >= 0.75 and bwd >= 0.60 on every shape of a
and b; channels-first >= 3x faster than torch-permute.

Writes DIR/layer_norm.csv, DIR/layer_norm.jsonl, DIR/layer_norm.png (with matplotlib) and
DIR/layer_norm.md (the summary as a markdown table for docs/benchmarks.md), and
prints a compact summary last. The ``sweep`` rows time ours with one launch heuristic
(``snntrain.kernels.layer_norm.TUNING``) changed, next to the default.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
DRY = "--dry-run" in sys.argv  # checks the script's code paths without a GPU
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported
DEVICE = "cpu" if DRY else "cuda"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bench_utils as bu  # noqa: E402
from snntrain.kernels import layer_norm as K  # noqa: E402

EPS = 1e-5
MODES = ("fwd", "bwd", "fwd+bwd")
ROTATE_BYTES = 160 << 20  # inputs touched per graph replay, at least (> 3x the 50 MB L2)
MAX_ROTATE = 16
T, B = 4, 32
START = time.time()
TIMING = {"warmup": 10, "rep": 40}  # do_bench milliseconds; --focus and --quick shorten them

SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
SECTION_TITLE = {
    "a": "a rows [4096, N]",
    "b": "b conv rows [T*B*H*W, C]",
    "c": "c channels-first [T, B, C, H, W]",
}
REFERENCE = ("same-bytes", "ours-op", "ours-dx")


def log(msg: str) -> None:
    print(f"[{time.time() - START:5.0f}s] {msg}", flush=True)


@dataclasses.dataclass(frozen=True)
class Case:
    section: str  # a, b, c
    shape: tuple[int, ...]
    dim: int  # -1 (rows) or -3 (channels-first)

    @property
    def label(self) -> str:
        return "x".join(map(str, self.shape))

    @property
    def channels(self) -> int:
        return self.shape[self.dim]


def rows(n: int) -> Case:
    return Case("a", (8 if DRY else 4096, n), -1)


def conv(c: int) -> Case:
    return Case("b", (512 if DRY else T * B * 56 * 56, c), -1)


def cf(c: int, hw: int) -> Case:
    return Case("c", (1 if DRY else T, 2 if DRY else B, c, min(hw, 16) if DRY else hw, min(hw, 16) if DRY else hw), -3)


def cases(kind: str) -> dict[str, list[Case]]:
    if kind == "quick":
        return {"a": [rows(512), rows(16384)], "b": [conv(64)], "c": [cf(64, 56), cf(512, 7)]}
    if kind == "focus":
        return {"a": [rows(n) for n in (512, 4096, 16384)], "b": [conv(c) for c in (32, 64, 256)],
                "c": [cf(64, 56), cf(256, 14), cf(512, 7)]}
    return {"a": [rows(n) for n in (512, 1024, 2048, 4096, 8192, 16384)],
            "b": [conv(c) for c in (32, 64, 128, 256, 512)],
            "c": [cf(c, hw) for c, hw in ((32, 56), (64, 56), (128, 28), (256, 14), (512, 7))]}


# --------------------------------------------------------------------------- providers


def _torch_rows(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _torch_permute(x, w, b):
    return F.layer_norm(x.permute(0, 1, 3, 4, 2), (x.shape[2],), w, b, EPS).permute(0, 1, 4, 2, 3)


def _torch_permute_copy(x, w, b):
    return _torch_permute(x, w, b).contiguous()


def _ours_rows(x, w, b):
    return K.layer_norm(x, w, b, EPS, -1)


def _ours_cf(x, w, b):
    return K.layer_norm(x, w, b, EPS, -3)


_COMPILED: dict[str, Callable] = {}


def _compiled(name: str, fn: Callable) -> Callable:
    if DRY:
        return fn
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


def providers(case: Case, with_compile: bool, full: bool) -> dict[str, Callable]:
    """Layer-norm implementations (reference providers are handled in :func:`calls_for`)."""
    if case.dim == -1:
        out = {"ours": _ours_rows, "torch": _torch_rows}
        if with_compile:
            out["torch.compile"] = _compiled("rows", _torch_rows)
    else:
        out = {"ours": _ours_cf, "torch-permute": _torch_permute}
        if full:
            out["torch-permute-copy"] = _torch_permute_copy
        if with_compile:
            out["torch.compile"] = _compiled("permute", _torch_permute_copy)
    return out


# --------------------------------------------------------------------------- timing


def nbytes(case: Case, dtype: torch.dtype, mode: str) -> int:
    n = math.prod(case.shape)
    e = torch.empty((), dtype=dtype).element_size()
    rows_ = n // case.channels
    fwd = 2 * n * e
    bwd = 3 * n * e + 8 * rows_
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


class Inputs:
    """``k`` copies of x and dy (rotated through within one graph replay), one weight and bias."""

    def __init__(self, case: Case, dtype: torch.dtype):
        n_bytes = math.prod(case.shape) * torch.empty((), dtype=dtype).element_size()
        self.k = max(1, min(MAX_ROTATE, math.ceil(ROTATE_BYTES / (2 * n_bytes))))
        if DRY:
            self.k = 2
        g = torch.Generator(device=DEVICE).manual_seed(0)
        C = case.channels
        self.w = (torch.rand(C, device=DEVICE, generator=g) + 0.5).to(dtype).requires_grad_()
        self.b = torch.randn(C, device=DEVICE, generator=g).to(dtype).requires_grad_()
        self.xs = [(torch.randn(case.shape, device=DEVICE, generator=g) * 2 + 0.5).to(dtype).requires_grad_()
                   for _ in range(self.k)]
        self.dys = [torch.randn(case.shape, device=DEVICE, generator=g).to(dtype) for _ in range(self.k)]


def bench_ms(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=TIMING["warmup"], rep=TIMING["rep"], return_mode="median"))


def time_calls(calls: list[Callable], stream: torch.cuda.Stream) -> tuple[float, str]:
    """Milliseconds per call: all calls in one CUDA graph, replays timed by do_bench (:func:`bench_utils.graph_ms`,
    eager timing noted where the calls cannot be captured)."""
    if DRY:
        for c in calls:
            c()
        return 1e-3, ""
    return bu.graph_ms(calls, stream=stream, warmup=2, timer=bench_ms)


def on(stream):
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)


def calls_for(name: str, fn: Callable | None, case: Case, inp: Inputs, mode: str, stream) -> tuple[list, list]:
    """(calls to time, tensors to keep alive) for provider ``name`` in ``mode``."""
    k = range(inp.k)
    if name == "same-bytes":
        if mode == "fwd":
            return [lambda i=i: inp.xs[i].detach().clone() for i in k], []
        return [lambda i=i: torch.add(inp.xs[i].detach(), inp.dys[i]) for i in k], []
    if name in ("ours-op", "ours-dx"):
        dim = case.dim % len(case.shape)
        with torch.no_grad(), on(stream):
            saved = [torch.ops.snntrain.layer_norm_fwd(inp.xs[i].detach(), inp.w.detach(), inp.b.detach(), dim, EPS)
                     for i in k]
        need = name == "ours-op"
        w, b = inp.w.detach(), inp.b.detach()
        return [lambda i=i: torch.ops.snntrain.layer_norm_bwd(inp.dys[i], inp.xs[i].detach(), w, b, saved[i][1],
                                                              saved[i][2], dim, need, need) for i in k], saved
    if mode == "fwd":
        return [lambda i=i: fn(inp.xs[i], inp.w, inp.b) for i in k], []
    if mode == "bwd":
        with on(stream):  # backward ops run on the forward's stream: the capture stream
            ys = [fn(inp.xs[i], inp.w, inp.b) for i in k]
        return [lambda i=i: torch.autograd.grad(ys[i], [inp.xs[i], inp.w, inp.b], inp.dys[i], retain_graph=True)
                for i in k], ys
    return [lambda i=i: torch.autograd.grad(fn(inp.xs[i], inp.w, inp.b), [inp.xs[i], inp.w, inp.b], inp.dys[i])
            for i in k], []


def measure(case: Case, dtype: torch.dtype, name: str, fn: Callable | None, inp: Inputs, modes, stream,
            bench: str | None = None) -> list[bu.Row]:
    rows_ = []
    for mode in modes:
        calls, keep = calls_for(name, fn, case, inp, mode, stream)
        ms, note = time_calls(calls, stream)
        rows_.append(bu.Row(bench or case.section, "layer_norm", mode, name, str(dtype).removeprefix("torch."),
                            case.label, ms, nbytes(case, dtype, mode), note=note))
        del calls, keep
    return rows_


def check_against_torch(case: Case, inp: Inputs) -> str:
    """Max error of ours against F.layer_norm on the first input copy (y, dx, dw, db), relative to max |ref|."""
    x, w, b, dy = inp.xs[0], inp.w, inp.b, inp.dys[0]
    ours = _ours_rows if case.dim == -1 else _ours_cf
    ref_fn = _torch_rows if case.dim == -1 else _torch_permute
    out = []
    for f in (ours, ref_fn):
        y = f(x, w, b)
        out.append((y.detach(), *torch.autograd.grad(y, [x, w, b], dy)))
    errs = [((a.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-6)).item()
            for a, r in zip(*out)]
    tol = 1e-4 if x.dtype == torch.float32 else 3e-2
    if max(errs) > tol:
        return "MISMATCH y/dx/dw/db rel err " + "/".join(f"{e:.1e}" for e in errs)
    return ""


def launch_floor(stream: torch.cuda.Stream) -> tuple[float, float]:
    """Microseconds per call of one and of two dependent tiny kernels, timed like the providers."""
    if DRY:
        return 0.0, 0.0
    bufs = [torch.zeros(16, device="cuda") for _ in range(MAX_ROTATE)]
    one, _ = time_calls([lambda t=t: t.add_(1.0) for t in bufs], stream)
    two, _ = time_calls([lambda t=t: t.add_(1.0).mul_(0.5) for t in bufs], stream)
    return one * 1e3, two * 1e3


# --------------------------------------------------------------------------- sweep of launch heuristics


@contextlib.contextmanager
def tuning(**overrides):
    saved = {k: getattr(K.TUNING, k) for k in overrides}
    for k, v in overrides.items():
        setattr(K.TUNING, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(K.TUNING, k, v)


def sweep_variants(kind: str) -> list[tuple[Case, str, dict]]:
    """(case, mode, Tuning overrides): alternatives to the default launch heuristics, each a tuning question.

    The previous sweep changed one field at a time; the defaults now combine several of
    those changes, so these variants ask what the single-field runs could not answer: how
    the combinations interact, and settings on the shapes they were not measured on.
    """
    v = [
        # a, backward: 3 stages (measured at 4096 only) at 512 and with more programs per SM
        # (partial_frac=0.25 gave x1.21 at 4096 with 2 stages; does it still add to 3?).
        (rows(512), "bwd", {"bwd_stages": 2}), (rows(512), "bwd", {"partial_frac": 0.25}),
        (rows(512), "bwd", {"partial_frac": 1.0}),
        (rows(4096), "bwd", {"partial_frac": 0.25}), (rows(4096), "bwd", {"bwd_stages": 4}),
        # a, long rows: fused dW/dB (x1.10 before, spills) against the separate pass now in one wave.
        (rows(16384), "bwd", {"fused_dw_max_c": 16384}), (rows(16384), "bwd", {"bwd_stages": 2}),
        # a, forward: tile size (2048 gave x1.03 at 512: real or noise?), warps per row.
        (rows(512), "fwd", {"fwd_tile": 2048}), (rows(4096), "fwd", {"fwd_tile": 8192}),
        (rows(4096), "fwd", {"fwd_warp_elems": 1024}),
        # b: stages at C = 32 (only 1 was measured), deeper, more programs per SM; forward at C = 32.
        (conv(32), "bwd", {"bwd_stages": 1}), (conv(64), "bwd", {"bwd_stages": 4}),
        (conv(64), "bwd", {"bwd_programs_per_sm": 8, "bwd_tile": 1024}),
        (conv(32), "fwd", {"fwd_tile": 2048}), (conv(32), "fwd", {"fwd_tile": 8192}),
        # c, backward: 3 stages (best on rows, unmeasured here) alone and with per-tile folding
        # (no spills in the sm_90 builds); the old 2 stages; 7x7 with the separate dW/dB pass.
        (cf(64, 56), "bwd", {"cf_bwd_stages": 3}), (cf(64, 56), "bwd", {"cf_bwd_stages": 3, "cf_reduce_each": True}),
        (cf(64, 56), "bwd", {"cf_reduce_each": True}),
        (cf(256, 14), "bwd", {"cf_bwd_stages": 3, "cf_reduce_each": True}), (cf(256, 14), "bwd", {"cf_bwd_stages": 2}),
        (cf(256, 14), "bwd", {"cf_min_block_s": 32}),
        (cf(512, 7), "bwd", {"cf_bwd_stages": 3, "cf_reduce_each": True}), (cf(512, 7), "bwd", {"cf_bwd_stages": 2}),
        (cf(512, 7), "bwd", {"cf_unaligned_separate_dw": True}),
        # c, forward: positions per tile, warps at 7x7, a smaller tile at 56x56.
        (cf(256, 14), "fwd", {"cf_min_block_s": 32}), (cf(512, 7), "fwd", {"fwd_warp_elems": 1024}),
        (cf(64, 56), "fwd", {"cf_fwd_tile": 512}),
    ]
    if kind == "quick":
        return v[:2] + v[15:17]
    return v


# --------------------------------------------------------------------------- summary


def _ratio(a: bu.Row | None, b: bu.Row | None) -> float:
    return a.gbps / b.gbps if a and b and b.gbps else float("nan")


def summarize(rows_: list[bu.Row]) -> tuple[list[str], list[str], list[str]]:
    """Compact text lines, markdown table lines and missed targets; one line per (section, dtype, shape, mode)."""
    by: dict[tuple, dict[str, bu.Row]] = {}
    for r in rows_:
        if r.benchmark in SECTION_TITLE:
            by.setdefault((r.benchmark, r.dtype, r.shape, r.mode), {})[r.provider] = r
    text, md = [], [
        "| case | dtype | shape | mode | ours GB/s | ours / copy | same-bytes / copy | torch GB/s | "
        "torch.compile GB/s | ours vs torch | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fails = []
    for (sec, dtype, shape, mode), p in by.items():
        ours = p.get("ours")
        if ours is None:
            continue
        base = p.get("torch") or p.get("torch-permute")
        comp, ceil = p.get("torch.compile"), p.get("same-bytes")
        speed = _ratio(ours, base)
        if sec in ("a", "b"):
            need = {"fwd": 0.75, "bwd": 0.60}.get(mode)
            ok = None if need is None else ours.roofline >= need
        else:
            ok = speed >= 3.0
        flag = "" if ok is None else ("ok" if ok else "MISS")
        if ok is False:
            fails.append(f"{sec} {SHORT.get(dtype, dtype)} {shape} {mode}")
        cg = f"{comp.gbps:5.0f}" if comp else "    -"
        bg = f"{base.gbps:5.0f}" if base else "    -"
        ce = f"{ceil.roofline:4.2f}" if ceil else "   -"
        parts = []
        for ref in ("ours-op", "ours-dx"):
            if ref in p:
                parts.append(f"{ref[5:]} {p[ref].roofline:4.2f}")
        note = " !" + ours.note if ours.note else ""
        text.append(f"{sec} {SHORT.get(dtype, dtype):4s} {shape:15s} {mode:7s} {ours.gbps:5.0f} {ours.roofline:4.2f}"
                    f" ceil {ce} | {bg} {cg} | x{speed:4.1f} {flag:4s}" + (" | " + ", ".join(parts) if parts else "")
                    + note)
        md.append(f"| {sec} | {dtype} | {shape} | {mode} | {ours.gbps:.0f} | {ours.roofline:.2f} | "
                  f"{f'{ceil.roofline:.2f}' if ceil else '-'} | {f'{base.gbps:.0f}' if base else '-'} | "
                  f"{f'{comp.gbps:.0f}' if comp else '-'} | {speed:.1f}x | {flag} |")
    return text, md, fails


def sweep_lines(rows_: list[bu.Row]) -> list[str]:
    base = {(r.benchmark, r.dtype, r.shape, r.mode): r.gbps for r in rows_ if r.provider == "ours"}
    out = []
    for r in rows_:
        if r.benchmark.startswith("sweep-"):
            d = base.get((r.benchmark.removeprefix("sweep-"), r.dtype, r.shape, r.mode))
            rel = f" x{r.gbps / d:4.2f} of default {d:5.0f}" if d else ""
            out.append(f"sweep {r.shape:15s} {r.mode:3s} {r.provider[5:-1]:42s} {r.gbps:5.0f} {r.roofline:4.2f}{rel}"
                       f"{' !' + r.note if r.note else ''}")
    return out


# --------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench_results"), help="folder for CSV, plot, markdown")
    p.add_argument("--quick", action="store_true", help="a few shapes, fp16, short timing (smoke test)")
    p.add_argument("--focus", action="store_true",
                   help="fp16 only: the shapes that missed (a: N=512, 4096, 16384; b: C=32, 64, 256; c: 56x56, "
                        "14x14, 7x7), the reference providers and the sweep; no torch.compile, no bf16/fp32")
    p.add_argument("--budget", type=float, default=200.0,
                   help="seconds after which optional parts (bf16, fp32, sweep) are skipped "
                        "(torch.compile after half of it)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    p.add_argument("--no-sweep", action="store_true", help="skip the launch-heuristic sweep")
    p.add_argument("--dry-run", action="store_true", help="no GPU: tiny shapes in Triton's interpreter, fake times")
    args = p.parse_args()
    kind = "quick" if args.quick else "focus" if args.focus else "full"
    if kind != "full":
        TIMING.update(warmup=5, rep=20)
    if not DRY:
        bu.device()
    import torch._dynamo

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    copy_gbps = 1000.0 if DRY else bu.copy_bandwidth()
    log(f"GPU {bu.gpu_name()}: copy bandwidth {copy_gbps:.0f} GB/s (read + write of a 1 GiB clone)")
    stream = None if DRY else torch.cuda.Stream()
    floor1, floor2 = launch_floor(stream)
    log(f"launch floor in a graph: 1 tiny kernel {floor1:.1f} us, 2 dependent tiny kernels {floor2:.1f} us")
    all_cases = cases(kind)
    rows_: list[bu.Row] = []
    skipped: list[str] = []

    def over_budget() -> bool:
        return time.time() - START > args.budget

    def run_case(case: Case, dtype: torch.dtype, names: tuple[str, ...] | None, optional: bool,
                 refs: bool) -> None:
        tag = f"{case.section} {str(dtype).removeprefix('torch.')} {case.label}"
        if optional and over_budget():
            skipped.append(tag)
            return
        try:
            inp = Inputs(case, dtype)
            note = check_against_torch(case, inp)
            if note:
                print(f"  {tag}: {note}", flush=True)
            with_compile = kind == "full" and not args.no_compile and names is None
            if with_compile and time.time() - START > 0.5 * args.budget:
                with_compile = False
                skipped.append(f"torch.compile for {tag}")
            todo = [(n, f, MODES) for n, f in providers(case, with_compile, kind == "full").items()
                    if names is None or n in names]
            if refs:
                todo += [("same-bytes", None, ("fwd", "bwd")), ("ours-op", None, ("bwd",)),
                         ("ours-dx", None, ("bwd",))]
            for name, fn, modes in todo:
                try:
                    new = measure(case, dtype, name, fn, inp, modes, stream)
                except Exception as err:  # noqa: BLE001 - keep going, record the failure
                    print(f"  {tag} {name} failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
                    traceback.print_exc(limit=2)
                    continue
                if name == "ours" and note:
                    for r in new:
                        r.note = (r.note + " " + note).strip()
                rows_.extend(new)
            del inp
        except torch.cuda.OutOfMemoryError:
            print(f"  {tag}: out of memory, skipped", flush=True)
            skipped.append(tag + " (OOM)")
        if not DRY:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        log(f"{tag} done")

    # 1. fp16, every section: ours, torch (and torch.compile in the full run), the reference providers.
    for sec in ("a", "b", "c"):
        for case in all_cases[sec]:
            run_case(case, torch.float16, None, optional=False, refs=True)

    # 2. bf16: ours and torch on every shape. 3. fp32: a few shapes.
    if kind == "full":
        for sec in ("a", "b", "c"):
            for case in all_cases[sec]:
                base = ("ours", "torch") if sec != "c" else ("ours", "torch-permute")
                run_case(case, torch.bfloat16, base, optional=True, refs=False)
        few = ([c for c in all_cases["a"] if c.shape[1] in (1024, 16384)]
               + [c for c in all_cases["b"] + all_cases["c"] if c.channels == 64])
        for case in few:
            base = ("ours", "torch") if case.section != "c" else ("ours", "torch-permute")
            run_case(case, torch.float32, base, optional=True, refs=False)

    # 4. Launch-heuristic variants of ours (fp16).
    if not args.no_sweep:
        for case, mode, ov in sweep_variants(kind):
            label = "ours[" + ",".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in ov.items()) + "]"
            if over_budget():
                skipped.append(f"sweep {case.label} {mode} {label}")
                continue
            try:
                with tuning(**ov):
                    inp = Inputs(case, torch.float16)
                    note = check_against_torch(case, inp)
                    fn = _ours_rows if case.dim == -1 else _ours_cf
                    new = measure(case, torch.float16, label, fn, inp, (mode,), stream, bench="sweep-" + case.section)
                    for r in new:
                        r.note = note
                    rows_ += new
                    del inp
            except Exception as err:  # noqa: BLE001
                print(f"  sweep {case.label} {mode} {ov} failed: {type(err).__name__}: {str(err)[:200]}")
            if not DRY:
                torch.cuda.empty_cache()
        log("sweep done")

    bu.fill(rows_, copy_gbps)
    out = Path(args.out)
    bu.write_rows(rows_, out, "layer_norm")
    bu.plot([r for r in rows_ if not r.benchmark.startswith("sweep-") and r.provider not in REFERENCE],
            out / "layer_norm.png", "layer-norm")
    text, md, fails = summarize(rows_)
    (out / "layer_norm.md").write_text(
        f"GPU: {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s, launch floor in a graph "
        f"{floor1:.1f} us (1 tiny kernel) / {floor2:.1f} us (2)\n\n" + "\n".join(md) + "\n"
    )
    print(f"\ncsv: {out / 'layer_norm.csv'}   jsonl: {out / 'layer_norm.jsonl'}   markdown: {out / 'layer_norm.md'}   "
          f"total {time.time() - START:.0f}s")
    if skipped:
        print(f"skipped (time budget {args.budget:.0f}s): " + "; ".join(skipped))
    for line in sweep_lines(rows_):
        print(line)
    print(f"\nGPU {bu.gpu_name()}, copy {copy_gbps:.0f} GB/s, launch floor {floor1:.1f}/{floor2:.1f} us (1/2 kernels)."
          " Columns: section dtype shape mode | ours GB/s, ours/copy, same-bytes/copy | torch GB/s (c: torch-permute),"
          " torch.compile GB/s | ours/torch, target | bwd: ours-op/copy, ours-dx/copy")
    for line in text:
        print(line)
    print(f"targets missed: {len(fails)}" + (": " + "; ".join(fails) if fails else ""))


if __name__ == "__main__":
    main()
