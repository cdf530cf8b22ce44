"""The fused spiking self-attention kernels (snntrain.kernels.spike_attention) against the PyTorch reference
(:func:`snntrain.nn.attention.ssa_reference`, then the neuron of the torch backend).

Tolerances. ``K^T V`` and ``Q KV`` are products of spikes: integer counts, exact in float32 in any order, so the
current and hence the spikes equal the reference's bit for bit, and ``K^T V`` exactly. Gradients: the kernel gives
``dL/dy`` in the spikes' dtype and the products with ``KV`` and ``Q`` run in that dtype, where the reference keeps
float32 to the end, so 16-bit gradients are allowed the table's relative tolerance plus one unit of the largest
value (``_testing.TOLERANCES``); PLIF's dL/dw is a sum over every neuron and step (``_testing.SUMMED``).
"""

from __future__ import annotations

import pytest
import torch

from _testing import SUMMED, TOLERANCES, assert_close, capture_cuda_graph
from snntrain.kernels import spike_attention as K
from snntrain.nn import build_neuron
from snntrain.nn.attention import QKVNeuron, neuron_tokens, ssa_reference

CASES = [  # T, B, N, heads, D, dtype, neuron settings, scale
    (3, 2, 7, 2, 5, torch.float32, dict(type="LIF", detach_reset=True), 0.5),
    (9, 1, 19, 1, 16, torch.float32, dict(type="PLIF", tau=3.0, detach_reset=True), 0.125),  # two chunks of steps
    (4, 2, 5, 3, 4, torch.bfloat16, dict(type="IF", surrogate="atan"), 0.5),
    (5, 1, 3, 2, 3, torch.float16, dict(type="LIF", v_reset=None, decay_input=False, surrogate="piecewise_quadratic"),
     1.0),
]


def _qkv(T, B, N, C, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.rand(T, B, N, 3 * C, generator=g) < 0.4).to(device=device, dtype=dtype)
    grad = torch.randn(T, B, N, C, generator=g).to(device=device, dtype=dtype)
    return qkv, grad


def _grad_tol(dtype, ref):
    rtol, atol = TOLERANCES[dtype]
    if dtype != torch.float32:
        atol = 2 ** -7 * float(ref.abs().max())  # one unit of the largest value: 16-bit products
    return dict(rtol=rtol, atol=atol)


@pytest.mark.parametrize("T, B, N, H, D, dtype, settings, scale", CASES)
def test_fused_attention_neuron_matches_the_reference(T, B, N, H, D, dtype, settings, scale, device):
    C = H * D
    qkv, grad = _qkv(T, B, N, C, dtype, device, seed=N)
    neuron = build_neuron(**settings, v_threshold=0.5, backend="torch").to(device)
    p = neuron.params

    def run(fused: bool):
        leaf = qkv.clone().requires_grad_()
        q, k, v = leaf.split(C, dim=-1)  # strided views of one projection, read in place
        if fused:
            s = K.ssa_neuron(q, k, v, H, scale, kind=p.kind, tau=p.tau, w=neuron._w(), v_threshold=p.v_threshold,
                             v_reset=p.v_reset, decay_input=p.decay_input, detach_reset=p.detach_reset,
                             surrogate=p.surrogate, alpha=p.alpha)
        else:
            s = neuron_tokens(neuron, ssa_reference(q, k, v, H, scale)).to(dtype)
        (s.float() * grad.float()).sum().backward()
        w_grad = None
        if p.kind == "plif":
            w_grad, neuron.w.grad = neuron.w.grad.clone(), None
        return s, leaf.grad, w_grad

    s_ref, g_ref, w_ref = run(False)
    s, g, w = run(True)
    assert s.dtype == dtype and s.is_contiguous()
    assert 0.05 < s.float().mean() < 0.95  # the case exercises both sides of the threshold
    assert torch.equal(s, s_ref)
    assert_close(g, g_ref, dtype, what="dL/dq,k,v", **_grad_tol(dtype, g_ref))
    if w_ref is not None:
        assert_close(w, w_ref, **SUMMED, what="dL/dw")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_is_exact_and_differentiable(dtype, device):
    T, B, N, H, D = 2, 3, 37, 3, 6
    qkv, _ = _qkv(T, B, N, H * D, dtype, device, seed=1)
    leaf = qkv.clone().requires_grad_()
    _q, k, v = leaf.split(H * D, dim=-1)
    kv = K.spike_kv(k, v, H)
    kh, vh = (z.float().unflatten(-1, (H, D)).transpose(2, 3) for z in (k, v))
    assert kv.dtype == torch.float32
    assert torch.equal(kv, kh.transpose(-1, -2) @ vh)
    g = torch.randn(kv.shape, generator=torch.Generator().manual_seed(2)).to(device)
    (kv * g).sum().backward()
    ref = leaf.detach().float().requires_grad_()
    _q, rk, rv = ref.split(H * D, dim=-1)
    rkh, rvh = (z.unflatten(-1, (H, D)).transpose(2, 3) for z in (rk, rv))
    ((rkh.transpose(-1, -2) @ rvh) * g).sum().backward()
    assert_close(leaf.grad, ref.grad.to(dtype), dtype, what="dL/dk,v", **_grad_tol(dtype, ref.grad))


