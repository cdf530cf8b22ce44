"""Parallel spiking neurons (PSN, MaskedPSN, SlidingPSN): both backends against SpikingJelly 2.0.0's modules of
the same names (same weights, multi-step), the Triton kernels against the torch backend in every dtype and
layout, bad input, torch.compile, state dicts, the efficiency report's counts and the NIR export's refusal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _testing import SUMMED, TOLERANCES, assert_close
from snntrain.nn import PSN, MaskedPSN, SlidingPSN, set_backend
from snntrain.nn.layers import MultiStep

sjn = pytest.importorskip("spikingjelly.activation_based.neuron")
BACKENDS = ("torch", "triton")


def _pair(name: str, T: int):
    """(SpikingJelly's module, ours) with the same parameters and buffers, thresholds spread around the
    inputs' range so that about half the neurons fire."""
    torch.manual_seed(T)
    if name == "PSN":
        sj, ours = sjn.PSN(T), PSN(T)
    elif name == "MaskedPSN-0.3":
        sj, ours = sjn.MaskedPSN(2, T, lambda_init=0.3, step_mode="m"), MaskedPSN(2, T, lambda_init=0.3)
    elif name == "MaskedPSN-1":
        sj, ours = sjn.MaskedPSN(3, T, lambda_init=1.0, step_mode="m"), MaskedPSN(3, T, lambda_init=1.0)
    elif name == "SlidingPSN":
        sj, ours = sjn.SlidingPSN(3, exp_init=False, step_mode="m"), SlidingPSN(3, exp_init=False)
    else:  # a window longer than the sequence
        sj, ours = sjn.SlidingPSN(T + 2, step_mode="m"), SlidingPSN(T + 2)
    with torch.no_grad():
        sj.bias.uniform_(-0.3, 0.3)
    ours.load_state_dict(sj.state_dict())
    return sj, ours


def _run(module, x: torch.Tensor, g: torch.Tensor | None):
    """(spikes, dL/dx, dL/dweight, dL/dbias) of ``(module(x) * g).sum()`` (``g`` None: ``module(x).sum()``, whose
    gradient reaches the module expanded, one value for every element)."""
    x = x.detach().clone().requires_grad_()
    module.zero_grad()
    s = module(x)
    (s.sum() if g is None else (s * g).sum()).backward()
    return s.detach(), x.grad, module.weight.grad.clone(), module.bias.grad.clone()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["PSN", "MaskedPSN-0.3", "MaskedPSN-1", "SlidingPSN", "SlidingPSN-long"])
def test_matches_spikingjelly(name, backend, device):
    """Same spikes, input and parameter gradients as SpikingJelly's module, shapes with prime sizes."""
    T = 5
    sj, ours = _pair(name, T)
    ours.backend = backend
    x = torch.randn(T, 3, 2, 7)
    g = torch.randn(T, 3, 2, 7)
    s0, gx0, gw0, gb0 = _run(sj, x, g)
    s1, gx1, gw1, gb1 = _run(ours.to(device), x.to(device), g.to(device))
    assert 0.2 < s0.mean() < 0.8
    assert torch.equal(s1.cpu(), s0)
    assert s1.dtype == torch.float32 and s1.shape == x.shape
    tol = {} if backend == "torch" else SUMMED  # the kernels sum in another order (and divide fast on a GPU)
    assert_close(gx1, gx0, **tol, what="dx")
    assert_close(gw1, gw0, **SUMMED, what="dweight")
    assert_close(gb1, gb0, **SUMMED, what="dbias")


