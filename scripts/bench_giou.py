"""Benchmark of the GIoU box loss: our Triton kernels against torchvision and the seed's formulation.

    python scripts/bench_giou.py --out DIR [--focus | --quick] [--update-docs]
    python scripts/bench_giou.py --fill-docs DIR/giou.md     # results of a run elsewhere -> docs

Cases: 32 x 256 boxes (the seed's toy detector), 256 x 4096 and 4096 x 4096 (16 M)
boxes, fp32 and bf16, the trailing half of every image's targets padding (y2 = 0), the
``mean`` over valid boxes. Modes: ``fwd`` (the training forward: pred requires grad)
and ``fwd+bwd`` (forward and ``.backward()``; pred's ``.grad`` reset between runs).

Providers:
  ours            snntrain.losses.giou_loss (default gradient mode: fused, or separate for
                  fp32 above snntrain.kernels.giou.FUSED_MAX_F32 boxes)
  ours-<mode>     the other gradient mode for that case (separate backward kernel / gradient
                  in the forward)
  ours-noskip     ours reading every pred row, padding included (16 M only)
  ours-op         the registered operator called eagerly (dispatcher cost; smallest case only)
  ours-graph      ours captured in a CUDA graph and replayed: GPU time without the host
                  (smallest and largest case; at 16 M also ours-<mode>-graph)
  torchvision     torchvision.ops.generalized_box_iou_loss with the seed's padding mask, eager
  torchvision-compile   the same under torch.compile
  seed            the seed article's padded loss: element-wise GIoU in plain PyTorch ops
                  (input dtype), mask-multiplied, summed and divided by the valid count
  seed-compile    the same under torch.compile

--focus: 32 x 256 and 16 M only; ours, the other mode, the graph replays, and torchvision
(eager, 32 x 256 only); under a minute.

Roofline: ``bytes`` is pred + target for ``fwd`` and pred + target + pred's gradient for
``fwd+bwd``; ``roofline`` is the time those bytes take at the copy bandwidth measured in
the same run divided by the measured time (1.0 = at the copy ceiling).

Host time: wall-clock microseconds per call over a few hundred calls at 32 x 256 with no
synchronisation inside the loop (the GPU work per call is far shorter, so this is the
host's cost), for ours and for two floors: an autograd.Function that launches nothing
(the autograd engine's own cost) and ``leaf.sum().backward()``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from torchvision.ops import generalized_box_iou_loss

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_utils as bu  # noqa: E402
from snntrain.kernels import giou as K  # noqa: E402
from snntrain.kernels import giou_tuning as GT  # noqa: E402
from snntrain.losses import giou_loss  # noqa: E402

SHAPES = [(32, 256), (256, 4096), (4096, 4096)]
FOCUS_SHAPES = [(32, 256), (4096, 4096)]
DTYPES = [torch.float32, torch.bfloat16]
MODES = ["fwd", "fwd+bwd"]
VALID_FRACTION = 0.5  # the trailing half of every image's targets is padding
HOST_CALLS = 400
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


def case_modes(pred) -> tuple[str, str]:
    """(default gradient mode, the other one) for this case."""
    mode = K.default_grad_mode(pred.numel() // 4, pred.dtype)
    return mode, "separate" if mode == "fused" else "fused"


def ours_op(pred, target):
    return K.giou_loss_op(pred, target, None, "mean", use_op=True)


@contextlib.contextmanager
def no_skip():
    """Read every pred row (padding included) while active."""
    old = K.SKIP_PAD_MIN
    K.SKIP_PAD_MIN = 1 << 62
    try:
        yield
    finally:
        K.SKIP_PAD_MIN = old


def ours_noskip(pred, target):
    with no_skip():
        return giou_loss(pred, target)


def agreement(pred, target, with_seed: bool) -> str:
    """Relative difference of every provider's loss value from torchvision's (a sanity check, not timed)."""
    ref = tv_padded_loss(pred.float(), target.float())
    diffs = []
    providers = [("ours", ours_default), ("fused", ours_mode("fused")), ("separate", ours_mode("separate"))]
    if with_seed:
        providers.append(("seed", seed_padded_loss))
    for name, fn in providers:
        try:
            diffs.append(f"{name} {((fn(pred, target).float() - ref).abs() / ref.abs()).item():.1e}")
        except Exception as e:  # noqa: BLE001
            diffs.append(f"{name} FAILED ({type(e).__name__}: {str(e)[:200]})")
    return "loss vs torchvision (rel): " + ", ".join(diffs)


def grad_agreement(pred, target) -> str:
    """Max |difference| of pred's gradient between the gradient modes (and no-skip), relative to max |grad|."""
    grads = {}
    for name, fn in (("fused", ours_mode("fused")), ("separate", ours_mode("separate")), ("noskip", ours_noskip)):
        p = pred.detach().clone().requires_grad_()
        try:
            fn(p, target).backward()
            grads[name] = p.grad.float()
        except Exception as e:  # noqa: BLE001
            return f"gradient check FAILED in {name} ({type(e).__name__}: {str(e)[:200]})"
    ref = grads["separate"]
    scale = ref.abs().max().clamp(min=1e-30)
    parts = [f"{k} {((g - ref).abs().max() / scale).item():.1e}" for k, g in grads.items() if k != "separate"]
    pad = target[..., 3] <= 0
    zeros = all(bool((g[pad] == 0).all()) for g in grads.values())
    return "grad vs separate (max rel): " + ", ".join(parts) + f"; padding rows all zero: {zeros}"


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


