"""Benchmark of the GIoU box loss: our Triton kernels against torchvision and the seed's formulation.

    python scripts/bench_giou.py --out DIR [--quick] [--update-docs]
    python scripts/bench_giou.py --fill-docs DIR/giou.md     # results of a run elsewhere -> docs

Cases: 32 x 256 boxes (the seed's toy detector), 256 x 4096 and 4096 x 4096 (16 M)
boxes, fp32 and bf16, the trailing half of every image's targets padding (y2 = 0), the
``mean`` over valid boxes. Modes: ``fwd`` (the training forward: pred requires grad)
and ``fwd+bwd`` (forward and ``.backward()``; pred's ``.grad`` reset between runs).

Providers:
  ours            snntrain.losses.giou_loss (default gradient mode)
  ours-<mode>     the other gradient mode (separate backward kernel / gradient in the forward)
  ours-op         the registered operator called eagerly (dispatcher cost; smallest case only)
  ours-cudagraph  ours captured in a CUDA graph and replayed (smallest case only)
  torchvision     torchvision.ops.generalized_box_iou_loss with the seed's padding mask, eager
  torchvision-compile   the same under torch.compile
  seed            the seed article's padded loss: element-wise GIoU in plain PyTorch ops
                  (input dtype), mask-multiplied, summed and divided by the valid count
  seed-compile    the same under torch.compile

Roofline: ``bytes`` is pred + target for ``fwd`` and pred + target + pred's gradient for
``fwd+bwd``; ``roofline`` is the time those bytes take at the copy bandwidth measured in
the same run divided by the measured time (1.0 = at the copy ceiling).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from torchvision.ops import generalized_box_iou_loss

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_utils as bu  # noqa: E402

from snntrain.kernels import giou as K  # noqa: E402
from snntrain.losses import giou_loss  # noqa: E402

SHAPES = [(32, 256), (256, 4096), (4096, 4096)]
DTYPES = [torch.float32, torch.bfloat16]
MODES = ["fwd", "fwd+bwd"]
VALID_FRACTION = 0.5  # the trailing half of every image's targets is padding
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def shape_label(b: int, k: int) -> str:
    n = b * k
    return f"{b}x{k}" if n < 1 << 24 else f"{b}x{k} (16M)"


def make_case(b: int, k: int, dtype: torch.dtype, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(0)
    xy = torch.rand(b, k, 2, device=dev, generator=g) * 512
    wh = torch.rand(b, k, 2, device=dev, generator=g) * 64 + 4
    target = torch.cat([xy, xy + wh], -1)
    pred = target + torch.randn(b, k, 4, device=dev, generator=g) * 8
    target[:, round(k * VALID_FRACTION):] = 0.0  # trailing part of every image is padding
    return pred.to(dtype).contiguous(), target.to(dtype).contiguous()


# ---- baselines -------------------------------------------------------------------------


def tv_padded_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    mask = (target[..., 3] > 0).to(torch.float32)
    loss = generalized_box_iou_loss(pred, target)  # per box, upcast to fp32 inside
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def _plain_giou_loss(p: torch.Tensor, t: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Element-wise 1 - GIoU in plain PyTorch ops, in the input dtype, no data-dependent indexing."""
    px1, py1, px2, py2 = p.unbind(-1)
    tx1, ty1, tx2, ty2 = t.unbind(-1)
    area_p = (px2 - px1) * (py2 - py1)
    area_t = (tx2 - tx1) * (ty2 - ty1)
    inter = (torch.minimum(px2, tx2) - torch.maximum(px1, tx1)).clamp(min=0) * \
        (torch.minimum(py2, ty2) - torch.maximum(py1, ty1)).clamp(min=0)
    union = area_p + area_t - inter
    encl = (torch.maximum(px2, tx2) - torch.minimum(px1, tx1)) * (torch.maximum(py2, ty2) - torch.minimum(py1, ty1))
    return 1 - (inter / (union + eps) - (encl - union) / (encl + eps))


