"""The Triton neuron kernels (snntrain.kernels.lif) against the PyTorch reference backend.

On a machine without CUDA the kernels run in Triton's CPU interpreter (see conftest.py);
on a GPU machine the same tests run the compiled kernels on CUDA tensors.

Tolerances. The kernels compute the same fp32 operations in the same order as the
reference (the charge's multiply is explicitly rounded, never fused), so spikes and the
fp32 membrane are expected to be identical; the membrane check allows 1e-6 (``MEMBRANE``)
to stay robust to a different libm. Gradients differ from the reference's by summation
order (dL/dV_{t-1} = dL/dH * (1 - k) instead of dL/dH - dL/dH * k), so they are checked
with the shared per-dtype table (``_testing.TOLERANCES``): dL/dX is rounded to the input
dtype and allowed two units in its last place, dL/dv_init uses the fp32 row. PLIF's dL/dw
is a sum over every neuron and step, reduced in blocks: ``_testing.SUMMED``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from _testing import SUMMED, assert_close, capture_cuda_graph
from snntrain import backend as backend_mod
from snntrain.kernels import lif as K
from snntrain.nn import IF, LIF, PLIF, set_backend
from snntrain.nn import functional as F
from snntrain.nn.surrogate import SURROGATES

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The fp32 membrane: the same operations as the reference, so tighter than the table.
MEMBRANE = dict(rtol=1e-6, atol=1e-6)

KINDS = ["if", "lif", "plif"]


def _inputs(shape, dtype, device, seed=0, scale=1.5, shift=0.6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale + shift
    g_s = torch.randn(shape, generator=g)
    return x.to(device=device, dtype=dtype), g_s.to(device=device, dtype=dtype)


def _w(device, value=-0.3):
    return torch.tensor(value, device=device, requires_grad=True)


def _run(backend, x_leaf, p, *, w=None, v_init=None, g_s=None, g_v=None, g_q=None, make_x=None):
    """Forward with ``backend``; gradients of sum(S*g_s) + sum(V_final*g_v) + sum(V_seq*g_q)."""
    x_leaf = x_leaf.detach().clone().requires_grad_()
    x = make_x(x_leaf) if make_x is not None else x_leaf
    w = None if w is None else w.detach().clone().requires_grad_()
    v_init = None if v_init is None else v_init.detach().clone().requires_grad_()
    out = F.neuron_multistep(x, p, w, v_init, return_state=True, return_membrane=g_q is not None, backend=backend)
    outs, grads = [], []
    for o, g in ((out.spikes, g_s), (out.v_final, g_v), (out.v_seq, g_q)):
        if g is not None:
            outs.append(o)
            grads.append(g)
    named = {n: t for n, t in (("x", x_leaf), ("w", w), ("v_init", v_init)) if t is not None}
    got = torch.autograd.grad(outs, list(named.values()), grads, allow_unused=True)
    return out, dict(zip(named, got))


def _compare(ref, got, dtype, check_membrane=True):
    (o_ref, g_ref), (o_got, g_got) = ref, got
    assert o_got.spikes.dtype == o_ref.spikes.dtype and o_got.spikes.shape == o_ref.spikes.shape
    assert torch.equal(o_got.spikes, o_ref.spikes), "spikes differ from the reference"
    if check_membrane:
        assert_close(o_got.v_final, o_ref.v_final, **MEMBRANE, what="v_final")
        if o_ref.v_seq is not None:
            assert_close(o_got.v_seq, o_ref.v_seq, **MEMBRANE, what="v_seq")
    for name, a in g_ref.items():
        b = g_got[name]
        if a is None:
            assert b is None or not b.any(), f"d{name} should be absent"
            continue
        assert b is not None, f"d{name} missing"
        assert b.dtype == a.dtype and b.shape == a.shape, f"d{name}: {b.dtype} {b.shape} vs {a.dtype} {a.shape}"
        assert_close(b, a, **(SUMMED if name == "w" else {}), what=f"d{name}")


def _check(x, p, device, **kw):
    w = _w(device) if p.kind == "plif" else None
    ref = _run("torch", x, p, w=w, **kw)
    got = _run("triton", x, p, w=w, **kw)
    _compare(ref, got, x.dtype)
    return ref, got


def test_surrogate_list_matches_pytorch_backend():
    assert K.SURROGATES == tuple(SURROGATES)


# Every option combination (IF has no decay_input) and every dtype; [T, 3, 37] with T=5.
_COMBOS = [
    (kind, hard, detach, decay, surrogate, dtype)
    for kind, hard, detach, decay, surrogate, dtype in itertools.product(
        KINDS, [True, False], [False, True], [True, False], SURROGATES, DTYPES
    )
    if kind != "if" or decay
]


@pytest.mark.parametrize(
    "kind,hard,detach,decay,surrogate,dtype",
    _COMBOS,
    ids=[f"{k}-{'hard' if h else 'soft'}-{'det' if d else 'att'}-{'dec' if c else 'nodec'}-{s}-{str(t)[6:]}"
         for k, h, d, c, s, t in _COMBOS],
)
def test_matches_reference_every_option(kind, hard, detach, decay, surrogate, dtype, device):
    p = F.NeuronParams(kind, tau=2.5, v_reset=0.0 if hard else None, decay_input=decay, detach_reset=detach,
                       surrogate=surrogate)
    x, g_s = _inputs((5, 3, 37), dtype, device, seed=_COMBOS.index((kind, hard, detach, decay, surrogate, dtype)))
    _check(x, p, device, g_s=g_s)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hard", [True, False], ids=["hard", "soft"])
def test_state_in_and_out(kind, hard, dtype, device):
    """Initial state, final state and membrane trace, with gradients through all of them."""
    p = F.NeuronParams(kind, tau=3.0, v_threshold=0.8, v_reset=-0.1 if hard else None, surrogate="atan", alpha=3.0)
    T, shape = 11, (2, 29)
    x, g_s = _inputs((T, *shape), dtype, device, seed=3)
    g = torch.Generator().manual_seed(4)
    v_init = (torch.randn(shape, generator=g) * 0.5).to(device)
    g_v = torch.randn(shape, generator=g).to(device)
    g_q = torch.randn((T, *shape), generator=g).to(device)
    _check(x, p, device, v_init=v_init, g_s=g_s, g_v=g_v, g_q=g_q)


@pytest.mark.parametrize("T", [1, 3, 4, 5, 8, 9, 17])
@pytest.mark.parametrize("n", [1, 13, 257])
def test_time_lengths_and_odd_sizes(T, n, device):
    """T around the chunk sizes (4 for T <= 4, else 8) and element counts that do not fill a block."""
    p = F.NeuronParams("plif", decay_input=True, v_reset=0.0)
    x, g_s = _inputs((T, n), torch.float32, device, seed=T * 1000 + n)
    _check(x, p, device, g_s=g_s, v_init=torch.zeros(n, device=device), g_v=torch.ones(n, device=device))


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_through_final_state_only(kind, device):
    """No gradient reaches the spikes: the backward scan starts from dL/dV_final alone."""
    p = F.NeuronParams(kind, v_reset=None, decay_input=False)
    x, _ = _inputs((10, 2, 21), torch.float32, device, seed=12)
    g = torch.Generator().manual_seed(13)
    _check(x, p, device, v_init=torch.randn(2, 21, generator=g).to(device),
           g_v=torch.randn(2, 21, generator=g).to(device))


def test_v_threshold_and_alpha(device):
    for surrogate, alpha in (("sigmoid", 2.5), ("atan", 0.7), ("piecewise_quadratic", 1.7)):
        p = F.NeuronParams("lif", tau=1.7, v_threshold=0.45, v_reset=0.1, surrogate=surrogate, alpha=alpha)
        x, g_s = _inputs((6, 41), torch.float32, device, seed=7, scale=0.6, shift=0.2)
        _check(x, p, device, g_s=g_s)


@pytest.mark.parametrize(
    "layout", ["transposed", "strided", "permuted", "expanded_time", "sliced_time"]
)
def test_non_contiguous_input(layout, device):
    T = 9
    p = F.NeuronParams("lif", decay_input=False, v_reset=None)
    if layout == "transposed":  # [N, T] storage viewed as [T, N]: time is the fast axis
        x, g_s = _inputs((31, T), torch.float32, device, seed=1)
        make_x = lambda t: t.t()  # noqa: E731
        g_s = g_s.t().contiguous()
    elif layout == "strided":  # every other element of the last axis
        x, g_s = _inputs((T, 3, 22), torch.float32, device, seed=2)
        make_x = lambda t: t[:, :, ::2]  # noqa: E731
        g_s = g_s[:, :, ::2].contiguous()
    elif layout == "permuted":  # inner axes swapped: no single stride, copied once
        x, g_s = _inputs((T, 5, 7), torch.float32, device, seed=3)
        make_x = lambda t: t.permute(0, 2, 1)  # noqa: E731
        g_s = g_s.permute(0, 2, 1).contiguous()
    elif layout == "expanded_time":  # one input repeated over T with a stride-0 time axis
        x, g_s = _inputs((1, 4, 19), torch.float32, device, seed=4, shift=0.4)
        make_x = lambda t: t.expand(T, 4, 19)  # noqa: E731
        g_s = _inputs((T, 4, 19), torch.float32, device, seed=5)[1]
    else:  # every other time step
        x, g_s = _inputs((2 * T, 23), torch.float32, device, seed=6)
        make_x = lambda t: t[::2]  # noqa: E731
        g_s = g_s[::2].contiguous()
    assert not make_x(x).is_contiguous()
    _check(x, p, device, g_s=g_s, make_x=make_x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_expanded_grad_output(dtype, device):
    """y.sum().backward() hands the backward a stride-0 gradient; so does a per-step gradient broadcast over neurons."""
    p = F.NeuronParams("lif")
    x, _ = _inputs((10, 3, 17), dtype, device, seed=8)
    _check(x, p, device, g_s=torch.ones((), device=device, dtype=dtype).expand(x.shape))
    per_step = torch.linspace(-1, 2, 10, device=device, dtype=dtype).view(10, 1, 1).expand(x.shape)
    _check(x, p, device, g_s=per_step)
    # Through the public API exactly as in training.
    grads = []
    for backend in ("torch", "triton"):
        xl = x.detach().clone().requires_grad_()
        F.lif(xl, backend=backend).sum().backward()
        grads.append(xl.grad)
    assert_close(grads[1], grads[0], what="dx from y.sum().backward()")


def test_gradient_only_for_w_and_deterministic(device):
    """dL/dw without dL/dx, and bitwise-repeatable dL/dw (fixed-order reduction)."""
    p = F.NeuronParams("plif", decay_input=True)
    x, g_s = _inputs((9, 3, 300), torch.float32, device, seed=9)
    ws = []
    for backend in ("torch", "triton", "triton"):
        w = _w(device)
        s = F.neuron_multistep(x, p, w, backend=backend)
        (gw,) = torch.autograd.grad(s, [w], g_s)
        ws.append(gw)
    assert_close(ws[1], ws[0], **SUMMED, what="dw")
    assert torch.equal(ws[1], ws[2]), "dL/dw is not bitwise repeatable"


def test_no_grad_inference(device):
    p = F.NeuronParams("lif")
    x, _ = _inputs((12, 50), torch.bfloat16, device, seed=10)
    with torch.no_grad():
        a = F.neuron_multistep(x, p, backend="torch")
        b = F.neuron_multistep(x, p, backend="triton")
    assert torch.equal(a, b)


def test_modules_and_set_backend(device):
    torch.manual_seed(0)
    x = (torch.randn(6, 2, 3, 5, 5) * 1.5 + 0.5).to(device)
    for cls, kwargs in ((IF, {}), (LIF, {"tau": 3.0, "v_reset": None}), (PLIF, {"init_tau": 2.0, "detach_reset": True})):
        results = []
        for backend in ("torch", "triton"):
            m = cls(backend=backend, **kwargs).to(device)
            xl = x.clone().requires_grad_()
            y, v = m(xl, return_state=True)
            (y.sum() + v.sum()).backward()
            results.append((y, v, xl.grad, getattr(m, "w", None)))
        (y0, v0, g0, w0), (y1, v1, g1, w1) = results
        assert torch.equal(y0, y1), cls.__name__
        assert_close(v1, v0, **MEMBRANE, what=f"{cls.__name__} v_final")
        assert_close(g1, g0, what=f"{cls.__name__} dx")
        if w0 is not None:
            assert_close(w1.grad, w0.grad, **SUMMED, what="PLIF dw")
    net = torch.nn.Sequential(LIF(backend="torch"), torch.nn.Identity(), PLIF(backend="torch")).to(device)
    set_backend(net, "triton")
    assert [m.backend for m in net if hasattr(m, "backend")] == ["triton", "triton"]
    y_triton = net(x)
    set_backend(net, "torch")
    assert torch.equal(net(x), y_triton)


def test_store_v_seq_module(device):
    x = (torch.randn(4, 33) + 0.5).to(device)
    seqs = []
    for backend in ("torch", "triton"):
        m = LIF(backend=backend, store_v_seq=True)
        m(x)
        seqs.append(m.v_seq)
    assert_close(seqs[1], seqs[0], **MEMBRANE, what="store_v_seq")


def test_profiler_shows_ops_by_name(device):
    x = torch.randn(4, 64, device=device, requires_grad=True)
    with torch.profiler.profile() as prof:
        F.lif(x, backend="triton").sum().backward()
    names = {e.name for e in prof.events()}
    assert "snntrain::neuron_fwd" in names and "snntrain::neuron_bwd" in names, sorted(names)


def test_torch_compile_fullgraph(device):
    """Forward and backward trace without graph breaks (aot_eager on CPU, inductor on CUDA)."""
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    torch._dynamo.reset()

    def fn(x, w):
        s1 = F.lif(x, tau=2.0, backend="triton")
        s2 = F.plif(x * 0.5 + s1, w, v_reset=None, surrogate="atan", backend="triton")
        return (s1 * 0.3 + s2).sum()

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    x, _ = _inputs((9, 4, 13), torch.float32, device, seed=11)
    results = []
    for f in (fn, compiled):
        xl, w = x.clone().requires_grad_(), _w(device)
        loss = f(xl, w)
        loss.backward()
        results.append((loss.detach(), xl.grad, w.grad))
    (l0, gx0, gw0), (l1, gx1, gw1) = results
    assert_close(l1, l0, what="compiled loss")  # a compiled sum may add in another order
    assert_close(gx1, gx0, what="compiled dx")
    assert_close(gw1, gw0, **SUMMED, what="compiled dw")


def test_autocast_bf16(device):
    """Under bf16 autocast the neuron sees bf16 input and runs in it, like the reference."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(24, 40).to(device)
    inp = torch.randn(5, 3, 24, device=device)
    outs = []
    for backend in ("torch", "triton"):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            z = lin(inp) * 2.0
            z.retain_grad()
            y = LIF(backend=backend)(z)
        assert z.dtype == y.dtype == torch.bfloat16
        y.float().sum().backward()
        outs.append((y, z.grad))
    assert torch.equal(outs[0][0], outs[1][0])
    assert_close(outs[1][1], outs[0][1], what="autocast dz")


