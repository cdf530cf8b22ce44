"""GIoU loss: Triton kernels (compiled on CUDA, interpreted on CPU) against torchvision's autograd.

The oracle is ``torchvision.ops.generalized_box_iou_loss`` evaluated in float64 on the
same input values, with the padding / weight / reduction rules of
:func:`snntrain.losses.giou_loss` applied around it, and differentiated by autograd.
"""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import generalized_box_iou_loss as tv_giou

from _testing import SUMMED, assert_close, capture_cuda_graph
from snntrain.kernels import giou as K
from snntrain.kernels import giou_tuning as GT
from snntrain.losses import GIoULoss, giou_loss, giou_loss_reference

# Tolerances against the float64 oracle on the same input values: the shared table's row of
# the compared tensor's dtype. Low-precision inputs are exact in float64 and the kernels
# compute in fp32, so the loss (fp32, or fp64 for fp64 boxes) gets its own dtype's row whatever
# the input dtype; gradients are rounded to the input's dtype on the way out, and fp32 ones
# (fast divisions on the GPU, cancelling terms) get ``SUMMED`` (:func:`grad_tolerance`).
# Against PyTorch's fp32 reference (another operation order): ``REFERENCE``.
REFERENCE = dict(rtol=2e-5, atol=1e-6)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def rand_boxes(shape, device, dtype=torch.float32, gen=None, scale=10.0):
    """xyxy boxes with positive size."""
    xy = torch.rand(*shape, 2, generator=gen) * scale
    wh = torch.rand(*shape, 2, generator=gen) * scale / 2 + 0.1
    return torch.cat([xy, xy + wh], -1).to(device=device, dtype=dtype)


def pair(shape, device, dtype=torch.float32, seed=0, pad_frac=0.3):
    """Random overlapping-ish pairs; a fraction of the targets are padding (all zeros)."""
    g = torch.Generator().manual_seed(seed)
    target = rand_boxes(shape, "cpu", torch.float64, g)
    pred = target + torch.randn(*shape, 4, generator=g, dtype=torch.float64) * 1.5
    pad = torch.rand(*shape, generator=g) < pad_frac
    target[pad] = 0.0
    return pred.to(device=device, dtype=dtype), target.to(device=device, dtype=dtype)


def ltrb_to_xyxy(b):
    l, t, r, bo = b.unbind(-1)
    return torch.stack([-l, -t, r, bo], -1)


def oracle(pred, target, weight=None, reduction="mean", box_format="xyxy", eps=1e-7, grad_out=None,
           wrt=("pred",)):
    """Loss and gradients from torchvision's autograd in float64 (same input values)."""
    p = pred.detach().double().requires_grad_("pred" in wrt)
    t = target.detach().double().requires_grad_("target" in wrt)
    w = None if weight is None else weight.detach().double().requires_grad_("weight" in wrt)
    pp, tt = (ltrb_to_xyxy(p), ltrb_to_xyxy(t)) if box_format == "ltrb" else (p, t)
    loss = tv_giou(pp, tt, reduction="none", eps=eps)
    valid = t[..., 3] > 0
    if w is not None:
        loss = loss * w
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        loss = loss.sum() / valid.sum().clamp(min=1)
    inputs = [x for x, name in ((p, "pred"), (t, "target"), (w, "weight")) if name in wrt]
    if grad_out is None:
        grad_out = torch.ones_like(loss)
    grads = torch.autograd.grad(loss, inputs, grad_outputs=grad_out.double(), allow_unused=True) if inputs else ()
    return loss.detach(), grads


def ours(pred, target, weight=None, reduction="mean", box_format="xyxy", grad_out=None, wrt=("pred",), **kw):
    p = pred.detach().clone().requires_grad_("pred" in wrt)
    t = target.detach().clone().requires_grad_("target" in wrt)
    w = None if weight is None else weight.detach().clone().requires_grad_("weight" in wrt)
    if "op" in kw:  # call the kernel-level entry (grad_mode / use_op)
        kw.pop("op")
        ww = None if w is None else w.expand(p.shape[:-1])
        loss = K.giou_loss_op(p, t, ww, reduction, 1e-7, box_format == "ltrb", **kw)
    else:
        loss = giou_loss(p, t, w, reduction, box_format=box_format, backend=kw.get("backend", "triton"))
    inputs = [x for x, name in ((p, "pred"), (t, "target"), (w, "weight")) if name in wrt]
    if grad_out is None:
        grad_out = torch.ones_like(loss)
    grads = torch.autograd.grad(loss, inputs, grad_outputs=grad_out) if inputs else ()
    return loss.detach(), grads, (p, t, w)


def grad_tolerance(grad: torch.Tensor) -> dict:
    """The tolerance overrides for a gradient: none (the table's row), ``SUMMED`` for fp32."""
    return SUMMED if grad.dtype == torch.float32 else {}