def timed_graph(loss_fn, pred, target, mode: str, quick: bool) -> float:
    """Forward (and backward) captured in one CUDA graph, replays timed (:func:`bench_utils.graph_ms`): the GPU
    time without the host; an error where it cannot be captured (recorded as the provider's failure)."""
    p = pred.detach().clone().requires_grad_()

    def step():
        p.grad = None
        loss = loss_fn(p, target)
        if mode != "fwd":
            loss.backward()
        return loss

    ms, note = bu.graph_ms(step, quick)
    p.grad = None
    if note:
        raise RuntimeError(f"cannot be captured in a CUDA graph: {note}")
    return ms


def nbytes(pred, target, mode: str) -> int:
    n = pred.numel() * pred.element_size() + target.numel() * target.element_size()
    if mode != "fwd":
        n += pred.numel() * pred.element_size()  # pred's gradient
    return n


# ---- host time ---------------------------------------------------------------------------


@triton.jit
def _noop_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


class _NoKernelLoss(torch.autograd.Function):
    """Floor of any autograd.Function loss: no kernels, allocations only (forward: the loss, backward: the gradient)."""

    @staticmethod
    def forward(ctx, pred):
        ctx.pred_shape = pred.shape
        return pred.new_empty(())

    @staticmethod
    def backward(ctx, grad):
        return grad.new_empty(ctx.pred_shape)