@pytest.mark.parametrize("T", [1, 4, 16])
def test_triton_equals_torch_backend_over_t_with_expanded_gradient(T, device):
    """Every sequence length the kernels unroll alike (1: the product is one multiply), the spikes' gradient
    of ``.sum()`` (stride 0) read in place."""
    torch.manual_seed(T)
    ref = PSN(T, surrogate="sigmoid", alpha=3.0, backend="torch").to(device)
    with torch.no_grad():
        ref.bias.uniform_(-0.5, 0.5)
    ours = PSN(T, surrogate="sigmoid", alpha=3.0, backend="triton").to(device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(T, 2, 9, device=device)
    s0, gx0, gw0, gb0 = _run(ref, x, None)
    s1, gx1, gw1, gb1 = _run(ours, x, None)
    assert torch.equal(s1, s0)
    assert_close(gx1, gx0, **SUMMED, what="dx")
    assert_close(gw1, gw0, **SUMMED, what="dweight")
    assert_close(gb1, gb0, **SUMMED, what="dbias")


@pytest.mark.parametrize("name", ["MaskedPSN", "SlidingPSN"])
@pytest.mark.parametrize("T", [3, 12, 17])
def test_persistent_backward_walks_many_blocks(T, name, device, monkeypatch):
    """Each backward (per-thread sums up to T = 8 and for the sliding form up to 16; tiles beyond, from T = 9 for
    the masked form): two programs walk
    five blocks of 16 neurons each, carrying their dL/dW and dL/db across blocks into one partial row each, which
    the finishing kernel maps onto the parameters (mask; sliding diagonals and the shared bias); a gradient of the
    spikes with its own layout."""
    from snntrain.kernels import psn as K

    monkeypatch.setattr(K.tuning, "bwd_block", lambda T, sums: 16)
    monkeypatch.setattr(K.tuning, "mma_block", lambda T: (16, 16))
    monkeypatch.setattr(K.tuning, "dot_tiles", lambda T: (16, 32))
    monkeypatch.setattr(K.tuning, "bwd_programs", lambda per_sm, n_blocks, sms: 2)
    monkeypatch.setattr(K.tuning, "dot_programs", lambda N, block, sms, *form: 2)
    K.clear_plans()
    torch.manual_seed(T)
    if name == "MaskedPSN":
        ref, ours = MaskedPSN(3, T, lambda_init=0.5, backend="torch"), MaskedPSN(3, T, backend="triton")
    else:
        ref, ours = SlidingPSN(4, exp_init=False, backend="torch"), SlidingPSN(4, backend="triton")
    ref = ref.to(device)
    with torch.no_grad():
        ref.bias.uniform_(-0.5, 0.5)
    ours = ours.to(device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(T, 5, 15, device=device)  # 75 neurons: five blocks, the last one partial
    g = torch.randn(T, 15, 5, device=device).transpose(1, 2)
    try:
        s0, gx0, gw0, gb0 = _run(ref, x, g)
        s1, gx1, gw1, gb1 = _run(ours, x, g)
    finally:
        K.clear_plans()
    assert torch.equal(s1, s0)
    assert_close(gx1, gx0, **SUMMED, what="dx")
    assert_close(gw1, gw0, **SUMMED, what="dweight")
    assert_close(gb1, gb0, **SUMMED, what="dbias")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("surrogate", ["atan", "piecewise_quadratic"])
def test_16_bit_input_against_the_fp32_reference(dtype, surrogate, device):
    """16-bit input: the kernels charge in fp32, like the torch backend, whose fp32 result is the oracle;
    spikes and dL/dx come back in the input's dtype."""
    T = 6
    torch.manual_seed(2)
    ref = SlidingPSN(4, exp_init=False, surrogate=surrogate, backend="torch").to(device)
    ours = SlidingPSN(4, exp_init=False, surrogate=surrogate, backend="triton").to(device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(T, 3, 11, device=device).to(dtype)
    g = torch.randn(T, 3, 11, device=device).to(dtype)
    s0, gx0, gw0, gb0 = _run(ref, x.float(), g.float())
    s1, gx1, gw1, gb1 = _run(ours, x, g)
    assert s1.dtype == dtype and gx1.dtype == dtype
    assert torch.equal(s1.float(), s0)
    assert_close(gx1, gx0, dtype, what="dx")
    assert_close(gw1, gw0, **SUMMED, what="dweight")
    assert_close(gb1, gb0, **SUMMED, what="dbias")


def test_channels_last_is_read_in_place_and_kept(device):
    """A channels-last map [T, B, C, H, W] gives spikes and dL/dx in its layout, equal to the contiguous run."""
    T = 3
    torch.manual_seed(5)
    m = MaskedPSN(2, T, lambda_init=0.5, backend="triton").to(device)
    with torch.no_grad():
        m.bias.zero_()
    x = torch.randn(T, 2, 5, 3, 4, device=device)
    xc = x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)  # channels-last storage, same values
    g = torch.randn_like(x)
    s0, gx0, gw0, _ = _run(m, x, g)
    s1, gx1, gw1, _ = _run(m, xc, g)
    assert s1.stride() == xc.stride() and gx1.stride() == xc.stride()
    assert torch.equal(s1, s0)
    assert_close(gx1, gx0, what="dx")
    assert_close(gw1, gw0, **SUMMED, what="dweight")


def test_only_the_gradients_asked_for(device):
    """Inference (no gradient) and a frozen weight: the spikes are the same and only the asked gradients exist."""
    T = 4
    m = PSN(T, backend="triton").to(device)
    x = torch.randn(T, 2, 3, device=device)
    with torch.no_grad():
        s = m(x)
    m.weight.requires_grad_(False)
    xg = x.clone().requires_grad_()
    s2 = m(xg)
    s2.sum().backward()
    assert torch.equal(s, s2.detach())
    assert m.weight.grad is None and m.bias.grad is not None and xg.grad is not None
    empty = m(torch.zeros(T, 0, 3, device=device, requires_grad=True))
    empty.sum().backward()
    assert empty.shape == (T, 0, 3)


def test_masked_lambda_schedule_and_sliding_weight():
    """``lambda_`` fades the band mask in (values past 1 act as 1, as in SpikingJelly) and the sliding row fills
    the band of the [T, T] matrix."""
    m = MaskedPSN(2, 4, lambda_init=0.0, backend="torch")
    assert torch.equal(m.masked_weight(), m.weight.detach())
    m.lambda_ = 2.0
    assert float(m.lambda_) == 2.0
    band = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.float32)
    assert torch.equal(m.masked_weight(), m.weight.detach() * band)
    s = SlidingPSN(3, backend="torch")
    assert s.weight.tolist() == [0.25, 0.5, 1.0]
    sj = sjn.SlidingPSN(3)
    sj.load_state_dict(s.state_dict())
    for T in (1, 2, 5):
        assert torch.equal(s.gen_gemm_weight(T), sj.gen_gemm_weight(T))


def test_bad_input_is_named(device):
    m = PSN(4, backend="torch")
    with pytest.raises(ValueError, match=r"PSN\(T=4\) got input with 3 time steps"):
        m(torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"at least 2 dimensions.*\(4,\)"):
        m(torch.zeros(4))
    with pytest.raises(TypeError, match="floating-point input; got torch.int64"):
        m(torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="SlidingPSN\\(T=3\\) got input with 4"):
        SlidingPSN(2, T=3, backend="torch")(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="backend='cuda' is not valid; choose one of auto, torch, triton"):
        PSN(4, backend="cuda")
    with pytest.raises(ValueError, match="surrogate='relu' is not valid; choose one of sigmoid, atan"):
        MaskedPSN(2, 4, surrogate="relu")
    with pytest.raises(ValueError, match="step_mode='s' is not valid; choose 'm'"):
        SlidingPSN(2, step_mode="s")
    for bad in (dict(k=0, T=4), dict(k=2, T=0), dict(k=2, T=4, lambda_init="x")):
        with pytest.raises(ValueError, match="must be"):
            MaskedPSN(**bad)
    with pytest.raises(ValueError, match="exp_init=1 must be true or false"):
        SlidingPSN(2, exp_init=1)
    with pytest.raises(ValueError, match="T=65 time steps; the Triton PSN kernels take at most 64"):
        SlidingPSN(2, backend="triton")(torch.zeros(65, 1, device=device))
    with pytest.raises(TypeError, match="float64; the Triton PSN kernels take float32, float16 or bfloat16"):
        PSN(2, backend="triton").double()(torch.zeros(2, 3, dtype=torch.float64, device=device))


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend, device):
    """Forward and backward trace without graph breaks (aot_eager on CPU, inductor on CUDA), same results."""
    compile_backend = "inductor" if device.type == "cuda" else "aot_eager"
    torch._dynamo.reset()
    torch.manual_seed(3)
    net = nn.Sequential(MultiStep(nn.Linear(6, 8)), MaskedPSN(2, 4, lambda_init=0.5, backend=backend),
                        MultiStep(nn.Linear(8, 3)), SlidingPSN(2, backend=backend)).to(device)
    compiled = torch.compile(net, fullgraph=True, backend=compile_backend)
    x = torch.randn(4, 5, 6, device=device)
    results = []
    for f in (net, compiled):
        net.zero_grad()
        out = f(x)
        out.sum().backward()
        results.append((out.detach(), net[0][0].weight.grad.clone(), net[1].weight.grad.clone()))
    (o0, g0, w0), (o1, g1, w1) = results
    assert torch.equal(o1, o0)
    assert_close(g1, g0, **SUMMED, what="compiled linear dweight")
    assert_close(w1, w0, **SUMMED, what="compiled PSN dweight")


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_dynamic_shapes(backend, device):
    """``dynamic=True``: SlidingPSN takes sequences and batches of several sizes through one compiled function
    (the kernels specialise on T)."""
    compile_backend = "inductor" if device.type == "cuda" else "aot_eager"
    torch._dynamo.reset()
    m = SlidingPSN(2, exp_init=False, backend=backend).to(device)
    compiled = torch.compile(m, dynamic=True, fullgraph=True, backend=compile_backend)
    for T, n in ((3, 5), (6, 7), (4, 11)):
        x = torch.randn(T, 2, n, device=device)
        s0, gx0, gw0, _ = _run(m, x, None)
        s1, gx1, gw1, _ = _run(compiled, x, None)
        assert torch.equal(s1, s0)
        assert_close(gx1, gx0, what="compiled dx")
        assert_close(gw1, gw0, **SUMMED, what="compiled dweight")


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_export(backend, device):
    """``torch.export`` traces the three modules (the Triton backend as the registered ``psn_fwd`` operator) and
    the exported program computes the same spikes."""
    torch.manual_seed(9)
    net = nn.Sequential(PSN(4, backend=backend), MaskedPSN(2, 4, lambda_init=0.5, backend=backend),
                        SlidingPSN(2, backend=backend)).to(device).eval()
    x = torch.randn(4, 3, 5, device=device)
    program = torch.export.export(net, (x,))
    ops = [str(n.target) for n in program.graph.nodes if n.op == "call_function" and "snntrain" in str(n.target)]
    assert ops == (["snntrain.psn_fwd.default"] * 3 if backend == "triton" else [])
    assert torch.equal(program.module()(x), net(x))