def compare(pred, target, weight=None, reduction="mean", box_format="xyxy", wrt=("pred",), seed=1, **kw):
    grad_out = None
    if reduction == "none":
        g = torch.Generator().manual_seed(seed)
        grad_out = torch.rand(pred.shape[:-1], generator=g).to(pred.device) + 0.5
    elif reduction == "sum":
        grad_out = torch.tensor(0.75, device=pred.device)
    lo, go, (p, t, w) = ours(pred, target, weight, reduction, box_format, grad_out, wrt, **kw)
    lr, gr = oracle(pred, target, weight, reduction, box_format, grad_out=grad_out, wrt=wrt)
    dtype = pred.dtype
    expect = torch.float64 if dtype == torch.float64 else torch.float32
    assert lo.dtype == expect, lo.dtype
    assert lo.shape == lr.shape
    assert_close(lo, lr, what="loss")
    for name, a, b, x in zip(wrt, go, gr, [{"pred": p, "target": t, "weight": w}[n] for n in wrt]):
        assert a.dtype == x.dtype and a.shape == x.shape, (name, a.dtype, x.dtype, a.shape, x.shape)
        assert torch.isfinite(a).all(), name
        assert_close(a, b, **grad_tolerance(a), what=name)
    return lo, go


# ------------------------------------------------------------------------------------------
# values and gradients
# ------------------------------------------------------------------------------------------

CANONICAL = [  # (pred, target, loss)
    ([0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 2.0], 0.0),  # identical
    ([0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 2.0, 2.0], 0.75),  # quarter box inside
    ([0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 2.0, 1.0], 1.0),  # side by side, touching
    ([0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 2.0, 2.0], 1.5),  # diagonal touch
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_canonical_cases(device, dtype):
    pred = torch.tensor([c[0] for c in CANONICAL], device=device, dtype=dtype)
    target = torch.tensor([c[1] for c in CANONICAL], device=device, dtype=dtype)
    want = torch.tensor([c[2] for c in CANONICAL], dtype=torch.float64)
    lo, _ = compare(pred, target, reduction="none", wrt=("pred", "target"))
    assert_close(lo, want, rtol=0, atol=1e-6, what="canonical losses")


@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_random_boxes(device, dtype, reduction, weighted):
    pred, target = pair((53,), device, dtype, seed=3)
    weight = None
    if weighted:
        weight = (torch.rand(53, generator=torch.Generator().manual_seed(4)) + 0.5).to(device=device, dtype=dtype)
    compare(pred, target, weight, reduction)


@pytest.mark.parametrize("shape", [(37,), (3, 11), (2, 3, 5)])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_shapes(device, shape, reduction):
    pred, target = pair(shape, device, seed=5)
    compare(pred, target, None, reduction)


def test_target_and_weight_grads(device):
    pred, target = pair((3, 17), device, seed=6)
    weight = torch.rand(3, 17, generator=torch.Generator().manual_seed(7)).to(device) + 0.5
    for reduction in ("none", "sum", "mean"):
        compare(pred, target, weight, reduction, wrt=("pred", "target", "weight"))


def test_broadcast_weight(device):
    pred, target = pair((4, 9), device, seed=8)
    weight = torch.rand(4, 1, generator=torch.Generator().manual_seed(9)).to(device) + 0.5
    lo, go, _ = ours(pred, target, weight, "mean", wrt=("pred", "weight"))
    lr, gr = oracle(pred, target, weight.expand(4, 9), "mean", wrt=("pred",))
    assert_close(lo, lr, what="loss")
    assert_close(go[0], gr[0], **SUMMED, what="dpred")
    assert go[1].shape == (4, 1)
    # weight grad of the broadcast weight: sum over the broadcast axis of loss_i / #valid
    per_box = oracle(pred, target, None, "none", wrt=())[0]
    n_valid = (target[..., 3] > 0).sum().clamp(min=1)
    assert_close(go[1], (per_box.sum(1, keepdim=True) / n_valid), **SUMMED, what="dweight")


@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_dtypes(device, dtype):
    pred, target = pair((29,), device, torch.float32, seed=10)
    pred = pred.to(dtype)
    lo, go, (p, t, _) = ours(pred, target, None, "mean", wrt=("pred", "target"))
    lr, gr = oracle(pred, target, None, "mean", wrt=("pred", "target"))
    assert lo.dtype == torch.float32
    assert go[0].dtype == dtype and go[1].dtype == torch.float32
    assert_close(lo, lr, what="loss")
    assert_close(go[0], gr[0], **grad_tolerance(go[0]), what="dpred")
    assert_close(go[1], gr[1], **SUMMED, what="dtarget")


def test_ltrb_matches_xyxy(device):
    g = torch.Generator().manual_seed(11)
    pred = (torch.rand(41, 4, generator=g) * 5 + 0.05).to(device)
    target = (torch.rand(41, 4, generator=g) * 5 + 0.05).to(device)
    target[::5] = 0.0  # padding: b <= 0
    # against the oracle on the converted boxes, values and gradients (incl. the sign flips)
    compare(pred, target, None, "mean", box_format="ltrb", wrt=("pred", "target"))
    # and against our own xyxy path on the converted boxes: same point at the origin, exact
    a = giou_loss(pred, target, reduction="none", box_format="ltrb", backend="triton")
    b = giou_loss(ltrb_to_xyxy(pred), ltrb_to_xyxy(target), reduction="none", backend="triton")
    assert_close(a, b, rtol=0, atol=0, what="ltrb against xyxy")
    # a common point elsewhere: translation-invariant up to rounding (on the non-padding rows,
    # since padding is decided on the shifted y2)
    c = torch.tensor([3.0, 7.0], device=device)
    shift = torch.cat([c, c])
    d = giou_loss(ltrb_to_xyxy(pred) + shift, ltrb_to_xyxy(target) + shift, reduction="none", backend="triton")
    keep = target[:, 3] > 0
    assert_close(a[keep], d[keep], **SUMMED, what="translated")


# ------------------------------------------------------------------------------------------
# degenerate input, ties, padding, empty
# ------------------------------------------------------------------------------------------

DEGENERATE = [  # (pred, target)
    ([1.0, 1.0, 1.0, 3.0], [0.0, 0.0, 2.0, 2.0]),  # zero-width pred
    ([0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.5]),  # zero-width target
    ([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]),  # identical points
    ([2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 4.0, 4.0]),  # point inside a box
    ([3.0, 0.0, 1.0, 2.0], [0.0, 0.0, 2.0, 2.0]),  # inverted pred (x2 < x1)
    ([0.0, 0.0, 2.0, 2.0], [2.0, 0.0, 4.0, 2.0]),  # touching edge
    ([0.0, 0.0, 2.0, 2.0], [2.0, 2.0, 4.0, 4.0]),  # touching corner
    ([0.0, 0.0, 2.0, 2.0], [5.0, 5.0, 6.0, 7.0]),  # far apart
    ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0]),  # all-zero pred
    ([1e-4, 1e-4, 2e-4, 2e-4], [1e-4, 1e-4, 2e-4, 2e-4]),  # tiny identical boxes
    ([0.0, 0.0, 1e4, 1e4], [1.0, 1.0, 2.0, 2.0]),  # huge against small
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_degenerate_boxes(device, dtype):
    pred = torch.tensor([d[0] for d in DEGENERATE], device=device, dtype=dtype)
    target = torch.tensor([d[1] for d in DEGENERATE], device=device, dtype=dtype)
    lo, go = compare(pred, target, None, "none", wrt=("pred", "target"))
    assert torch.isfinite(lo).all()


