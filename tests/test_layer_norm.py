"""Triton layer-norm (snntrain.kernels.layer_norm) and the LayerNorm / LayerNorm2d modules.

Everything is checked against torch.nn.functional.layer_norm run in fp64 on the same
(rounded) inputs, with channels moved last for the channels-first case. On a machine
without CUDA the kernels run in Triton's interpreter (see conftest.py), so shapes are small.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from _testing import SUMMED, TOLERANCES, assert_close, capture_cuda_graph
from snntrain.kernels import layer_norm as K
from snntrain.kernels import layer_norm_tuning as LT
from snntrain.models.sew_resnet import SEWResNet
from snntrain.nn import LayerNorm, LayerNorm2d, build_norm2d, set_backend

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Tolerances against the fp64 reference. y (of order 1): the shared table's rtol, and atol = rtol.
# Gradients: the backward's two row reductions and the dW/dB partial sums, in fp32, against fp64:
# rtol = GRAD_RTOL[dtype] and atol = rtol * max(|reference|, 1) (a difference of terms of that size).
GRAD_RTOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def _inputs(shape, dim, dtype, device, affine=True, param_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    C = shape[dim]
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(device=device, dtype=dtype)
    dy = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    pd = param_dtype or dtype
    w = (torch.rand(C, generator=g) + 0.5).to(device=device, dtype=pd) if affine else None
    b = torch.randn(C, generator=g).to(device=device, dtype=pd) if affine else None
    return x, dy, w, b


def _reference(x, dy, w, b, eps, dim):
    """y, dx, dw, db of F.layer_norm in fp64, channels moved last and back."""
    xr = x.detach().double().movedim(dim, -1).requires_grad_()
    wr = None if w is None else w.detach().double().requires_grad_()
    br = None if b is None else b.detach().double().requires_grad_()
    y = F.layer_norm(xr, (xr.shape[-1],), wr, br, eps)
    y.backward(dy.double().movedim(dim, -1))
    return (y.detach().movedim(-1, dim), xr.grad.movedim(-1, dim), None if w is None else wr.grad,
            None if b is None else br.grad)


def _ours(x, dy, w, b, eps, dim):
    x = x.detach().requires_grad_()
    w = None if w is None else w.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    y = K.layer_norm(x, w, b, eps, dim)
    y.backward(dy)
    return y.detach(), x.grad, None if w is None else w.grad, None if b is None else b.grad


def _close_scaled(got, ref, tol, what):
    """rtol = ``tol`` and atol = ``tol`` * max(|ref|, 1)."""
    assert_close(got, ref, rtol=tol, atol=tol * max(ref.abs().max().item(), 1.0), what=what)


def _close_grad(got, ref, what, dtype=None):
    """``got`` against the fp64 reference with the gradient tolerance of ``dtype`` (``got``'s by default)."""
    _close_scaled(got, ref, GRAD_RTOL[dtype or got.dtype], what)


def _check(x, dy, w, b, dim, eps=1e-5):
    y, dx, dw, db = _ours(x, dy, w, b, eps, dim)
    ry, rdx, rdw, rdb = _reference(x, dy, w, b, eps, dim)
    assert y.dtype == x.dtype and dx.dtype == x.dtype
    tol = TOLERANCES[y.dtype][0]
    assert_close(y, ry, rtol=tol, atol=tol, what="y")
    _close_grad(dx, rdx, "dx")
    if w is not None:
        assert dw.dtype == w.dtype and db.dtype == b.dtype
        _close_grad(dw, rdw, "dw", x.dtype)
        _close_grad(db, rdb, "db", x.dtype)
    return y, dx, dw, db


@pytest.fixture
def small_blocks(monkeypatch):
    """Shrink the tiles so that rows of a few hundred channels take the looped path."""
    monkeypatch.setattr(K.TUNING, "fwd_tile", 128)
    monkeypatch.setattr(K.TUNING, "cf_fwd_tile", 128)
    monkeypatch.setattr(K.TUNING, "bwd_tile", 128)
    monkeypatch.setattr(K.TUNING, "max_tile", 256)
    monkeypatch.setattr(K.TUNING, "loop_tile", 128)
    monkeypatch.setattr(K.TUNING, "cf_min_block_s", 8)


# --------------------------------------------------------------------------- rows [*, C]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("C", [1, 3, 67, 1000])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_rows_match_torch(device, dtype, C, affine):
    shape = (3, 5, C) if C < 1000 else (7, C)
    _check(*_inputs(shape, -1, dtype, device, affine), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("C", [300, 1000])
def test_rows_longer_than_one_block(device, dtype, C, small_blocks):
    x, dy, w, b = _inputs((5, C), -1, dtype, device)
    plan = LT.plan_fwd(x, 1, LT.find_split(x, 1))
    assert not plan.single and plan.block_c < C
    assert not LT.plan_bwd(x, 1, LT.find_split(x, 1), True).single
    _check(x, dy, w, b, dim=-1)


@pytest.mark.parametrize("dim,shape", [(-1, (9, 300)), (-3, (2, 67, 4, 5))], ids=["rows", "channels_first"])
def test_separate_weight_grad_pass(device, monkeypatch, dim, shape):
    """Rows longer than fused_dw_max_c: fused dx, dW/dB in a column-split pass of their own."""
    monkeypatch.setattr(K.TUNING, "fused_dw_max_c", 64)
    monkeypatch.setattr(K.TUNING, "dw_block_c", 32)
    monkeypatch.setattr(K.TUNING, "dw_tile", 256)
    _check(*_inputs(shape, dim, torch.float16, device), dim=dim)


@pytest.mark.parametrize("which", ["dw", "db"])
def test_only_one_param_grad(device, which):
    """The finishing sum writes only the requested gradient (grid of one part, either one)."""
    x, dy, w, b = _inputs((40, 67), -1, torch.float16, device)
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_(which == "dw")
    b = b.detach().requires_grad_(which == "db")
    K.layer_norm(x, w, b, 1e-5, -1).backward(dy)
    _ry, rdx, rdw, rdb = _reference(x, dy, w, b, 1e-5, -1)
    _close_grad(x.grad, rdx, "dx")
    if which == "dw":
        assert b.grad is None
        _close_grad(w.grad, rdw, "dw")
    else:
        assert w.grad is None
        _close_grad(b.grad, rdb, "db")


def test_stats_outputs_not_differentiable(device):
    x, dy, w, b = _inputs((6, 33), -1, torch.float32, device)
    x.requires_grad_()
    y, mean, rstd = torch.ops.snntrain.layer_norm_fwd(x, w, b, -1, 1e-5)
    assert y.requires_grad and not mean.requires_grad and not rstd.requires_grad


def test_mixed_dtypes_params_fp32(device):
    x, dy, w, b = _inputs((6, 67), -1, torch.bfloat16, device, param_dtype=torch.float32)
    y, dx, dw, db = _check(x, dy, w, b, dim=-1)
    assert dw.dtype == torch.float32 and dx.dtype == torch.bfloat16


def test_rows_non_contiguous(device):
    base, dbase, w, b = _inputs((12, 2 * 67), -1, torch.float32, device)
    _check(base[:, ::2], dbase[:, ::2], w[::2], b[1::2], dim=-1)  # strided channels and parameters
    base, dbase, w, b = _inputs((67, 40), 0, torch.float32, device)
    _check(base.t(), dbase.t(), w, b, dim=-1)  # a [C, M] buffer seen as [M, C]
    base, dbase, w, b = _inputs((4, 9, 33), -1, torch.float16, device)
    _check(base[:, 2:7], dbase[:, 1:6], w, b, dim=-1)  # rows in two strided groups
    x, dy, w, b = _inputs((1, 33), -1, torch.float32, device)
    _check(x.expand(6, 33), dy.expand(6, 33).contiguous(), w, b, dim=-1)  # stride-0 rows
    x, dy, w, b = _inputs((8, 33), -1, torch.float32, device)
    _check(x, dy.t().contiguous().t(), w, b, dim=-1)  # dy in another layout than x


# --------------------------------------------------------------------------- channels-first


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 1, 5, 7), (2, 3, 5, 7), (2, 67, 3, 6), (2, 3, 1, 5, 7), (2, 2, 67, 4, 5)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_channels_first_match_torch(device, dtype, shape, affine):
    _check(*_inputs(shape, -3, dtype, device, affine), dim=-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_channels_first_longer_than_one_block(device, dtype, small_blocks):
    x, dy, w, b = _inputs((2, 2, 67, 4, 5), -3, dtype, device)
    plan = LT.plan_fwd(x, 2, 0)
    assert not plan.single and plan.s_unit
    _check(x, dy, w, b, dim=-3)


@pytest.mark.parametrize("hw", [(5, 7), (3, 6), (4, 5), (4, 4)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("separate", [True, False], ids=["separate_dw", "fused_dw"])
def test_channels_first_map_sizes(device, monkeypatch, hw, separate):
    """H*W odd, 2 mod 4, 0 mod 4 (compiled in: not a multiple of 16) and 16; dW/dB fused or in their own pass."""
    monkeypatch.setattr(K.TUNING, "cf_unaligned_separate_dw", separate)
    x, dy, w, b = _inputs((3, 2, 24, *hw), -3, torch.float16, device)
    d = x.dim() - 3
    split = LT.find_split(x, d)
    p = LT.plan_bwd(x, d, split, True)
    s3 = LT.strides3(x, d, split)
    S = hw[0] * hw[1]
    assert LT.const_s(p, s3) == (S if S % 16 else 0)
    assert LT.separate_dwdb(x, d, split) == (separate and S % 4 != 0)
    _check(x, dy, w, b, dim=-3)


def test_channels_first_layouts(device):
    x, dy, w, b = _inputs((2, 12, 5, 6), 1, torch.float32, device)
    cl = x.contiguous(memory_format=torch.channels_last)
    y, dx, _, _ = _check(cl, dy, w, b, dim=-3)  # channels-last, read in place
    assert y.is_contiguous(memory_format=torch.channels_last)
    _check(x[::2], dy[::2], w, b, dim=-3)  # sliced batch
    _check(x[:, :, :, :4], dy[:, :, :, :4], w, b, dim=-3)  # H, W do not merge: copied once
    x5, dy5, w5, b5 = _inputs((3, 4, 12, 4, 5), 2, torch.float16, device)
    _check(x5[:, ::2], dy5[:, 1:3], w5, b5, dim=-3)  # strided [T, B] (merges); dy's T, B do not merge
    _check(x5[:, :3], dy5[:, 1:], w5, b5, dim=-3)  # T, B do not merge: x copied once


def test_strided_views():
    """How tensors map onto [B0, S, C] strides; a size-1 group gets stride 0 (keeps Triton's alignment facts)."""
    x = torch.empty(10, 64)
    assert LT.find_split(x, 1) == 0 and LT.strides3(x, 1, 0) == (0, 64, 1)
    cf = torch.empty(2, 3, 8, 5, 7)
    assert LT.strides3(cf, 2, 0) == (8 * 35, 1, 35)
    cl = torch.empty(2, 8, 5, 7).contiguous(memory_format=torch.channels_last)
    assert LT.strides3(cl, 1, 0) == (280, 8, 1)
    rows = torch.empty(4, 9, 33)[:, 2:7]
    assert LT.find_split(rows, 2) == 1 and LT.strides3(rows, 2, 1) == (297, 33, 1)
    assert LT.find_split(torch.empty(2, 8, 5, 7)[..., :4], 1) is None
    plan = LT.plan_fwd(torch.empty(64, 100).t(), 1, 0)  # [100, 64] with unit stride along rows
    assert plan.s_unit and plan.block_s >= K.TUNING.cf_min_block_s
    # H*W compiled in only for dense channels-first maps whose H*W is not a multiple of 16.
    m = torch.empty(2, 8, 7, 7)
    p = LT.plan_fwd(m, 1, 0)
    assert LT.const_s(p, LT.strides3(m, 1, 0)) == 49
    mcl = m.contiguous(memory_format=torch.channels_last)
    assert LT.const_s(LT.plan_fwd(mcl, 1, 0), LT.strides3(mcl, 1, 0)) == 0
    m16 = torch.empty(2, 8, 4, 4)
    assert LT.const_s(LT.plan_fwd(m16, 1, 0), LT.strides3(m16, 1, 0)) == 0


def test_backward_plan(monkeypatch):
    """Persistent programs: SMs x k, k cut by the partial-sum budget, tiles grown to keep the warps per SM."""
    monkeypatch.setattr(LT, "sm_count", lambda _device: 100)
    tn = K.TUNING
    big = torch.empty(400_000, 64, dtype=torch.float16, device="meta")
    p = LT.plan_bwd(big, 1, 0, True)
    assert p.per_sm == tn.bwd_programs_per_sm and p.programs == 100 * p.per_sm
    assert p.block_s * p.block_c == tn.bwd_tile
    small = torch.empty(4096, 512, dtype=torch.float16, device="meta")
    p = LT.plan_bwd(small, 1, 0, True)
    assert p.per_sm == 1 and p.programs == 100  # 2 x 512 fp32 partials per program: budget allows ~1 per SM
    assert p.block_s * p.block_c == tn.bwd_tile * tn.bwd_programs_per_sm
    assert LT.plan_bwd(small, 1, 0, False).per_sm == tn.bwd_programs_per_sm  # no partials, no budget
    odd = torch.empty(3000, 96, dtype=torch.float16, device="meta")  # budget // SMs = 3: tile stays a power of 2
    p = LT.plan_bwd(odd, 1, 0, True)
    assert p.block_s & (p.block_s - 1) == 0


def test_backward_stages_and_dw_grid(monkeypatch):
    """Pipelining depth per layout, lowered when the staged tiles would not fit in shared memory;
    the separate dW/dB pass launches no more programs than one wave holds."""
    monkeypatch.setattr(LT, "sm_count", lambda _device: 132)
    monkeypatch.setattr(K.TUNING, "bwd_stages", 3)
    monkeypatch.setattr(K.TUNING, "cf_bwd_stages", 1)
    for dtype, stages in ((torch.float16, 3), (torch.float32, 2)):  # fp32: 2 x 128 KB staged tiles do not fit
        long = torch.empty(4096, 16384, dtype=dtype, device="meta")
        p = LT.plan_bwd(long, 1, 0, False)
        assert p.block_c == 16384 and LT.bwd_stages(p, long, long) == stages
    rows = torch.empty(4096, 512, dtype=torch.float16, device="meta")
    assert LT.bwd_stages(LT.plan_bwd(rows, 1, 0, True), rows, rows) == 3
    cf = torch.empty(4, 64, 56, 56, dtype=torch.float16, device="meta")
    assert LT.bwd_stages(LT.plan_bwd(cf, 1, 0, True), cf, cf) == 1
    # 4096 x 16384: 64 column blocks; 4 x 132 // 64 = 8 row groups (512 programs, one wave of 528).
    p = LT.plan_bwd(torch.empty(4096, 16384, dtype=torch.float16, device="meta"), 1, 0, False)
    bs, bc, _tpb, n_col, G = LT.plan_dwdb(p, 132)
    assert (n_col, G) == (64, 8) and n_col * G <= K.TUNING.dw_programs_per_sm * 132


def test_other_dims(device):
    _check(*_inputs((3, 10, 4), 0, torch.float32, device), dim=0)
    _check(*_inputs((3, 10, 4), 1, torch.float32, device), dim=1)


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("case", ["rows", "channels_first", "looped", "separate_dw"])
def test_weight_grads_bit_identical(device, monkeypatch, case):
    if case == "rows":
        x, dy, w, b = _inputs((2048, 19), -1, torch.float16, device)
        dim = -1
    elif case == "channels_first":
        x, dy, w, b = _inputs((8, 19, 16, 16), 1, torch.bfloat16, device)
        dim = -3
    elif case == "separate_dw":
        monkeypatch.setattr(K.TUNING, "fused_dw_max_c", 16)
        monkeypatch.setattr(K.TUNING, "dw_block_c", 16)
        monkeypatch.setattr(K.TUNING, "dw_tile", 64)
        x, dy, w, b = _inputs((64, 40), -1, torch.float32, device)
        dim = -1
    else:
        monkeypatch.setattr(K.TUNING, "max_tile", 64)
        monkeypatch.setattr(K.TUNING, "loop_tile", 32)
        x, dy, w, b = _inputs((24, 100), -1, torch.float32, device)
        dim = -1
    # Few programs, each summing many tiles, on any device.
    monkeypatch.setattr(LT, "sm_count", lambda _device: 3)
    monkeypatch.setattr(K.TUNING, "partial_frac", 1e-9)
    r1, r2 = (_ours(x, dy, w, b, 1e-5, dim) for _ in range(2))
    for a, c in zip(r1, r2):
        assert torch.equal(a, c)
    _check(x, dy, w, b, dim=dim)


@pytest.mark.parametrize("case", ["channels_first", "channels_last", "looped", "separate_dw", "steps"])
def test_stats_and_input_grad_of_a_folded_norm(device, monkeypatch, small_blocks, case):
    """layer_norm_stats (the forward kernel without its output) and ln_input_grad (the backward kernel writing dx
    over dy) equal the layer norm's forward statistics and backward, on every path: one tile per row, the looped
    path, the separate weight-sum pass (which reads dy before dx overwrites it), channels-last and 5-D maps; and
    the float64 forms in PyTorch equal the fp64 reference."""
    shape = {"looped": (2, 300, 2, 3), "steps": (3, 2, 5, 4, 3)}.get(case, (2, 19, 4, 5))
    if case == "separate_dw":
        monkeypatch.setattr(K.TUNING, "fused_dw_max_c", 16)
        monkeypatch.setattr(K.TUNING, "dw_block_c", 16)
        monkeypatch.setattr(K.TUNING, "dw_tile", 64)
    x, dy, w, b = _inputs(shape, -3, torch.float32, device)
    if case == "channels_last":
        x, dy = (t.movedim(-3, -1).contiguous().movedim(-1, -3) for t in (x, dy))
    if case == "looped":
        assert not LT.plan_fwd(x, 1, LT.find_split(x, 1)).single
    if case == "separate_dw":
        assert LT.separate_dwdb(x, 1, LT.find_split(x, 1))
    _y, mean_ref, rstd_ref = K._fwd_host(x, w, b, -3, 1e-5)
    mean, rstd = K.layer_norm_stats(x, 1e-5)
    assert torch.equal(mean, mean_ref) and torch.equal(rstd, rstd_ref)
    dx_ref, dw_ref, db_ref = K._bwd_host(dy, x, w, b, mean, rstd, -3, True, True)
    grad = dy.clone()
    dx, dw, db = K.ln_input_grad(x, grad, w, b, mean, rstd, True, True)
    assert dx.data_ptr() == grad.data_ptr()  # written over dL/dy
    for got, ref in ((dx, dx_ref), (dw, dw_ref), (db, db_ref)):
        assert torch.equal(got, ref)
    _y, dx64, dw64, db64 = _reference(x, dy, w, b, 1e-5, -3)
    mean64, rstd64 = K.layer_norm_stats(x.double(), 1e-5)
    assert mean64.dtype == torch.float64
    assert_close(mean64, x.double().mean(-3).reshape(-1), rtol=1e-12, atol=1e-12, what="fp64 mean")
    got64 = K.ln_input_grad(x.double(), dy.double(), w.double(), b.double(), mean64, rstd64, True, True)
    for got, ref, what in zip(got64, (dx64, dw64, db64), ("dx", "dw", "db")):
        assert_close(got, ref, rtol=1e-10, atol=1e-10, what=f"fp64 {what}")
    _close_scaled(dx.double(), dx64, GRAD_RTOL[torch.float32], "dx")


# --------------------------------------------------------------------------- ops, compile, profiler


def test_ops_registered_and_in_profile(device):
    x, dy, w, b = _inputs((4, 6, 3, 5), 1, torch.float32, device)
    x.requires_grad_()
    with torch.profiler.profile() as prof:
        K.layer_norm(x, w, b, 1e-5, -3).backward(dy)
    names = {e.key for e in prof.key_averages()}
    assert "snntrain::layer_norm_fwd" in names and "snntrain::layer_norm_bwd" in names


def test_eager_calls_skip_the_registered_ops(device, monkeypatch):
    """Eager calls run the host functions through an autograd.Function, not the operators (whose
    dispatch costs host time), and give the operators' results bit for bit."""
    x, dy, w, b = _inputs((5, 12, 3, 7), 1, torch.float16, device)
    w.requires_grad_()
    outs = []
    for eager in (False, True):
        xi = x.detach().requires_grad_()
        if eager:
            y = K.layer_norm(xi, w, b, 1e-5, -3)
        else:
            y = torch.ops.snntrain.layer_norm_fwd(xi, w, b, -3, 1e-5)[0]
        outs.append((y, *torch.autograd.grad(y, [xi, w], dy)))
        if not eager:  # from here on, a call of either operator fails the test
            def refuse(*args):
                raise AssertionError("an eager layer_norm call went through a registered operator")

            monkeypatch.setattr(K, "layer_norm_fwd", refuse)
            monkeypatch.setattr(K, "layer_norm_bwd", refuse)
    assert type(outs[1][0].grad_fn).__name__ == "Eager_layer_norm_fwdBackward"
    for a, c in zip(*outs):
        assert torch.equal(a, c)


def test_torch_compile_fullgraph(device):
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    x, dy, w, b = _inputs((2, 3, 8, 4, 5), 2, torch.float32, device)
    w.requires_grad_()
    b.requires_grad_()

    def fn(x, w, b):
        return K.layer_norm(x * 2, w, b, 1e-5, -3).relu()

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    outs = []
    for f in (fn, compiled):
        xi = x.detach().requires_grad_()
        y = f(xi, w, b)
        grads = torch.autograd.grad(y, [xi, w, b], dy)
        outs.append((y, *grads))
    for a, c in zip(*outs):
        assert_close(a, c, atol=1e-5)


# Static-buffer protocol of a CUDA graph: inputs live in buffers of their own, new data is
# copied into them, the same step is run again (replayed), the outputs are read back. The
# buffers must not share memory with the tensors the reference is computed from: a
# ``x.detach()`` buffer is a view of ``x``, so copying new data into it would change ``x``.
GRAPH_CASES = {
    "channels_first_7x7": ((64, 8, 7, 7), 1),  # H*W % 4 != 0
    "channels_first_4x4": ((16, 24, 4, 4), 1),  # fused dW/dB
    "rows": ((96, 80), -1),
}


def _static_step(shape, dim, device):
    """(step, static buffers xs, dys, ws, bs): step() runs forward and backward on the buffers."""
    x, dy, w, b = _inputs(shape, dim, torch.float16, device)
    xs = torch.empty_like(x).copy_(x).requires_grad_()  # own memory, not a view of x
    dys = torch.empty_like(dy).copy_(dy)
    ws, bs = w.clone().requires_grad_(), b.clone().requires_grad_()

    def step():
        y = K.layer_norm(xs, ws, bs, 1e-5, dim)
        return (y, *torch.autograd.grad(y, [xs, ws, bs], dys))

    return step, xs, dys, ws, bs


def _rerun_with_new_data(run, outs, xs, dys, ws, bs, shape, dim, device):
    """Copy two fresh inputs (not rescaled copies: y, dW, dB are scale-invariant) into the
    buffers, rerun, compare the outputs with the reference and with a plain eager call."""
    for seed in (1, 2):
        x, dy, _w, _b = _inputs(shape, dim, torch.float16, device, seed=seed)
        with torch.no_grad():
            xs.copy_(x)
            dys.copy_(dy)
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        w, b = ws.detach(), bs.detach()
        ref = _reference(x, dy, w, b, 1e-5, dim)
        eager = _ours(x, dy, w, b, 1e-5, dim)
        for name, got, r, e in zip(("y", "dx", "dw", "db"), outs, ref, eager):
            if name == "y":
                _close_scaled(got, r, TOLERANCES[got.dtype][0], f"rerun {seed} y")
            else:
                _close_grad(got, r, f"rerun {seed} {name}")
            assert torch.equal(got, e), f"rerun {seed} {name}: differs from an eager call on the same data"


@pytest.mark.parametrize("case", list(GRAPH_CASES))
def test_static_buffers_rerun(device, case):
    """The graph protocol without the graph (runs on the CPU too): in-place input updates are seen."""
    shape, dim = GRAPH_CASES[case]
    step, xs, dys, ws, bs = _static_step(shape, dim, device)
    outs = list(step())

    def run():
        for o, n in zip(outs, step()):
            o.copy_(n)

    _rerun_with_new_data(run, outs, xs, dys, ws, bs, shape, dim, device)


def test_outputs_never_alias(device):
    """Every call returns fresh memory: no output shares storage with an input, another output or
    an earlier call's outputs, and a later call leaves an earlier call's results untouched."""
    x1, dy1, w, b = _inputs((40, 12, 5, 5), 1, torch.float16, device)
    x2, dy2, _w, _b = _inputs((40, 12, 5, 5), 1, torch.float16, device, seed=1)
    calls = []
    for x, dy in ((x1, dy1), (x2, dy2)):
        y, mean, rstd = torch.ops.snntrain.layer_norm_fwd(x, w, b, 1, 1e-5)
        dx, dw, db = torch.ops.snntrain.layer_norm_bwd(dy, x, w, b, mean, rstd, 1, True, True)
        calls.append([y, mean, rstd, dx, dw, db])
    first = [t.clone() for t in calls[0]]
    ptrs = [t.untyped_storage().data_ptr() for c in calls for t in c]
    ptrs += [t.untyped_storage().data_ptr() for t in (x1, x2, dy1, dy2, w, b)]
    assert len(set(ptrs)) == len(ptrs)
    # A rerun on the first data gives the same bits and leaves the first call's tensors as they were.
    y, mean, rstd = torch.ops.snntrain.layer_norm_fwd(x1, w, b, 1, 1e-5)
    again = [y, mean, rstd, *torch.ops.snntrain.layer_norm_bwd(dy1, x1, w, b, mean, rstd, 1, True, True)]
    for a, f, c in zip(again, first, calls[0]):
        assert torch.equal(a, f) and torch.equal(c, f)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GRAPH_CASES))
def test_cuda_graph_capture(device, case):
    shape, dim = GRAPH_CASES[case]
    step, xs, dys, ws, bs = _static_step(shape, dim, device)
    graph, outs = capture_cuda_graph(step)
    _rerun_with_new_data(graph.replay, outs, xs, dys, ws, bs, shape, dim, device)


def test_empty_input(device):
    x, dy, w, b = _inputs((0, 5), -1, torch.float32, device)
    y, dx, dw, db = _ours(x, dy, w, b, 1e-5, -1)
    assert y.shape == (0, 5) and dx.shape == (0, 5)
    assert torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(b))


def test_bad_arguments(device):
    x = torch.randn(4, 6, device=device)
    with pytest.raises(ValueError, match=r"weight has shape \(5,\).*must have shape \(6,\)"):
        K.layer_norm(x, torch.ones(5, device=device))
    with pytest.raises(ValueError, match="eps=-1.0 is not valid"):
        K.layer_norm(x, eps=-1.0)
    with pytest.raises(ValueError, match="dim=2 is out of range"):
        K.layer_norm(x, dim=2)
    with pytest.raises(TypeError, match="torch.int64"):
        K.layer_norm(torch.ones(2, 3, dtype=torch.long, device=device))


# --------------------------------------------------------------------------- modules


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_layer_norm_module(device, backend):
    torch.manual_seed(0)
    ref = torch.nn.LayerNorm(19).to(device)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.normal_()
    ours = LayerNorm(19, backend=backend).to(device)
    ours.load_state_dict(ref.state_dict())
    assert set(ours.state_dict()) == {"weight", "bias"}
    x = torch.randn(3, 4, 19, device=device)
    assert_close(ours(x), ref(x), atol=1e-5)
    ref.load_state_dict(ours.state_dict())

    multi = LayerNorm((4, 19), backend=backend, bias=False).to(device)
    tm = torch.nn.LayerNorm((4, 19), bias=False).to(device)
    with torch.no_grad():
        tm.weight.uniform_(0.5, 1.5)
    multi.load_state_dict(tm.state_dict())
    assert_close(multi(x), tm(x), atol=1e-5)

    plain = LayerNorm((19,), elementwise_affine=False, backend=backend)
    assert plain.weight is None and plain.bias is None and len(plain.state_dict()) == 0
    assert_close(plain(x), F.layer_norm(x, (19,)), atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 6, 5, 7), (2, 3, 6, 4, 5)], ids=["4d", "5d"])