def test_triton_without_cuda_fails_clearly(monkeypatch):
    monkeypatch.setattr(backend_mod, "triton_interpret", lambda: False)
    x = torch.randn(3, 5)  # a CPU tensor
    with pytest.raises(RuntimeError, match="backend='torch'"):
        F.lif(x, backend="triton")
    with pytest.raises(RuntimeError, match="backend=torch"):
        backend_mod.resolve_backend("triton", cuda=False)
    assert backend_mod.resolve_backend("auto", cuda=False) == "torch"
    assert backend_mod.resolve_backend("auto", cuda=True) == "triton"


def test_unsupported_dtype_is_refused(device):
    x = torch.randn(3, 5, device=device, dtype=torch.float64)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        F.lif(x, backend="triton")


@pytest.mark.gpu
def test_cuda_graph_capture(device):
    """A training step with the kernels can be captured: nothing synchronises with the host."""
    x = torch.randn(8, 4, 1000, device=device, requires_grad=True)
    w = torch.tensor(0.2, device=device, requires_grad=True)

    def step():
        x.grad = w.grad = None
        y = F.plif(F.lif(x, backend="triton") + x, w, backend="triton")
        y.sum().backward()

    step()
    eager_x, eager_w = x.grad.clone(), w.grad.clone()
    graph, _ = capture_cuda_graph(step)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.grad, eager_x) and torch.equal(w.grad, eager_w)