TIES = [  # coordinates shared between pred and target: min/max ties in every position
    ([0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 2.0]),
    ([0.0, 0.0, 2.0, 3.0], [0.0, 1.0, 2.0, 2.0]),
    ([0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 3.0, 2.0]),
    ([1.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 1.0]),
    ([0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0]),
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_follow_torchvision(device, dtype):
    pred = torch.tensor([t[0] for t in TIES], device=device, dtype=dtype)
    target = torch.tensor([t[1] for t in TIES], device=device, dtype=dtype)
    compare(pred, target, None, "sum", wrt=("pred", "target"))


def test_tie_policy_is_half_split(device):
    """Identical boxes: the loss is at its minimum and the corner gradients split evenly."""
    box = torch.tensor([[0.0, 0.0, 2.0, 4.0]], device=device)
    _, (gp, gt), _ = ours(box, box.clone(), None, "sum", wrt=("pred", "target"))
    torch.testing.assert_close(gp, gt)  # symmetric split between the two boxes
    _, (gr,) = oracle(box, box, None, "sum")
    assert_close(gp, gr, atol=1e-7, what="dpred")


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the interpreter computes on the NaN rows too
def test_padding_rows(device):
    pred, target = pair((6, 8), device, seed=12, pad_frac=0.5)
    # padding rows may hold anything, even non-finite values, in either box
    pad = target[..., 3] <= 0
    target[pad] = torch.tensor([float("nan"), 1.0, float("inf"), -1.0], device=device)
    pred[pad] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0], device=device)
    for reduction in ("none", "sum", "mean"):
        lo, go, _ = ours(pred, target, None, reduction, wrt=("pred", "target"))
        assert torch.isfinite(lo).all()
        for g in go:
            assert torch.isfinite(g).all()
            assert (g[pad] == 0).all()
        keep = ~pad
        lr, gr = oracle(pred[keep], target[keep], None, reduction if reduction != "none" else "none",
                        wrt=("pred", "target"))
        if reduction == "none":
            assert (lo[pad] == 0).all()
            assert_close(lo[keep], lr, what="loss")
        else:
            assert_close(lo, lr, what="loss")
        assert_close(go[0][keep], gr[0], **SUMMED, what="dpred")
        assert_close(go[1][keep], gr[1], **SUMMED, what="dtarget")