def test_state_dict_round_trip(tmp_path):
    """Saved and loaded (weights only) the module computes the same; SpikingJelly's keys and buffers load both
    ways; set_backend reaches the parallel neurons and leaves the state dict alone."""
    T = 4
    torch.manual_seed(4)
    net = nn.Sequential(PSN(T, backend="torch"), MaskedPSN(2, T, lambda_init=0.25, backend="torch"),
                        SlidingPSN(2, exp_init=False, backend="torch"))
    torch.save(net.state_dict(), tmp_path / "psn.pt")
    back = nn.Sequential(PSN(T, backend="torch"), MaskedPSN(2, T, backend="torch"), SlidingPSN(2, backend="torch"))
    back.load_state_dict(torch.load(tmp_path / "psn.pt", weights_only=True))
    assert float(back[1].lambda_) == 0.25
    x = torch.randn(T, 3, 5)
    assert torch.equal(back(x), net(x))
    keys = {"0": {"weight", "bias"}, "1": {"weight", "bias", "_lambda_", "mask0", "mask1"}, "2": {"weight", "bias"}}
    for i, sj in enumerate((sjn.PSN(T), sjn.MaskedPSN(2, T), sjn.SlidingPSN(2))):
        assert set(sj.state_dict()) == keys[str(i)]
        sj.load_state_dict(net[i].state_dict())
    before = set(net.state_dict())
    set_backend(net, "triton")
    assert all(m.backend == "triton" for m in net) and set(net.state_dict()) == before