def seed_padded_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    mask = (target[..., 3] > 0).to(pred.dtype)
    loss = _plain_giou_loss(pred, target)
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def ours_default(pred, target):
    return giou_loss(pred, target)


def ours_mode(mode: str):
    return lambda pred, target: K.giou_loss_op(pred, target, None, "mean", grad_mode=mode)


def ours_op(pred, target):
    return K.giou_loss_op(pred, target, None, "mean", use_op=True)


def agreement(pred, target) -> str:
    """Relative difference of every provider's loss value from torchvision's (a sanity check, not timed)."""
    ref = tv_padded_loss(pred.float(), target.float())
    diffs = []
    for name, fn in (("ours", ours_default), ("fused", ours_mode("fused")), ("separate", ours_mode("separate")),
                     ("seed", seed_padded_loss)):
        try:
            diffs.append(f"{name} {((fn(pred, target).float() - ref).abs() / ref.abs()).item():.1e}")
        except Exception as e:
            diffs.append(f"{name} FAILED ({type(e).__name__}: {str(e)[:200]})")
    return "loss vs torchvision (rel): " + ", ".join(diffs)


# ---- timing -----------------------------------------------------------------------------


def timed(loss_fn, pred, target, mode: str, quick: bool) -> float:
    p = pred.detach().clone().requires_grad_()
    if mode == "fwd":
        def fn():
            return loss_fn(p, target)
    else:
        def fn():
            loss_fn(p, target).backward()
    for _ in range(3):  # compile, autotune and warm caches before timing
        fn()
        p.grad = None
    torch.cuda.synchronize()
    return bu.bench_ms(fn, quick=quick, grad_to_none=[p])


def timed_graph(pred, target, mode: str, quick: bool) -> float:
    p = pred.detach().clone().requires_grad_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            loss = giou_loss(p, target)
            if mode != "fwd":
                loss.backward()
            p.grad = None
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = giou_loss(p, target)
        if mode != "fwd":
            loss.backward()
    graph.replay()
    torch.cuda.synchronize()
    return bu.bench_ms(graph.replay, quick=quick)


def nbytes(pred, target, mode: str) -> int:
    n = pred.numel() * pred.element_size() + target.numel() * target.element_size()
    if mode != "fwd":
        n += pred.numel() * pred.element_size()  # pred's gradient
    return n


# ---- summary -----------------------------------------------------------------------------