def test_all_padding(device):
    pred, target = pair((10,), device, seed=13)
    target.zero_()
    for reduction, want in (("sum", 0.0), ("mean", 0.0)):
        lo, go, _ = ours(pred, target, None, reduction)
        assert lo.item() == want
        assert (go[0] == 0).all()


@pytest.mark.parametrize("shape", [(0, 4), (2, 0, 4)])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_empty_input(device, shape, reduction):
    pred = torch.zeros(shape, device=device, requires_grad=True)
    target = torch.zeros(shape, device=device, requires_grad=True)
    loss = giou_loss(pred, target, reduction=reduction, backend="triton")
    assert loss.dtype == torch.float32
    if reduction == "none":
        assert loss.shape == shape[:-1]
    else:
        assert loss.shape == () and loss.item() == 0.0
    gp, gt = torch.autograd.grad(loss.sum(), (pred, target))
    assert gp.shape == shape and gt.shape == shape


# ------------------------------------------------------------------------------------------
# layouts, launch paths, grad modes
# ------------------------------------------------------------------------------------------


def test_strided_and_expanded_inputs(device):
    pred, target = pair((12,), device, seed=14)
    wide = torch.zeros(12, 7, device=device)
    wide[:, 1:5] = pred
    p_strided = wide[:, 1:5]  # row stride 7
    t_cols = target.t().contiguous().t()  # last-dim stride 12: copied
    compare(p_strided, t_cols, None, "mean")
    t_one = target[3:4].expand(12, 4)  # stride 0 rows
    compare(pred, t_one, None, "none")
    p3 = pred.view(3, 4, 4).transpose(0, 1)  # no flat view: copied
    compare(p3, target.view(3, 4, 4).transpose(0, 1), None, "sum")


@pytest.fixture
def small_thresholds(monkeypatch):
    """Force the multi-program forward (partials + finalize, per-block flags and the scale kernel in the
    fused backward), the tuned launches and the skipped pred rows of padding targets on small inputs."""
    monkeypatch.setattr(K, "SINGLE_MAX", 16)
    monkeypatch.setattr(K, "SMALL_MAX", 16)
    monkeypatch.setattr(K, "SKIP_PAD_MIN", 16)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_multi_program_path(device, small_thresholds, reduction):
    pred, target = pair((300,), device, seed=15)
    weight = torch.rand(300, generator=torch.Generator().manual_seed(16)).to(device)
    compare(pred, target, weight, reduction, wrt=("pred", "target"))


def test_deterministic(device, small_thresholds):
    pred, target = pair((500,), device, seed=17)
    a = [giou_loss(pred, target, backend="triton") for _ in range(3)]
    assert all(torch.equal(a[0], x) for x in a[1:])