def test_registered_operators_and_tolerance_table():
    """The kernels' operators are registered by ``import snntrain.kernels`` (exported programs load them)."""
    import snntrain.kernels as k

    assert {"psn_fwd", "psn_bwd"} <= set(k.registered_ops())
    assert TOLERANCES[torch.float32][0] <= SUMMED["rtol"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_after_a_norm(backend, device):
    """NormNeuron takes a parallel neuron after its norm (unfused): the same as the norm, then the neuron, also
    for a static image repeated over T (an expanded time axis read in place)."""
    from snntrain.nn import NormNeuron

    T = 3
    torch.manual_seed(8)
    layer = NormNeuron(nn.BatchNorm2d(4), SlidingPSN(2, exp_init=False, backend=backend), backend=backend)
    layer = layer.to(device).eval()
    with torch.no_grad():
        layer.norm.running_mean.uniform_(-0.5, 0.5)
    x = torch.randn(T, 2, 4, 3, 5, device=device)
    with torch.no_grad():
        expected = layer.neuron(layer.norm(x.flatten(0, 1)).unflatten(0, (T, 2)))
        assert torch.equal(layer(x), expected)
        image = x[0]
        repeated = layer.neuron(layer.norm(image).unsqueeze(0).expand(T, *image.shape).contiguous())
        assert torch.equal(layer(image, T=T), repeated)
    with pytest.raises(TypeError, match=r"NormNeuron takes a spiking neuron of snntrain.nn \(IF, LIF, PLIF, PSN, "
                                        r"MaskedPSN, SlidingPSN"):
        NormNeuron(nn.BatchNorm2d(4), nn.ReLU())


def test_efficiency_report_counts_psn_spikes():
    """A PSN layer is a spiking layer of the efficiency report: its spikes and neuron-steps are counted."""
    from snntrain import efficiency as E

    T = 3
    torch.manual_seed(6)
    net = nn.Sequential(MultiStep(nn.Linear(4, 6)), PSN(T, backend="torch"))
    with torch.no_grad():
        net[1].bias.zero_()
    assert [name for name, _ in E.spiking_layers(net)] == ["1"]
    counter = E.ActivityCounter(net, backend="torch").attach()
    x = torch.randn(T, 2, 4)
    with torch.no_grad():
        s = net(x)
    counter.detach()
    layer = counter.unpack(counter.totals())["spiking"]["1"]
    assert layer["spikes"] == float(s.sum()) > 0
    assert layer["neuron_steps"] == s.numel()


def test_nir_export_refuses_psn_with_the_reason():
    """NIR has no product over time: a network with a PSN is refused, naming the layer and why."""
    pytest.importorskip("nir")
    from snntrain.models import SEWResNet
    from snntrain.nir_graph import NIRError, to_nir

    model = SEWResNet(depth=18, num_classes=3, in_channels=2, T=2, width=4, backend="torch")
    model.sn1.neuron = PSN(2, backend="torch")
    with pytest.raises(NIRError, match=r"PSN has no NIR equivalent: a parallel spiking neuron .*\(nodes: sn1\)"):
        to_nir(model.eval(), (2, 8, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [32, 64])
def test_long_sequences_on_the_gpu(T, device):
    """The longest unrolled kernels compile and agree with the fp64 product: spikes equal wherever H is not within
    rounding of 0, gradients close."""
    torch.manual_seed(T)
    m = PSN(T, backend="triton").to(device)
    with torch.no_grad():
        m.bias.uniform_(-0.3, 0.3)
    x = torch.randn(T, 4, 1031, device=device)
    s, gx, gw, gb = _run(m, x, None)
    ref = PSN(T, backend="torch").to(device).double()
    ref.load_state_dict(m.state_dict())
    s0, gx0, gw0, gb0 = _run(ref, x.double(), None)
    h = torch.addmm(ref.bias, ref.weight, x.double().flatten(1)).view(x.shape)
    decided = h.abs() > 1e-4
    assert torch.equal(s.double()[decided], s0[decided])
    assert_close(gx, gx0.float(), **SUMMED, what="dx")
    assert_close(gw, gw0.float(), rtol=1e-3, atol=1e-3, what="dweight")  # sums over 4124 neurons in fp32
    assert_close(gb, gb0.float(), rtol=1e-3, atol=1e-3, what="dbias")


@pytest.mark.gpu
@pytest.mark.parametrize("cls", ["PSN", "MaskedPSN", "SlidingPSN"])
def test_cuda_graph_capture(cls, device):
    """Forward and backward capture in a CUDA graph (no host synchronisation) and replay on new data."""
    from _testing import capture_cuda_graph

    T = 4
    torch.manual_seed(7)
    m = {"PSN": lambda: PSN(T), "MaskedPSN": lambda: MaskedPSN(2, T, lambda_init=0.5),
         "SlidingPSN": lambda: SlidingPSN(3)}[cls]().to(device)
    x = torch.randn(T, 8, 33, device=device, requires_grad=True)
    g = torch.randn(T, 8, 33, device=device)

    def step():
        x.grad = None
        m.weight.grad = None
        s = m(x)
        (s * g).sum().backward()
        return s, x.grad, m.weight.grad

    graph, (s, gx, gw) = capture_cuda_graph(step)
    new = torch.randn_like(x)
    with torch.no_grad():
        x.copy_(new)
    graph.replay()
    s0, gx0, gw0, _ = _run(m, new, g)
    assert torch.equal(s, s0)
    assert_close(gx, gx0, what="dx")
    assert_close(gw, gw0, **SUMMED, what="dweight")


def test_benchmark_suite_runs_on_tiny_shapes(tmp_path, monkeypatch, device):
    """``scripts/bench_neurons.py --suite psn`` end to end on tiny shapes (the CUDA calls of its timing and memory
    measurement stubbed; on the GPU where there is one, else on the CPU with the kernels in Triton's interpreter):
    one JSON line per neuron, T, dtype and provider, and the target checks."""
    import importlib.util
    import json
    import sys
    import time as _time
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))
    spec = importlib.util.spec_from_file_location("bench_neurons_psn_test", scripts / "bench_neurons.py")
    bn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bn)
    bu = sys.modules["bench_utils"]
    monkeypatch.setattr(bn, "PSN_SHAPE", (2, 8))
    monkeypatch.setattr(bn, "PSN_T", (3, 9))  # the per-thread and (dense, masked) the tensor-core backward
    if device.type != "cuda":  # the script moves its modules and tensors to CUDA: keep them where they are
        monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
        monkeypatch.setattr(nn.Module, "cuda", lambda self, *a, **k: self)
    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 2**20)
    monkeypatch.setattr(bn, "make_input", lambda shape, dtype, expanded, seed=0: (lambda t: (t, t))(
        (torch.randn(shape, device=device) + 0.5).to(dtype).requires_grad_()))
    monkeypatch.setattr(bu, "bench_ms", lambda fn, quick=False, grad_to_none=None: (fn(), 1.0)[1])
    monkeypatch.setattr(bu, "graph_ms", lambda fn, quick=False: (fn(), (1.0, ""))[1])
    monkeypatch.setattr(bu, "copy_bandwidth", lambda: 1.0)
    monkeypatch.setattr(bu, "gpu_name", lambda: "cpu")
    monkeypatch.setattr(bu, "plot", lambda *a, **k: None)
    bn.psn_suite(tmp_path, quick=False, deadline=_time.time() + 600)
    lines = [json.loads(line) for line in (tmp_path / "bench_neurons_psn.jsonl").read_text().splitlines()]
    assert len(lines) == 3 * 2 * 2 * 3  # neurons x T x dtypes x providers
    assert {(d["neuron"], d["provider"]) for d in lines} >= {("SlidingPSN", "sj"), ("PSN", "ours-triton")}
    assert all(d["peak_mib"] == 1.0 and d["ms"] == 1.0 for d in lines)
    assert all(d["graph_ms"] == 1.0 for d in lines if d["provider"] == "ours-triton")  # the kernels' GPU time
    assert (tmp_path / "bench_neurons_psn.md").read_text().count("faster than SpikingJelly") == 12
