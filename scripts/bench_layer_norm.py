"""Layer-norm benchmark: ours (Triton) against torch.nn.functional.layer_norm and torch.compile of it.

    python scripts/bench_layer_norm.py --out DIR [--quick] [--budget SECONDS] [--no-compile] [--no-sweep]

Sections (fp16 in full; bf16 for ours and torch; fp32 on a few shapes):

  a  rows [M, N], M = 4096, N = 512 ... 16384
  b  conv features as rows [T*B*H*W, C] = [4*32*56*56, C], C = 32 ... 512
  c  channels-first [T, B, C, H, W] with T = 4, B = 32 at the SEW-ResNet stage shapes:
     ours in place against permute + F.layer_norm + permute (``torch-permute``: the
     result left as a channels-last view; ``torch-permute-copy``: made contiguous again)
     and torch.compile of the latter.

Timing: every call is captured in one CUDA graph together with calls on other copies
of the inputs (so a replay moves >= 256 MB and no call finds its inputs in L2), the
replays are timed with triton.testing.do_bench (median, L2 flushed before each replay)
and divided by the number of calls. The graph removes Python launch overhead from
every provider alike. If a provider cannot be captured it is timed eagerly (noted).

Bytes (the roofline numerator, parameters ignored): fwd = read x + write y;
bwd = read x and dy + write dx + read mean and rstd (8 bytes per row);
fwd+bwd = the sum. ``roofline`` = achieved GB/s over the copy bandwidth measured in
the same run. Targets: fwd >= 0.75 and bwd >= 0.60 on every shape of a and b;
channels-first >= 3x faster than torch-permute.

Writes DIR/layer_norm.csv, DIR/layer_norm.png (with matplotlib) and
DIR/layer_norm.md (the summary as a markdown table for docs/benchmarks.md), and
prints a compact summary last. Also times a few launch-heuristic variants of ours
(``sweep`` rows) to guide tuning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bench_utils as bu  # noqa: E402
from snntrain.kernels import layer_norm as K  # noqa: E402

EPS = 1e-5
MODES = ("fwd", "bwd", "fwd+bwd")
ROTATE_BYTES = 256 << 20  # inputs touched per graph replay, at least
MAX_ROTATE = 16
T, B = 4, 32
START = time.time()

SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
SECTION_TITLE = {
    "a": "a rows [4096, N]",
    "b": "b conv rows [T*B*H*W, C]",
    "c": "c channels-first [T, B, C, H, W]",
}


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


def cases(quick: bool) -> dict[str, list[Case]]:
    ns = (512, 4096, 16384) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    cs = (64, 256) if quick else (32, 64, 128, 256, 512)
    stages = ((64, 56), (256, 14)) if quick else ((32, 56), (64, 56), (128, 28), (256, 14), (512, 7))
    return {
        "a": [Case("a", (4096, n), -1) for n in ns],
        "b": [Case("b", (T * B * 56 * 56, c), -1) for c in cs],
        "c": [Case("c", (T, B, c, hw, hw), -3) for c, hw in stages],
    }


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
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


def providers(case: Case, with_compile: bool) -> dict[str, Callable]:
    if case.dim == -1:
        out = {"ours": _ours_rows, "torch": _torch_rows}
        if with_compile:
            out["torch.compile"] = _compiled("rows", _torch_rows)
    else:
        out = {"ours": _ours_cf, "torch-permute": _torch_permute, "torch-permute-copy": _torch_permute_copy}
        if with_compile:
            out["torch.compile"] = _compiled("permute", _torch_permute_copy)
    return out


# --------------------------------------------------------------------------- timing


def nbytes(case: Case, dtype: torch.dtype, mode: str) -> int:
    n = math.prod(case.shape)
    e = torch.empty((), dtype=dtype).element_size()
    rows = n // case.channels
    fwd = 2 * n * e
    bwd = 3 * n * e + 8 * rows
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


class Inputs:
    """``k`` copies of x and dy (rotated through within one graph replay), one weight and bias."""

    def __init__(self, case: Case, dtype: torch.dtype):
        n_bytes = math.prod(case.shape) * torch.empty((), dtype=dtype).element_size()
        self.k = max(1, min(MAX_ROTATE, math.ceil(ROTATE_BYTES / (2 * n_bytes))))
        g = torch.Generator(device="cuda").manual_seed(0)
        C = case.channels
        self.w = (torch.rand(C, device="cuda", generator=g) + 0.5).to(dtype).requires_grad_()
        self.b = torch.randn(C, device="cuda", generator=g).to(dtype).requires_grad_()
        self.xs = [(torch.randn(case.shape, device="cuda", generator=g) * 2 + 0.5).to(dtype).requires_grad_()
                   for _ in range(self.k)]
        self.dys = [torch.randn(case.shape, device="cuda", generator=g).to(dtype) for _ in range(self.k)]


def time_calls(calls: list[Callable], stream: torch.cuda.Stream, quick: bool) -> tuple[float, str]:
    """Milliseconds per call: all calls in one CUDA graph, replays timed by do_bench."""
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile, lazily built backward graphs, allocator warm-up
            for c in calls:
                c()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            # Keep every output alive during capture so that each call writes its own memory
            # (a reused block could let L2 absorb the writes of the next call).
            outs = [c() for c in calls]
        torch.cuda.synchronize()
        ms = bu.bench_ms(graph.replay, quick) / len(calls)
        del graph, outs
        return ms, ""
    except Exception as err:  # noqa: BLE001 - fall back to eager timing, say so in the note
        torch.cuda.synchronize()

        def run():
            for c in calls:
                c()

        return bu.bench_ms(run, quick) / len(calls), f"eager timing ({type(err).__name__})"


def measure(case: Case, dtype: torch.dtype, name: str, fn: Callable, inp: Inputs, modes, quick: bool,
            stream: torch.cuda.Stream, bench: str | None = None) -> list[bu.Row]:
    rows = []
    k = range(inp.k)
    for mode in modes:
        if mode == "fwd":
            calls = [lambda i=i: fn(inp.xs[i], inp.w, inp.b) for i in k]
        elif mode == "bwd":
            with torch.cuda.stream(stream):  # backward ops run on the forward's stream: the capture stream
                ys = [fn(inp.xs[i], inp.w, inp.b) for i in k]
            calls = [lambda i=i: torch.autograd.grad(ys[i], [inp.xs[i], inp.w, inp.b], inp.dys[i], retain_graph=True)
                     for i in k]
        else:
            calls = [lambda i=i: torch.autograd.grad(fn(inp.xs[i], inp.w, inp.b), [inp.xs[i], inp.w, inp.b],
                                                     inp.dys[i]) for i in k]
        ms, note = time_calls(calls, stream, quick)
        rows.append(bu.Row(bench or f"{case.section}", "layer_norm", mode, name, str(dtype).removeprefix("torch."),
                           case.label, ms, nbytes(case, dtype, mode), note=note))
        del calls
        if mode == "bwd":
            del ys
    return rows


def check_against_torch(case: Case, inp: Inputs) -> str:
    """Max error of ours against F.layer_norm on the first input copy (y, dx, dw), relative to max |ref|."""
    x, w, b, dy = inp.xs[0], inp.w, inp.b, inp.dys[0]
    ours = _ours_rows if case.dim == -1 else _ours_cf
    ref_fn = _torch_rows if case.dim == -1 else _torch_permute
    out = []
    for f in (ours, ref_fn):
        y = f(x, w, b)
        out.append((y.detach(), *torch.autograd.grad(y, [x, w], dy)))
    errs = [((a.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-6)).item()
            for a, r in zip(*out)]
    tol = 1e-4 if x.dtype == torch.float32 else 3e-2
    if max(errs) > tol:
        return "MISMATCH y/dx/dw rel err " + "/".join(f"{e:.1e}" for e in errs)
    return ""


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


def sweep_variants(quick: bool) -> list[tuple[Case, str, dict]]:
    """(case, mode, Tuning overrides): alternatives to the default launch heuristics."""
    big = Case("a", (4096, 16384), -1)
    conv = Case("b", (T * B * 56 * 56, 64), -1)
    wide = Case("b", (T * B * 56 * 56, 512), -1)
    cf = Case("c", (T, B, 64, 56, 56), -3)
    odd = Case("c", (T, B, 256, 14, 14), -3)
    v = [
        (conv, "fwd", {"fwd_tile": 2048}), (conv, "fwd", {"fwd_tile": 8192}), (conv, "fwd", {"fwd_warp_elems": 256}),
        (conv, "bwd", {"bwd_tile": 1024}), (conv, "bwd", {"bwd_tile": 4096}), (conv, "bwd", {"bwd_warp_elems": 256}),
        (conv, "bwd", {"rows_reduce_each": True}), (conv, "bwd", {"partial_frac": 1 / 512}),
        (wide, "bwd", {"bwd_tile": 4096}), (wide, "bwd", {"bwd_warp_elems": 256}),
        (big, "fwd", {"max_warps": 16}), (big, "fwd", {"max_tile": 8192}),
        (big, "bwd", {"max_warps": 16}), (big, "bwd", {"fused_dw_max_c": 8192}),
        (cf, "fwd", {"fwd_tile": 2048}), (cf, "fwd", {"fwd_tile": 8192}),
        (cf, "bwd", {"bwd_tile": 4096}), (cf, "bwd", {"min_block_s": 64}),
        (odd, "fwd", {"min_block_s": 16}), (odd, "bwd", {"min_block_s": 16}), (odd, "bwd", {"max_tile": 4096}),
    ]
    if quick:
        v = v[:2] + v[3:5] + v[10:14]
    return v


# --------------------------------------------------------------------------- summary


def summarize(rows: list[bu.Row], copy_gbps: float) -> tuple[list[str], list[str]]:
    """Compact text lines and markdown table lines; one line per (section, dtype, shape, mode)."""
    by = {}
    for r in rows:
        if r.benchmark in SECTION_TITLE:
            by.setdefault((r.benchmark, r.dtype, r.shape, r.mode), {})[r.provider] = r
    text, md = [], [
        "| case | dtype | shape | mode | ours GB/s | ours / copy | torch GB/s | torch.compile GB/s | ours vs torch | "
        "target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    fails = []
    for (sec, dtype, shape, mode), p in by.items():
        ours = p.get("ours")
        if ours is None:
            continue
        base = p.get("torch") or p.get("torch-permute")
        comp = p.get("torch.compile")
        speed = ours.gbps / base.gbps if base and base.gbps else float("nan")
        if sec in ("a", "b"):
            need = {"fwd": 0.75, "bwd": 0.60}.get(mode)
            ok = None if need is None else ours.roofline >= need
            tgt = "" if need is None else f">={need:.2f} copy"
        else:
            ok = speed >= 3.0
            tgt = ">=3x permute"
        flag = "" if ok is None else ("ok" if ok else "MISS")
        if ok is False:
            fails.append(f"{sec} {dtype} {shape} {mode}")
        cg = f"{comp.gbps:5.0f}" if comp else "    -"
        bg = f"{base.gbps:5.0f}" if base else "    -"
        note = " !" + ours.note if ours.note else ""
        text.append(f"{sec} {SHORT.get(dtype, dtype):4s} {shape:15s} {mode:7s} {ours.gbps:5.0f} {ours.roofline:4.2f}"
                    f" | {bg} {cg} | x{speed:4.1f} {flag}{note}")
        md.append(f"| {sec} | {dtype} | {shape} | {mode} | {ours.gbps:.0f} | {ours.roofline:.2f} | "
                  f"{base.gbps if base else float('nan'):.0f} | {comp.gbps if comp else float('nan'):.0f} | "
                  f"{speed:.1f}x | {flag} |")
    shown = "; ".join(fails[:24]) + (f"; ... ({len(fails) - 24} more)" if len(fails) > 24 else "")
    text.append(f"targets missed: {len(fails)}" + (": " + shown if fails else ""))
    return text, md


def sweep_lines(rows: list[bu.Row]) -> list[str]:
    base = {(r.benchmark, r.dtype, r.shape, r.mode): r.gbps for r in rows if r.provider == "ours"}
    out = []
    for r in rows:
        if r.benchmark.startswith("sweep-"):
            d = base.get((r.benchmark.removeprefix("sweep-"), r.dtype, r.shape, r.mode))
            ref = f" (default {d:.0f})" if d else ""
            out.append(f"sweep {r.shape:14s} {r.mode} {r.provider[5:-1]:24s} {r.gbps:5.0f}{ref}"
                       f"{' !' + r.note if r.note else ''}")
    return out


# --------------------------------------------------------------------------- main


def main() -> None:
    def extra(p):
        p.add_argument("--budget", type=float, default=270.0,
                       help="seconds after which optional parts (sweep, bf16, fp32) are skipped "
                            "(torch.compile after 75%% of it)")
        p.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
        p.add_argument("--no-sweep", action="store_true", help="skip the launch-heuristic sweep")

    args = bu.parse_args(__doc__.splitlines()[0], extra)
    bu.device()
    import torch._dynamo

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    copy_gbps = bu.copy_bandwidth()
    print(f"GPU {bu.gpu_name()}: copy bandwidth {copy_gbps:.0f} GB/s (read + write of a 1 GiB clone)", flush=True)
    stream = torch.cuda.Stream()
    all_cases = cases(args.quick)
    rows: list[bu.Row] = []
    skipped: list[str] = []

    def over_budget() -> bool:
        return time.time() - START > args.budget

    def run_case(case: Case, dtype: torch.dtype, names: tuple[str, ...] | None, optional: bool) -> None:
        tag = f"{case.section} {str(dtype).removeprefix('torch.')} {case.label}"
        if optional and over_budget():
            skipped.append(tag)
            return
        try:
            inp = Inputs(case, dtype)
            note = check_against_torch(case, inp)
            if note:
                print(f"  {tag}: {note}", flush=True)
            with_compile = not args.no_compile and names is None
            if with_compile and time.time() - START > 0.75 * args.budget:
                with_compile = False
                skipped.append(f"torch.compile for {tag}")
            for name, fn in providers(case, with_compile).items():
                if names is not None and name not in names:
                    continue
                try:
                    new = measure(case, dtype, name, fn, inp, MODES, args.quick, stream)
                except Exception as err:  # noqa: BLE001 - keep going, record the failure
                    print(f"  {tag} {name} failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
                    traceback.print_exc(limit=2)
                    continue
                if name == "ours" and note:
                    for r in new:
                        r.note = (r.note + " " + note).strip()
                rows.extend(new)
            del inp
        except torch.cuda.OutOfMemoryError:
            print(f"  {tag}: out of memory, skipped", flush=True)
            skipped.append(tag + " (OOM)")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        print(f"[{time.time() - START:5.0f}s] {tag} done", flush=True)

    # 1. fp16, every section, every provider.
    for sec in ("a", "b", "c"):
        for case in all_cases[sec]:
            run_case(case, torch.float16, None, optional=False)

    # 2. Launch-heuristic variants of ours (fp16).
    if not args.no_sweep:
        for case, mode, ov in sweep_variants(args.quick):
            if over_budget():
                skipped.append(f"sweep {case.label} {mode} {ov}")
                continue
            try:
                with tuning(**ov):
                    inp = Inputs(case, torch.float16)
                    fn = _ours_rows if case.dim == -1 else _ours_cf
                    label = "ours[" + ",".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                               for k, v in ov.items()) + "]"
                    rows += measure(case, torch.float16, label, fn, inp, (mode,), args.quick, stream,
                                    bench="sweep-" + case.section)
                    del inp
            except Exception as err:  # noqa: BLE001
                print(f"  sweep {case.label} {mode} {ov} failed: {type(err).__name__}: {str(err)[:200]}")
            torch.cuda.empty_cache()
        print(f"[{time.time() - START:5.0f}s] sweep done", flush=True)

    # 3. bf16: ours and torch on every shape. 4. fp32: a few shapes.
    if not args.quick:
        for sec in ("a", "b", "c"):
            for case in all_cases[sec]:
                base = ("ours", "torch") if sec != "c" else ("ours", "torch-permute")
                run_case(case, torch.bfloat16, base, optional=True)
        few = ([c for c in all_cases["a"] if c.shape[1] in (1024, 16384)]
               + [c for c in all_cases["b"] + all_cases["c"] if c.channels == 64])
        for case in few:
            base = ("ours", "torch") if case.section != "c" else ("ours", "torch-permute")
            run_case(case, torch.float32, base, optional=True)

    bu.fill(rows, copy_gbps)
    out = Path(args.out)
    bu.write_csv(rows, out / "layer_norm.csv")
    bu.plot([r for r in rows if not r.benchmark.startswith("sweep-")], out / "layer_norm.png", "layer-norm")
    text, md = summarize(rows, copy_gbps)
    (out / "layer_norm.md").write_text(
        f"GPU: {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s\n\n" + "\n".join(md) + "\n"
    )
    print(f"\ncsv: {out / 'layer_norm.csv'}   markdown: {out / 'layer_norm.md'}   total {time.time() - START:.0f}s")
    if skipped:
        print(f"skipped (time budget {args.budget:.0f}s): " + "; ".join(skipped))
    for line in sweep_lines(rows):
        print(line)
    print(f"\nGPU {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s. Columns: section dtype shape mode | ours GB/s,"
          " ours/copy | torch GB/s (c: torch-permute), torch.compile GB/s | ours/torch, target")
    for line in text:
        print(line)


if __name__ == "__main__":
    main()