@pytest.mark.parametrize("grad_mode", ["separate", "fused"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_grad_modes(device, grad_mode, reduction):
    pred, target = pair((2, 13), device, seed=18)
    weight = torch.rand(2, 13, generator=torch.Generator().manual_seed(19)).to(device) + 0.5
    compare(pred, target, weight, reduction, wrt=("pred", "target"), op=True, grad_mode=grad_mode)
    compare(pred, target, weight, reduction, wrt=("pred", "weight"), op=True, grad_mode=grad_mode)


@pytest.mark.parametrize("grad_mode", ["separate", "fused"])
def test_registered_op_path(device, grad_mode):
    pred, target = pair((21,), device, seed=20)
    compare(pred, target, None, "mean", wrt=("pred", "target"), op=True, grad_mode=grad_mode, use_op=True)
    assert hasattr(torch.ops.snntrain, "giou_loss") and hasattr(torch.ops.snntrain, "giou_loss_backward")


def test_fused_bf16(device):
    pred, target = pair((33,), device, torch.bfloat16, seed=21)
    compare(pred, target, None, "mean", op=True, grad_mode="fused")


def test_default_grad_mode():
    """Fused for 16-bit boxes and up to FUSED_MAX_F32 fp32 / fp64 boxes, separate above (from the H200 runs)."""
    big = K.FUSED_MAX_F32 + 1
    assert K.default_grad_mode(32 * 256, torch.float32) == "fused"
    assert K.default_grad_mode(K.FUSED_MAX_F32, torch.float32) == "fused"
    assert K.default_grad_mode(big, torch.float32) == "separate"
    assert K.default_grad_mode(big, torch.float64) == "separate"
    assert K.default_grad_mode(big, torch.bfloat16) == "fused"
    assert K.default_grad_mode(big, torch.float16) == "fused"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_default_grad_mode_used(device, monkeypatch, dtype):
    """giou_loss follows default_grad_mode: a fused forward writes a gradient buffer, a separate one does not."""
    monkeypatch.setattr(K, "FUSED_MAX_F32", 16)
    seen = []
    real = K.giou_forward

    def spy(*args, **kwargs):
        seen.append(args[6])  # fused: which gradient buffers the forward writes
        return real(*args, **kwargs)

    monkeypatch.setattr(K, "giou_forward", spy)
    for n in (16, 17):
        pred, target = pair((n,), device, dtype, seed=60)
        p = pred.clone().requires_grad_()
        giou_loss(p, target, backend="triton").backward()
        want = K.default_grad_mode(n, dtype)
        assert seen[-1] == (1 if want == "fused" else 0), (n, dtype, seen)
        _, (gr,) = oracle(pred, target, None, "mean")
        assert_close(p.grad, gr, **grad_tolerance(p.grad), what="dpred")


def padded_runs(b, k, device, dtype=torch.float32, seed=40, valid=0.5):
    """[b, k] pairs whose trailing part of every row of targets is padding (runs of padding rows)."""
    pred, target = pair((b, k), device, dtype, seed=seed, pad_frac=0.0)
    target[:, round(k * valid):] = 0.0
    return pred, target


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_flags_skip_padding_blocks(device, small_thresholds, reduction, weighted):
    """Multi-program fused path: blocks of FLAG_ROWS padding rows are skipped by the backward scale kernel."""
    pred, target = padded_runs(3, 4 * K.FLAG_ROWS, device)  # each row: 2 blocks valid, 2 blocks padding
    weight = None
    if weighted:
        weight = torch.rand(3, 4 * K.FLAG_ROWS, generator=torch.Generator().manual_seed(41)).to(device) + 0.5
    lo, go = compare(pred, target, weight, reduction, wrt=("pred", "target"))
    pad = target[..., 3] <= 0
    assert (go[0][pad] == 0).all() and (go[1][pad] == 0).all()


def test_fused_flags_values(device, small_thresholds):
    """The forward's flags say which FLAG_ROWS-row blocks hold a valid target; the scale kernel leaves the others."""
    pred, target = padded_runs(2, 4 * K.FLAG_ROWS, device, seed=50, valid=0.3)
    target[1, :3] = 0.0
    loss, denom, gp, gt, flags = K.giou_forward(pred, target, None, K._MEAN, 1e-7, False, 1, eager=True)
    want = (target[..., 3] > 0).reshape(-1, K.FLAG_ROWS).any(1)
    assert flags.dtype == torch.int8 and torch.equal(flags.bool(), want)
    buf = gp.clone()
    buf.view(-1, K.FLAG_ROWS, 4)[~want] = 7.0  # marks: a skipped block must keep them
    K._scale_in_place(buf, torch.tensor(2.0, device=device), denom, flags, K._MEAN)
    assert (buf.view(-1, K.FLAG_ROWS, 4)[~want] == 7.0).all()
    torch.testing.assert_close(buf.view(-1, K.FLAG_ROWS, 4)[want], (gp * 2.0 / denom).view(-1, K.FLAG_ROWS, 4)[want])


def test_fused_flags_one_per_block(device, small_thresholds, monkeypatch):
    """FLAG_ROWS equal to the forward's block (one flag per tile), padding scattered and in runs."""
    monkeypatch.setattr(K, "FLAG_ROWS", GT.FWD_CONFIGS[0].kwargs["BLOCK"])
    pred, target = padded_runs(2, 3 * K.FLAG_ROWS + 5, device, seed=42)
    target[0, :7] = 0.0
    for reduction in ("sum", "mean"):
        compare(pred, target, None, reduction, wrt=("pred",))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_fused_strided_multi_program(device, small_thresholds, reduction):
    """Runtime row stride (no ROW4) on the multi-program fused path."""
    pred, target = padded_runs(4, 40, device, seed=43)
    wide = torch.zeros(4, 40, 6, device=device)
    wide[..., 1:5] = pred
    compare(wide[..., 1:5], target, None, reduction, wrt=("pred", "target"))


def test_fused_gradient_not_copied(device, monkeypatch):
    """The fused buffer becomes pred.grad itself: scaled in place, handed to autograd without a copy."""
    seen = []
    real = K.giou_forward

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out[2].data_ptr())
        return out

    monkeypatch.setattr(K, "giou_forward", spy)
    pred, target = pair((5, 7), device, seed=44)
    p = pred.clone().requires_grad_()
    giou_loss(p, target, backend="triton").backward()
    assert p.grad is not None and p.grad.data_ptr() == seen[0]
    _, (gr,) = oracle(pred, target, None, "mean")
    assert_close(p.grad, gr, **SUMMED, what="dpred")


@pytest.mark.parametrize("multi", [False, True])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_retain_graph_second_backward(device, monkeypatch, multi, reduction):
    """A second backward through a retained graph (the fused buffer is consumed) gives the same gradient."""
    if multi:
        monkeypatch.setattr(K, "SINGLE_MAX", 16)
        monkeypatch.setattr(K, "SMALL_MAX", 16)
    pred, target = pair((3, 30), device, seed=45)
    p = pred.clone().requires_grad_()
    t = target.clone().requires_grad_()
    loss = giou_loss(p, t, reduction=reduction, backend="triton")
    g = torch.rand(loss.shape, generator=torch.Generator().manual_seed(46)).to(device) + 0.5
    g1 = torch.autograd.grad(loss, (p, t), g, retain_graph=True)
    g2 = torch.autograd.grad(loss, (p, t), g)
    for a, b in zip(g1, g2):
        assert_close(a, b, what="second backward")
    _, gr = oracle(pred, target, None, reduction, grad_out=g, wrt=("pred", "target"))
    assert_close(g1[0], gr[0], **SUMMED, what="dpred")
    assert_close(g1[1], gr[1], **SUMMED, what="dtarget")


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_no_grad_forward_skips_autograd(device, reduction):
    pred, target = pair((4, 9), device, seed=47)
    want = giou_loss_reference(pred, target, reduction=reduction)
    with torch.no_grad():
        a = giou_loss(pred.clone().requires_grad_(), target, reduction=reduction, backend="triton")
    b = giou_loss(pred, target, reduction=reduction, backend="triton")  # nothing requires grad
    for x in (a, b):
        assert x.grad_fn is None and not x.requires_grad
        assert_close(x, want, **REFERENCE, what="loss")


@pytest.mark.parametrize("multi", [False, True])
def test_fcos_style_call(device, monkeypatch, multi):
    """As fcos_loss calls it: ltrb [B, L, 4], background rows all zeros (padding), sum."""
    if multi:
        monkeypatch.setattr(K, "SINGLE_MAX", 16)
        monkeypatch.setattr(K, "SMALL_MAX", 16)
        monkeypatch.setattr(K, "SKIP_PAD_MIN", 16)
    g = torch.Generator().manual_seed(48)
    pred = (torch.rand(2, 150, 4, generator=g) * 5 + 0.05).to(device)
    target = (torch.rand(2, 150, 4, generator=g) * 5 + 0.05).to(device)
    target[torch.rand(2, 150, generator=g) < 0.8] = 0.0  # background
    target[1, 40:] = 0.0  # and a long run of it
    compare(pred, target, None, "sum", box_format="ltrb", wrt=("pred",))
    p = pred.clone().requires_grad_()
    r = pred.clone().requires_grad_()
    a = giou_loss(p, target, reduction="sum", box_format="ltrb", backend="triton")
    b = giou_loss(r, target, reduction="sum", box_format="ltrb", backend="torch")
    (a / 7.0).backward()
    (b / 7.0).backward()
    assert_close(a, b, rtol=2e-5, atol=1e-5, what="loss")
    assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-6, what="dpred")