def host_us(fn, calls: int = HOST_CALLS) -> tuple[float, float]:
    """(host us per call: wall clock of the loop, no sync inside; us per call including the final sync)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def host_times(dev, other: str) -> list[tuple[str, float, float]]:
    """Host cost per call at 32 x 256 fp32 (see the module docstring)."""
    pred, target = make_case(*SHAPES[0], torch.float32, dev)
    p = pred.detach().clone().requires_grad_()
    leaf = pred.detach().clone().requires_grad_()
    x = torch.empty(1024, device=dev)
    out = []

    def fb(loss_fn):
        def fn():
            loss_fn(p, target).backward()
            p.grad = None
        return fn

    def fb_floor():
        _NoKernelLoss.apply(p).backward()
        p.grad = None

    def fb_sum():
        leaf.sum().backward()
        leaf.grad = None

    def fwd_nograd():
        with torch.no_grad():
            giou_loss(p, target)

    items = [
        ("ours fwd+bwd", fb(ours_default)),
        (f"ours-{other} fwd+bwd", fb(ours_mode(other))),
        ("ours fwd (training: pred requires grad)", lambda: giou_loss(p, target)),
        ("ours fwd under no_grad", fwd_nograd),
        ("floor: autograd.Function fwd+bwd, no kernels", fb_floor),
        ("floor: leaf.sum().backward()", fb_sum),
        ("torch.empty", lambda: torch.empty(1024, device=dev)),
        ("empty Triton kernel launch", lambda: _noop_kernel[(1,)](x, 1024, BLOCK=128)),
    ]
    for name, fn in items:
        try:
            h, w = host_us(fn)
            out.append((name, h, w))
        except Exception as e:  # noqa: BLE001
            log(f"host time of {name} FAILED: {type(e).__name__}: {str(e)[:200]}")
    return out


# ---- summary -----------------------------------------------------------------------------


def provider_mode(provider: str, default_mode: str) -> str | None:
    """The gradient mode a provider of ours runs (None for the baselines)."""
    if not provider.startswith("ours"):
        return None
    for mode in ("fused", "separate"):
        if provider.startswith(f"ours-{mode}"):
            return mode
    return default_mode


def traffic(provider: str, mode: str, v: float, b: float, default_mode: str) -> tuple[float, str] | None:
    """Bytes the provider must move, in units of one box tensor (pred, target and the gradient have equal size).

    T, P, G: target, pred, gradient; v: fraction of valid targets (pred rows of padding
    targets are not read above SKIP_PAD_MIN boxes); b: fraction of FLAG_ROWS-row blocks
    holding a valid target (the fused backward scales only those).
    """
    gm = provider_mode(provider, default_mode)
    vp = 1.0 if provider == "ours-noskip" else v
    pt = "T+P" if provider == "ours-noskip" else "T+vP"
    if gm == "fused":
        if mode == "fwd":
            return 2 + vp, f"{pt}+G"
        return 2 + vp + 2 * b, f"fwd {pt}+G, bwd 2bG"
    if gm == "separate":
        if mode == "fwd":
            return 1 + vp, pt
        return 3 + 2 * vp, f"fwd {pt}, bwd {pt}+G"
    return None


def summary(rows: list[bu.Row], copy_gbps: float, defaults: dict, fractions: dict,
            host: list[tuple[str, float, float]], checks: list[str]) -> str:
    """``defaults``: (dtype, shape) -> the default gradient mode of that case."""
    out = []
    provs = list(dict.fromkeys(r.provider for r in rows))
    key = {(r.mode, r.dtype, r.shape, r.provider): r for r in rows}
    cases = list(dict.fromkeys((r.mode, r.dtype, r.shape) for r in rows))
    short = {p: p.replace("torchvision", "tv").replace("-compile", "-cmp").replace("separate", "sep")
             .replace("-graph", "-gr") for p in provs}
    width = max([10] + [len(v) + 2 for v in short.values()])
    head = f"{'mode':8s} {'dtype':9s} {'shape':16s}" + "".join(f"{short[p]:>{width}s}" for p in provs)
    head += f"{'ours roof':>10s}"
    out.append(f"\nmilliseconds (median); GPU {bu.gpu_name()}; copy bandwidth {copy_gbps:.0f} GB/s; "
               f"ours = default gradient mode (fused, or separate for fp32 above {K.FUSED_MAX_F32} boxes)")
    out.append(head)
    for mode, dtype, shape in cases:
        line = f"{mode:8s} {dtype:9s} {shape:16s}"
        for p in provs:
            r = key.get((mode, dtype, shape, p))
            line += f"{r.ms:{width}.4f}" if r else f"{'-':>{width}s}"
        r = key.get((mode, dtype, shape, "ours"))
        line += f"{r.roofline:10.2f}" if r else ""
        out.append(line)

    out.append("\nTargets")
    small = shape_label(*SHAPES[0])
    floor = {name: h for name, h, _ in host}
    for dtype in ("float32", "bfloat16"):
        o = key.get(("fwd+bwd", dtype, small, "ours"))
        tv = key.get(("fwd+bwd", dtype, small, "torchvision"))
        tvc = key.get(("fwd+bwd", dtype, small, "torchvision-compile"))
        gr = key.get(("fwd+bwd", dtype, small, "ours-graph"))
        if o:
            us = o.ms * 1e3
            msg = (f"  {small} {dtype} fwd+bwd: ours {us:.1f} us eager "
                   f"(target <= 40 us: {'met' if us <= 40 else 'MISSED'})")
            if gr:
                msg += f"; CUDA graph {gr.ms * 1e3:.1f} us ({'met' if gr.ms * 1e3 <= 40 else 'MISSED'})"
            if tv:
                msg += f"; torchvision {tv.ms:.3f} ms = {tv.ms / o.ms:.1f}x eager"
            if tvc:
                msg += f", tv-compile {tvc.ms:.3f} ms = {tvc.ms / o.ms:.1f}x"
            out.append(msg)
    f1 = floor.get("floor: autograd.Function fwd+bwd, no kernels")
    f2 = floor.get("floor: leaf.sum().backward()")
    if f1 is not None and f2 is not None:
        out.append(f"  eager floor on this host: an autograd.Function that launches nothing costs {f1:.1f} us per "
                   f"fwd+bwd, leaf.sum().backward() {f2:.1f} us: an eager loss.backward() cannot meet 40 us "
                   f"here" if min(f1, f2) > 40 else
                   f"  eager floor on this host: autograd.Function without kernels {f1:.1f} us, "
                   f"leaf.sum().backward() {f2:.1f} us")
    big = shape_label(*SHAPES[-1])
    for dtype in ("float32", "bfloat16"):
        v, b = fractions.get(dtype, (VALID_FRACTION, VALID_FRACTION))
        dmode = defaults.get((dtype, big))
        if dmode is None:
            continue
        other = "separate" if dmode == "fused" else "fused"
        lines = []
        for mode in MODES:
            for prov in ("ours", "ours-graph", f"ours-{other}", f"ours-{other}-graph", "ours-noskip"):
                o = key.get((mode, dtype, big, prov))
                if not o:
                    continue
                factor = 1 / o.roofline if o.roofline > 0 else float("inf")
                msg = f"  {mode:7s} {prov:20s} {o.ms:.4f} ms = {factor:.2f}x roofline"
                if prov == "ours":
                    msg += f" (target <= 1.5x: {'met' if factor <= 1.5 else 'MISSED'})"
                t = traffic(prov, mode, v, b, dmode)
                if t:
                    least = t[0] / (2 if mode == "fwd" else 3)
                    msg += f"; moves {least:.2f}x the counted bytes ({t[1]}): {factor / least:.2f}x its own traffic"
                lines.append(msg)
        for mode in MODES:  # what the host adds: eager minus graph replay of the same work
            for prov in ("ours", f"ours-{other}"):
                e, g = key.get((mode, dtype, big, prov)), key.get((mode, dtype, big, f"{prov}-graph"))
                if e and g:
                    lines.append(f"  {mode:7s} {prov:20s} eager - graph = {(e.ms - g.ms) * 1e3:.1f} us "
                                 f"(time the GPU waits for the host)")
        if lines:
            out.append(f"  {big} {dtype}, default mode {dmode} (v={v:.2f} valid rows, b={b:.2f} {K.FLAG_ROWS}-row "
                       f"blocks with a valid row; T, P, G: target, pred, gradient bytes)")
            out += lines
    if host:
        out.append(f"\nHost time per call, {small} float32 (us; wall clock over {HOST_CALLS} calls without a "
                   f"sync inside / with the final sync)")
        for name, h, w in host:
            out.append(f"  {name:48s} {h:8.1f} {w:8.1f}")

    out.append("\nGradient mode (fwd+bwd; eager, and graph replay where measured)")
    for mode, dtype, shape in cases:
        dmode = defaults.get((dtype, shape))
        if mode != "fwd+bwd" or dmode is None:
            continue
        other = "separate" if dmode == "fused" else "fused"
        a, b = key.get((mode, dtype, shape, "ours")), key.get((mode, dtype, shape, f"ours-{other}"))
        if not (a and b):
            continue
        msg = f"  {dtype:9s} {shape:16s} default {dmode}: {a.ms:.4f} ms, {other} {b.ms:.4f} ms"
        ag, bg = key.get((mode, dtype, shape, "ours-graph")), key.get((mode, dtype, shape, f"ours-{other}-graph"))
        if ag and bg:
            msg += f"; graph {dmode} {ag.ms:.4f} ms, {other} {bg.ms:.4f} ms"
        faster = dmode if a.ms <= b.ms else other
        msg += f" -> faster eager: {faster}" + ("" if faster == dmode else " (the default rule picks the other)")
        out.append(msg)

    if checks:
        out.append("\nChecks\n  " + "\n  ".join(checks))

    tuned = []
    for k, (kw, blk, n) in GT.BEST.items():
        name = "fwd (reducing, persistent)" if k[0] is K._fwd_tuned else "bwd"
        dts = "/".join(str(d).replace("torch.", "").replace("float", "f") for d in k[2])
        tuned.append(f"{name} bucket {k[1]} {dts}: BLOCK={blk} warps={kw.get('num_warps')} programs/SM={n}")
    for name, kern in (("fwd (none)", K._fwd_tuned),):
        for k, cfg in getattr(kern, "cache", {}).items():
            tuned.append(f"{name} bucket {k[0]}: BLOCK={cfg.kwargs.get('BLOCK')} warps={cfg.num_warps}")
    if tuned:
        out.append("\nLaunch configurations (tuned once per bucket, dtypes and variant):\n  "
                   + "\n  ".join(sorted(set(tuned))))
    return "\n".join(out)


def markdown(rows: list[bu.Row], copy_gbps: float, text: str) -> str:
    lines = [f"GPU: {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s, {rows[0].date if rows else ''}, "
             f"torch {torch.__version__}, triton {triton.__version__}", "",
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
        p.add_argument("--focus", action="store_true",
                       help="32x256 and 16M only, ours / other mode / graphs, torchvision eager at 32x256 (<1 min)"),
        p.add_argument("--update-docs", action="store_true", help="write the results into docs/benchmarks.md"),
        p.add_argument("--fill-docs", metavar="GIOU_MD", default=None,
                       help="no benchmark: copy a previous run's giou.md into docs/benchmarks.md (no GPU needed)"),
        p.add_argument("--budget", type=float, default=100.0,
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
    focus = args.focus
    defaults: dict[tuple[str, str], str] = {}
    shapes = SHAPES[:1] if args.quick else FOCUS_SHAPES if focus else SHAPES
    rows: list[bu.Row] = []
    skipped: list[str] = []
    failed: list[str] = []
    fractions: dict[str, tuple[float, float]] = {}
    checks: list[str] = []
    for b, k in shapes:
        label = shape_label(b, k)
        smallest = (b, k) == SHAPES[0]
        biggest = (b, k) == SHAPES[-1]
        for dtype in DTYPES:
            dname = str(dtype).replace("torch.", "")
            pred, target = make_case(b, k, dtype, dev)
            checks.append(f"{label} {dname}: {agreement(pred, target, not focus)}")
            log(checks[-1])
            if biggest:
                valid = target[..., 3] > 0
                fractions[dname] = (valid.float().mean().item(),
                                    valid.reshape(-1, K.FLAG_ROWS).any(1).float().mean().item())
                checks.append(f"{label} {dname}: {grad_agreement(pred, target)}")
                log(checks[-1])
            dmode, other = case_modes(pred)
            defaults[(dname, label)] = dmode
            providers = [("ours", ours_default), (f"ours-{other}", ours_mode(other))]
            if biggest and not focus:
                providers.append(("ours-noskip", ours_noskip))
            if smallest and not focus:
                providers.append(("ours-op", ours_op))
            if smallest or not focus:
                providers.append(("torchvision", tv_padded_loss))
            if not focus:
                providers.append(("seed", seed_padded_loss))
            compiled = [] if focus else [("torchvision-compile", tv_padded_loss), ("seed-compile", seed_padded_loss)]

            def record(name, mode, measure, note=""):
                try:
                    ms = measure()
                except Exception as e:  # noqa: BLE001 (keep going: a failing provider must not lose the others' rows)
                    failed.append(f"{name} {mode} {label} {dname}: {type(e).__name__}: {str(e)[:200]}")
                    log(f"FAILED {failed[-1]}")
                    return
                rows.append(bu.Row("giou", "giou_loss", mode, name, dname, label, ms, nbytes(pred, target, mode),
                                   note=note))

            for mode in MODES:
                for name, fn in providers:
                    record(name, mode, lambda: timed(fn, pred, target, mode, args.quick))
                if smallest or biggest:
                    record("ours-graph", mode, lambda: timed_graph(ours_default, pred, target, mode, args.quick),
                           note="CUDA graph replay")
                if biggest:
                    record(f"ours-{other}-graph", mode,
                           lambda: timed_graph(ours_mode(other), pred, target, mode, args.quick),
                           note="CUDA graph replay")
            for name, fn in compiled:
                if time.perf_counter() - T0 > args.budget:
                    skipped.append(f"{name} {label} {dname}")
                    continue
                cfn = torch.compile(fn, dynamic=False)
                for mode in MODES:
                    record(name, mode, lambda: timed(cfn, pred, target, mode, args.quick))
            log(f"done {label} {dtype}")
            pred = target = None  # (not del: the closures above refer to them)
            torch.cuda.empty_cache()
    small_other = "separate" if K.default_grad_mode(SHAPES[0][0] * SHAPES[0][1], torch.float32) == "fused" \
        else "fused"
    host = host_times(dev, small_other)
    log("host times measured")
    bu.finish(rows, copy_gbps, args.out, "giou", "GIoU loss, mean over valid boxes, half the targets padding")
    text = summary(rows, copy_gbps, defaults, fractions, host, checks)
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