def summary(rows: list[bu.Row], copy_gbps: float, other_mode: str) -> str:
    out = []
    provs = list(dict.fromkeys(r.provider for r in rows))
    key = {(r.mode, r.dtype, r.shape, r.provider): r for r in rows}
    cases = list(dict.fromkeys((r.mode, r.dtype, r.shape) for r in rows))
    short = {p: p.replace("torchvision", "tv").replace("-compile", "-cmp").replace("cudagraph", "graph") for p in provs}
    head = f"{'mode':8s} {'dtype':9s} {'shape':16s}" + "".join(f"{short[p]:>12s}" for p in provs)
    head += f"{'ours roof':>10s}"
    out.append(f"\nmilliseconds (median); GPU {bu.gpu_name()}; copy bandwidth {copy_gbps:.0f} GB/s")
    out.append(head)
    for mode, dtype, shape in cases:
        line = f"{mode:8s} {dtype:9s} {shape:16s}"
        for p in provs:
            r = key.get((mode, dtype, shape, p))
            line += f"{r.ms:12.4f}" if r else f"{'-':>12s}"
        r = key.get((mode, dtype, shape, "ours"))
        line += f"{r.roofline:10.2f}" if r else ""
        out.append(line)

    out.append("\nTargets")
    small = shape_label(*SHAPES[0])
    for dtype in ("float32", "bfloat16"):
        o = key.get(("fwd+bwd", dtype, small, "ours"))
        tv = key.get(("fwd+bwd", dtype, small, "torchvision"))
        tvc = key.get(("fwd+bwd", dtype, small, "torchvision-compile"))
        gr = key.get(("fwd+bwd", dtype, small, "ours-cudagraph"))
        if o:
            us = o.ms * 1e3
            msg = f"  {small} {dtype} fwd+bwd: ours {us:.1f} us (target <= 40 us: {'met' if us <= 40 else 'MISSED'})"
            if tv:
                msg += f"; torchvision {tv.ms:.3f} ms = {tv.ms / o.ms:.1f}x"
            if tvc:
                msg += f"; tv-compile {tvc.ms:.3f} ms = {tvc.ms / o.ms:.1f}x"
            if gr:
                msg += f"; graph replay {gr.ms * 1e3:.1f} us (GPU time without host overhead)"
            out.append(msg)
    big = shape_label(*SHAPES[-1])
    v = VALID_FRACTION
    for dtype in ("float32", "bfloat16"):
        for mode in MODES:
            o = key.get((mode, dtype, big, "ours"))
            if not o:
                continue
            factor = 1 / o.roofline if o.roofline > 0 else float("inf")
            msg = f"  {big} {dtype} {mode}: {factor:.2f}x the roofline time (target <= 1.5x: " \
                  f"{'met' if factor <= 1.5 else 'MISSED'})"
            # Bytes ours must move, in units of one box tensor (pred, target and the gradient have equal size):
            # target, plus the pred rows whose target is valid (padded rows are not read), in each pass,
            # plus the gradient write in the backward.
            if mode == "fwd":
                least, why = (1 + v) / 2, "target plus the pred rows of valid targets"
            else:
                least, why = (2 * (1 + v) + 1) / 3, "forward and backward each read the inputs, padded pred rows " \
                    "skipped, plus the gradient"
            msg += f"; ours must move {least:.2f}x the counted bytes ({why}), so it runs at " \
                   f"{factor / least:.2f}x its own traffic's copy time"
            out.append(msg)

    out.append("\nGradient mode (fwd+bwd, ours default vs ours-" + other_mode + ")")
    ratios = []
    for mode, dtype, shape in cases:
        if mode != "fwd+bwd":
            continue
        a, b = key.get((mode, dtype, shape, "ours")), key.get((mode, dtype, shape, f"ours-{other_mode}"))
        if a and b:
            ratios.append(b.ms / a.ms)
            out.append(f"  {dtype:9s} {shape:16s} default {a.ms:.4f} ms, {other_mode} {b.ms:.4f} ms "
                       f"({b.ms / a.ms:.2f}x)")
    if ratios:
        gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        verdict = K.DEFAULT_GRAD_MODE if gm >= 1 else other_mode
        out.append(f"  geometric mean {other_mode}/default = {gm:.3f}: faster mode here is '{verdict}'"
                   + ("" if verdict == K.DEFAULT_GRAD_MODE else " -> switch DEFAULT_GRAD_MODE"))

    tuned = []
    for name, kern in (("fwd", K._fwd_tuned), ("bwd", K._bwd_tuned)):
        for k, cfg in getattr(kern, "cache", {}).items():
            tuned.append(f"{name} bucket {k[0]}: BLOCK={cfg.kwargs.get('BLOCK')} warps={cfg.num_warps}")
    if tuned:
        out.append("\nAutotuned configs: " + "; ".join(sorted(set(tuned))))
    return "\n".join(out)


def markdown(rows: list[bu.Row], copy_gbps: float, text: str) -> str:
    lines = [f"GPU: {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s, {rows[0].date if rows else ''}, "
             f"torch {torch.__version__}, triton {__import__('triton').__version__}", "",
             "Command: `python scripts/bench_giou.py " + " ".join(sys.argv[1:]) + "`", "",
             "| mode | dtype | shape | provider | ms | GB/s | roofline |", "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.mode} | {r.dtype} | {r.shape} | {r.provider} | {r.ms:.4f} | {r.gbps:.0f} "
                     f"| {r.roofline:.2f} |")
    lines += ["", "```", text.strip(), "```"]
    return "\n".join(lines)