def test_an_expanded_gradient_and_no_gradient(device):
    """``s.sum().backward()`` hands the kernel a stride-0 gradient; without a gradient nothing is saved."""
    T, B, N, H, D = 2, 1, 6, 2, 4
    qkv, _ = _qkv(T, B, N, H * D, torch.float32, device, seed=3)
    layer = QKVNeuron(H, 1.0, build_neuron(type="LIF", v_threshold=0.5, backend="triton"), "triton")
    ref = QKVNeuron(H, 1.0, build_neuron(type="LIF", v_threshold=0.5, backend="torch"), "torch")
    grads = []
    for m in (layer, ref):
        leaf = qkv.clone().requires_grad_()
        m(*leaf.split(H * D, dim=-1)).sum().backward()
        grads.append(leaf.grad)
    assert_close(grads[0], grads[1], what="dL/dq,k,v")
    with torch.no_grad():
        assert torch.equal(layer(*qkv.split(H * D, dim=-1)), ref(*qkv.split(H * D, dim=-1)))


def test_bad_inputs_are_refused(device):
    q = torch.zeros(2, 1, 4, 6, device=device)
    with pytest.raises(ValueError, match="6 channels do not split into heads=4"):
        K.ssa_neuron(q, q, q, 4, 0.125, kind="lif")
    with pytest.raises(ValueError, match=r"tokens \[T, B, N, C\] of one shape"):
        K.ssa_neuron(q, q[:, :, :3], q, 2, 0.125, kind="lif")
    with pytest.raises(TypeError, match="torch.float64; the Triton attention kernels take one of float32"):
        K.spike_kv(q, q.double(), 2)


@pytest.mark.slow  # compiling takes seconds
def test_torch_compile_fullgraph(device):
    """The registered operators trace whole (values and gradients equal to eager)."""
    import torch._dynamo

    torch._dynamo.reset()
    T, B, N, H, D = 2, 2, 5, 2, 4
    qkv, grad = _qkv(T, B, N, H * D, torch.float32, device, seed=4)

    def fn(x):
        q, k, v = x.split(H * D, dim=-1)
        return K.ssa_neuron(q, k, v, H, 0.5, kind="lif", v_threshold=0.5, detach_reset=True) * grad

    backend = "inductor" if device.type == "cuda" else "aot_eager"
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    a, b = qkv.clone().requires_grad_(), qkv.clone().requires_grad_()
    ya, yb = compiled(a), fn(b)
    ya.sum().backward()
    yb.sum().backward()
    assert torch.equal(ya, yb)
    assert_close(a.grad, b.grad, what="dL/dq,k,v")


@pytest.mark.gpu
def test_cuda_graph_capture(device):
    """The attention's forward and backward in a CUDA graph: nothing synchronises with the host."""
    T, B, N, H, D = 4, 8, 64, 4, 32
    qkv, grad = _qkv(T, B, N, H * D, torch.bfloat16, device, seed=5)
    leaf = qkv.clone().requires_grad_()
    layer = QKVNeuron(H, 0.125, build_neuron(type="PLIF", v_threshold=0.5, backend="triton"), "triton").to(device)

    def step():
        leaf.grad = None
        s = layer(*leaf.split(H * D, dim=-1))
        (s * grad).sum().backward()
        return s

    graph, s = capture_cuda_graph(step)
    eager = layer(*qkv.split(H * D, dim=-1))
    graph.replay()
    assert torch.equal(s, eager)