def test_launch_config_cached(device, small_thresholds, monkeypatch):
    """After the first (tuning) call, large launches reuse the cached configuration; first and later calls agree.

    Which configuration wins depends on the GPU; this checks that one of the listed ones is
    cached once and reused, not which.
    """
    monkeypatch.setattr(GT, "PROGRAMS_PER_SM", 1)  # the tuning grid differs from the cached one
    tunes = []
    real = GT.tune_persistent
    monkeypatch.setattr(GT, "tune_persistent", lambda *a, **k: tunes.append(1) or real(*a, **k))
    pred, target = pair((200,), device, seed=49)
    p = pred.clone().requires_grad_()
    GT.BEST.clear()
    first = giou_loss(p, target, backend="triton")
    first.backward()
    g_first = p.grad
    assert len(GT.BEST) == 1 and len(tunes) == 1
    kwargs, block, per_sm = next(iter(GT.BEST.values()))
    assert (block, kwargs["num_warps"]) in {(c.kwargs["BLOCK"], c.num_warps) for c in GT.FWD_CONFIGS}
    assert per_sm >= 1
    p.grad = None
    again = giou_loss(p, target, backend="triton")
    again.backward()
    assert len(GT.BEST) == 1 and len(tunes) == 1  # cached: not tuned again
    assert torch.equal(first, again) and torch.equal(g_first, p.grad)
    _, (gr,) = oracle(pred, target, None, "mean")
    assert_close(p.grad, gr, **SUMMED, what="dpred")


def test_tune_persistent_picks_fastest(device, small_thresholds, monkeypatch):
    """The reducing forward's tuner times every configuration and keeps the fastest (the first on a tie)."""
    import triton

    configs = [triton.Config({"BLOCK": 32}, num_warps=4), triton.Config({"BLOCK": 64}, num_warps=4),
               triton.Config({"BLOCK": 128}, num_warps=4)]
    monkeypatch.setattr(GT, "FWD_CONFIGS", configs)
    times = iter([3.0, 1.0, 1.0])
    timed = []

    def fake_bench(fn):
        fn()  # the launch it would time must run
        timed.append(1)
        return next(times)

    monkeypatch.setattr(GT, "bench_launch", fake_bench)
    GT.BEST.clear()
    pred, target = pair((300,), device, seed=61)
    for reduction in ("sum", "mean"):
        compare(pred, target, None, reduction, wrt=("pred",))
        if reduction == "sum":
            assert len(timed) == 3
            kwargs, block, per_sm = next(iter(GT.BEST.values()))
            assert block == 64 and kwargs["num_warps"] == 4
            times = iter([1.0, 2.0, 3.0])
    assert len(GT.BEST) == 2 and len(timed) == 6
    GT.BEST.clear()