def test_layer_norm2d_backends_agree(device, shape):
    torch.manual_seed(0)
    m = LayerNorm2d(6, backend="torch").to(device)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_()
    x = torch.randn(shape, device=device, requires_grad=True)
    outs = []
    for backend in ("torch", "triton"):
        set_backend(m, backend)
        assert m.backend == backend
        x.grad = None
        m.zero_grad()
        y = m(x)
        y.pow(2).sum().backward()
        outs.append((y.detach(), x.grad.clone(), m.weight.grad.clone(), m.bias.grad.clone()))
    for a, c in zip(*outs):
        assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_module_errors(device):
    with pytest.raises(ValueError, match="num_channels=0"):
        LayerNorm2d(0)
    with pytest.raises(ValueError, match="eps=-0.1"):
        LayerNorm2d(4, eps=-0.1)
    with pytest.raises(ValueError, match="eps=nan"):
        LayerNorm(4, eps=float("nan"))
    with pytest.raises(ValueError, match="backend='cuda'"):
        LayerNorm(4, backend="cuda")
    m = LayerNorm2d(4, backend="torch")
    with pytest.raises(ValueError, match=r"got shape \(4, 5, 6\) \(3 dims\)"):
        m(torch.randn(4, 5, 6))
    with pytest.raises(ValueError, match="input has 3 channels.*num_channels=4"):
        m(torch.randn(2, 3, 5, 5))
    with pytest.raises(ValueError, match="norm='groupnorm' is not valid; choose one of batchnorm, layernorm"):
        build_norm2d("groupnorm", 4)
    with pytest.raises(ValueError, match=r"expects its last 1 dim\(s\) to be \(4,\)"):
        LayerNorm(4, backend="triton")(torch.randn(2, 5, device=device))


def test_sew_resnet_layernorm_both_backends(device):
    """SEW-ResNet with norm=layernorm; the norms switch backend (the neurons stay on the reference)."""
    results = []
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        model = SEWResNet(depth=18, width=4, T=2, norm="layernorm", backend="torch", num_classes=5).to(device)
        norms = [m for m in model.modules() if isinstance(m, LayerNorm2d)]
        assert len(norms) > 10 and not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
        for m in norms:
            m.backend = backend
        x = torch.randn(2, 3, 16, 16, device=device)
        out = model(x)
        out.sum().backward()
        assert out.shape == (2, 5)
        grad = model.sn1.norm.weight.grad
        assert torch.isfinite(grad).all()
        results.append((out.detach(), grad.clone()))
    assert_close(results[0][0], results[1][0], **SUMMED, what="logits")
    assert_close(results[0][1], results[1][1], rtol=1e-3, atol=0, what="dweight")