def update_docs(md: str) -> None:
    path = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    begin, end = "<!-- giou-results:begin -->", "<!-- giou-results:end -->"
    doc = path.read_text()
    if begin not in doc or end not in doc:
        print(f"{path} has no GIoU results markers; not updated")
        return
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + begin + "\n" + md + "\n" + end + tail)
    print(f"updated {path}")


# ---- main ---------------------------------------------------------------------------------


def main() -> None:
    args = bu.parse_args(__doc__.split("\n\n")[0], extra=lambda p: (
        p.add_argument("--update-docs", action="store_true", help="write the results into docs/benchmarks.md"),
        p.add_argument("--fill-docs", metavar="GIOU_MD", default=None,
                       help="no benchmark: copy a previous run's giou.md into docs/benchmarks.md (no GPU needed)"),
        p.add_argument("--budget", type=float, default=210.0,
                       help="seconds after which the torch.compile baselines are skipped")))
    if args.fill_docs:
        update_docs(Path(args.fill_docs).read_text().rstrip("\n"))
        return
    dev = bu.device()
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))
    copy_gbps = bu.copy_bandwidth()
    log(f"copy bandwidth {copy_gbps:.0f} GB/s on {bu.gpu_name()}")
    other = "fused" if K.DEFAULT_GRAD_MODE == "separate" else "separate"
    shapes = SHAPES[:1] if args.quick else SHAPES
    rows: list[bu.Row] = []
    skipped: list[str] = []
    failed: list[str] = []
    for b, k in shapes:
        label = shape_label(b, k)
        for dtype in DTYPES:
            pred, target = make_case(b, k, dtype, dev)
            log(f"{label} {dtype}: {agreement(pred, target)}")
            providers = [("ours", ours_default), (f"ours-{other}", ours_mode(other))]
            if (b, k) == SHAPES[0]:
                providers.append(("ours-op", ours_op))
            providers += [("torchvision", tv_padded_loss), ("seed", seed_padded_loss)]
            compiled = [("torchvision-compile", tv_padded_loss), ("seed-compile", seed_padded_loss)]
            dname = str(dtype).replace("torch.", "")

            def record(name, mode, measure, note=""):
                try:
                    ms = measure()
                except Exception as e:  # keep going: one failing provider must not lose the others' rows
                    failed.append(f"{name} {mode} {label} {dname}: {type(e).__name__}: {str(e)[:200]}")
                    log(f"FAILED {failed[-1]}")
                    return
                rows.append(bu.Row("giou", "giou_loss", mode, name, dname, label, ms, nbytes(pred, target, mode),
                                   note=note))

            for mode in MODES:
                for name, fn in providers:
                    record(name, mode, lambda: timed(fn, pred, target, mode, args.quick))
                if (b, k) == SHAPES[0]:
                    record("ours-cudagraph", mode, lambda: timed_graph(pred, target, mode, args.quick),
                           note="CUDA graph replay")
            for name, fn in compiled:
                if time.perf_counter() - T0 > args.budget:
                    skipped.append(f"{name} {label} {dname}")
                    continue
                cfn = torch.compile(fn, dynamic=False)
                for mode in MODES:
                    record(name, mode, lambda: timed(cfn, pred, target, mode, args.quick))
            log(f"done {label} {dtype}")
            del pred, target
            torch.cuda.empty_cache()
    bu.finish(rows, copy_gbps, args.out, "giou", "GIoU loss, mean over valid boxes, half the targets padding")
    text = summary(rows, copy_gbps, other)
    if skipped:
        text += "\n\nSkipped over the time budget: " + ", ".join(skipped)
    if failed:
        text += "\n\nFailed:\n  " + "\n  ".join(failed)
    md = markdown(rows, copy_gbps, text)
    (Path(args.out) / "giou.md").write_text(md + "\n")
    if args.update_docs:
        update_docs(md)
    print(text)
    log("finished")


if __name__ == "__main__":
    main()