def test_eps_is_compile_time():
    """eps reaches the kernels as a constexpr. A runtime float argument is an fp32 parameter of the
    compiled kernel (so fp64 boxes would get an fp32-rounded eps) but stays a Python float in the CPU
    interpreter, which would hide the difference from the CPU tests."""
    import inspect

    for kernel in (K._giou_fwd_kernel, K._giou_bwd_kernel):
        params = inspect.signature(kernel.fn).parameters
        assert "eps" not in params and "constexpr" in str(params["EPS"].annotation)


def test_float64_eps_exact(device):
    """fp64 boxes use the exact double eps: tiny boxes, where eps dominates the union."""
    box = torch.tensor([[1e-4, 1e-4, 2e-4, 2e-4]], device=device, dtype=torch.float64)
    loss = giou_loss(box, box.clone(), reduction="none", backend="triton")
    side = 2e-4 - 1e-4
    want = 1 - side * side / (side * side + 1e-7)
    # fp64 rounding differences (contracted multiply-adds) are ~1e-16; an fp32-rounded eps is off by 1e-9
    assert abs(loss.item() - want) <= 1e-13 * want, (loss.item(), want)


def test_programs_per_sm():
    class Kern:
        n_regs = 128

    assert GT.programs_per_sm(Kern(), 4) == 4  # 128 regs x 128 threads: 4 of 64 K registers
    Kern.n_regs = 133  # rounded up per warp to 136
    assert GT.programs_per_sm(Kern(), 4) == 3
    Kern.n_regs = 32
    assert GT.programs_per_sm(Kern(), 4) == 16  # thread limit 2048
    assert GT.programs_per_sm(object(), 4) == GT.PROGRAMS_PER_SM


# ------------------------------------------------------------------------------------------
# hand-written gradient: float64 gradcheck of the kernels
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("box_format", ["xyxy", "ltrb"])
def test_gradcheck_float64(device, reduction, box_format):
    """The Triton kernels run in float64 (backend='triton'); boxes away from ties and kinks."""
    g = torch.Generator().manual_seed(22)
    if box_format == "xyxy":
        pred, target = pair((4,), device, torch.float64, seed=23, pad_frac=0.0)
        target[3] = torch.tensor([1.0, 1.0, 2.0, -1.0])  # one padding row (away from the y2 = 0 boundary)
    else:
        pred = (torch.rand(4, 4, generator=g, dtype=torch.float64) * 3 + 0.3).to(device)
        target = (torch.rand(4, 4, generator=g, dtype=torch.float64) * 3 + 0.3).to(device)
    weight = (torch.rand(4, generator=g, dtype=torch.float64) + 0.5).to(device)
    pred.requires_grad_()
    target.requires_grad_()
    weight.requires_grad_()

    def f(p, t, w):
        return giou_loss(p, t, w, reduction, box_format=box_format, backend="triton")

    assert torch.autograd.gradcheck(f, (pred, target, weight), eps=1e-6, atol=1e-7, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# reference path, module, backends, errors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_reference_matches_oracle(reduction):
    pred, target = pair((3, 7), "cpu", seed=24)
    weight = torch.rand(3, 7, generator=torch.Generator().manual_seed(25)) + 0.5
    compare(pred, target, weight, reduction, wrt=("pred", "target", "weight"), backend="torch")
    compare(pred.double(), target.double(), None, reduction, wrt=("pred",), backend="torch")
    compare(pred, target, None, reduction, box_format="ltrb", backend="torch")


def test_reference_matches_kernels(device):
    pred, target = pair((40,), device, torch.bfloat16, seed=26)
    for reduction in ("none", "mean"):
        a = giou_loss(pred, target, reduction=reduction, backend="triton")
        b = giou_loss_reference(pred, target, reduction=reduction)
        assert_close(a, b, **REFERENCE, what="loss")


def test_auto_backend_on_cpu():
    pred, target = pair((9,), "cpu", seed=27)
    a = giou_loss(pred, target)  # auto: CPU tensors use the reference
    b = giou_loss_reference(pred, target)
    torch.testing.assert_close(a, b)


def test_module(device):
    pred, target = pair((2, 5), device, seed=28)
    m = GIoULoss(reduction="sum", backend="triton")
    assert "reduction='sum'" in repr(m)
    torch.testing.assert_close(m(pred, target), giou_loss(pred, target, reduction="sum", backend="triton"))
    assert list(m.state_dict()) == []


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(pred=torch.zeros(3, 5)), ValueError, r"shape \[\.\.\., 4\].*\(3, 5\)"),
        (dict(pred=torch.zeros(())), ValueError, r"shape \[\.\.\., 4\]"),
        (dict(target=torch.zeros(4, 4)), ValueError, r"same shape as pred \(3, 4\); got \(4, 4\)"),
        (dict(weight=torch.ones(4)), ValueError, r"weight must have shape \(3,\).*got \(4,\)"),
        (dict(weight=torch.ones(3, 2)), ValueError, r"weight must have shape \(3,\)"),
        (dict(weight=[1.0, 2.0, 3.0]), TypeError, r"weight must be a tensor"),
        (dict(reduction="avg"), ValueError, r"reduction='avg' is not valid; choose one of 'none', 'sum', 'mean'"),
        (dict(box_format="cxcywh"), ValueError, r"box_format='cxcywh' is not valid; choose one of 'xyxy', 'ltrb'"),
        (dict(backend="cuda"), ValueError, r"backend='cuda' is not valid"),
        (dict(eps=-1.0), ValueError, r"eps=-1.0 is not valid"),
        (dict(pred=torch.zeros(3, 4, dtype=torch.int64)), TypeError, r"float16, bfloat16, float32 or float64"),
        (dict(pred=[[0.0] * 4] * 3), TypeError, r"must be tensors"),
    ],
)
def test_errors(kwargs, err, match):
    args = dict(pred=torch.zeros(3, 4), target=torch.zeros(3, 4), weight=None, reduction="mean", eps=1e-7,
                box_format="xyxy", backend="torch")
    args.update(kwargs)
    with pytest.raises(err, match=match):
        giou_loss(args.pop("pred"), args.pop("target"), args.pop("weight"), args.pop("reduction"), args.pop("eps"),
                  **args)