@pytest.mark.parametrize("expanded", [False, True], ids=["channels_last", "channels_last_expanded_time"])
def test_channels_last_maps_stay_channels_last(expanded, device):
    """[T, B, C, H, W] maps with C fastest are read in place, and the spikes, the membrane
    and dL/dX come back in the same layout with the reference's values."""
    T, B, C, H, W = 5, 2, 3, 4, 3
    p = F.NeuronParams("lif", v_reset=None)

    def channels_last(t):
        return t.permute(0, 1, 4, 2, 3)  # storage [T, B, H, W, C] seen as [T, B, C, H, W]

    if expanded:  # a static image's stem output repeated over T (direct encoding)
        x, _ = _inputs((1, B, H, W, C), torch.float32, device, seed=12)
        make_x = lambda t: channels_last(t).expand(T, B, C, H, W)  # noqa: E731
    else:
        x, _ = _inputs((T, B, H, W, C), torch.float32, device, seed=13)
        make_x = channels_last
    g_s = channels_last(_inputs((T, B, H, W, C), torch.float32, device, seed=14)[1])
    v_init = _inputs((B, C, H, W), torch.float32, device, seed=15)[0]
    assert not make_x(x).is_contiguous()
    ref, got = _check(x, p, device, g_s=g_s, g_v=v_init * 0.5, g_q=g_s * 0.3, v_init=v_init, make_x=make_x)
    out, grads = got
    for t in (out.spikes, out.v_seq):
        assert t.stride()[2] == 1, f"expected channels fastest, got strides {t.stride()}"
    assert out.v_final.stride()[1] == 1
    if not expanded:
        assert grads["x"].stride() == x.stride()