def test_module_errors():
    with pytest.raises(ValueError, match="reduction="):
        GIoULoss(reduction="max")
    with pytest.raises(ValueError, match="box_format="):
        GIoULoss(box_format="xywh")


# ------------------------------------------------------------------------------------------
# integration: profiler, torch.compile, CUDA graphs
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_op", [False, True])
def test_visible_in_profiler(device, use_op):
    pred, target = pair((16,), device, seed=29)
    pred.requires_grad_()
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        K.giou_loss_op(pred, target, None, "mean", use_op=use_op).backward()
    names = {e.key for e in prof.key_averages()}
    assert "snntrain::giou_loss" in names, sorted(names)
    assert "snntrain::giou_loss_backward" in names, sorted(names)


class _NoOptionCache(dict):
    """Stands in for losses._OPTIONS: any use while compiling fails the compile (fullgraph)."""

    def get(self, key, default=None):
        if torch.compiler.is_compiling():
            raise AssertionError("giou_loss used its option cache while torch.compile traced it")
        return super().get(key, default)


def test_torch_compile_fullgraph(device, monkeypatch):
    """giou_loss under torch.compile(fullgraph=True), values and gradients against eager.

    Whether dynamo can trace a dict lookup keyed on a type object depends on the torch
    version (it could not in torch 2.11), so the test also checks that giou_loss does not
    use its option cache while compiling, whatever the installed torch can trace.
    """
    import torch._dynamo

    from snntrain import losses

    monkeypatch.setattr(losses, "_OPTIONS", _NoOptionCache())
    torch._dynamo.reset()
    pred, target = pair((4, 6), device, seed=30)
    weight = torch.rand(4, 6, generator=torch.Generator().manual_seed(31)).to(device)

    def loss_fn(p, t, w):
        return giou_loss(p, t, w, "mean", backend="triton") + 0.5 * giou_loss(p, t, None, "sum", backend="triton")

    # AOTAutograd traces forward and backward together; the backward runs on .backward().
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    compiled = torch.compile(loss_fn, fullgraph=True, backend=backend)
    p1 = pred.clone().requires_grad_()
    p2 = pred.clone().requires_grad_()
    l1 = compiled(p1, target, weight)
    l1.backward()
    l2 = loss_fn(p2, target, weight)
    l2.backward()
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(p1.grad, p2.grad)


@pytest.mark.gpu
def test_cuda_graph_capture(device):
    pred, target = pair((32, 256), device, seed=32, pad_frac=0.5)
    p = pred.clone().requires_grad_()

    def step():
        p.grad = None
        loss = giou_loss(p, target)
        loss.backward()
        return loss

    graph, loss = capture_cuda_graph(step, warmup=3)  # compile and tune outside the capture
    new = rand_boxes((32, 256), device, gen=torch.Generator().manual_seed(33))
    with torch.no_grad():
        p.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    lr, (gr,) = oracle(new, target, None, "mean")
    assert_close(loss, lr, what="loss")
    assert_close(p.grad, gr, **SUMMED, what="dpred")
