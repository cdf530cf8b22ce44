"""The fused norm -> neuron kernels (snntrain.kernels.bn_neuron, ln_neuron) against the unfused reference.

The oracle is :class:`~snntrain.nn.norm_neuron.NormNeuron` with ``backend="torch"``:
:class:`torch.nn.BatchNorm2d` or ``LayerNorm2d`` followed by the PyTorch neuron. On a machine
without CUDA the kernels run in Triton's CPU interpreter (conftest.py); on a GPU machine the
same tests run the compiled kernels.

Tolerances. fp32: statistics and sums are reduced in another order than PyTorch's, so the
normalised input differs in its last bits; spikes are still expected to be equal on these
inputs, gradients within ``_testing.SUMMED``. 16-bit input: the kernels compute in fp32 from
the 16-bit values, so the reference runs in fp32 on the same (upcast) values: spikes equal,
dL/dx within two units in the last place of its dtype (the table's rtol, taken relative to
the largest value, as the batch-norm gradient subtracts channel means), parameter gradients
(fp32) within ``SUMMED``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from _testing import SUMMED, TOLERANCES, assert_close, capture_cuda_graph
from snntrain.kernels import bn_neuron as K
from snntrain.kernels import ln_neuron as LN
from snntrain.kernels import neuron_step as NS
from snntrain.kernels import norm_neuron_base as NB
from snntrain.models import SEWResNet
from snntrain.nn import LayerNorm2d, NormNeuron, build_neuron, set_backend

# Running statistics: one mean and variance per channel, folded in like BatchNorm2d's.
RUNNING = dict(rtol=1e-5, atol=1e-7)


def _module(norm: str, C: int, neuron: dict, affine: bool = True, seed: int = 0, **bn) -> NormNeuron:
    g = torch.Generator().manual_seed(seed)
    m = nn.BatchNorm2d(C, affine=affine, **bn) if norm == "bn" else LayerNorm2d(C, affine=affine)
    if affine:
        with torch.no_grad():
            m.weight.copy_(torch.rand(C, generator=g) * 0.8 + 0.6)
            m.bias.copy_(torch.rand(C, generator=g) * 0.8 - 0.3)
    return NormNeuron(m, build_neuron(**neuron), backend="torch")


def _inputs(shape, seed, dtype=torch.float32, T=None):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 1.5 + 0.4).to(dtype)
    gshape = shape if T is None else (T, *shape)
    g_s = torch.randn(gshape, generator=g).to(dtype).float()  # representable in dtype
    return x, g_s


def _run(m: NormNeuron, backend: str, x: torch.Tensor, g_s: torch.Tensor, steps=None, make_x=None):
    set_backend(m, backend)
    xl = x.detach().clone().requires_grad_()
    xin = make_x(xl) if make_x is not None else xl
    s = m(xin, T=steps)
    if callable(g_s):
        g_s = g_s(s.shape)
    params = {name: p for name, p in m.named_parameters() if p.requires_grad}
    grads = torch.autograd.grad((s.float() * g_s).sum(), [xl, *params.values()])
    return s, grads[0], dict(zip(params, grads[1:]))


def _check(norm, neuron, shape, device, *, dtype=torch.float32, steps=None, make_x=None, seed=0, affine=True,
           layout=None):
    C = shape[-3]
    m = _module(norm, C, neuron, affine=affine, seed=seed).to(device)
    ref = copy.deepcopy(m)
    x, _ = _inputs(shape, seed, dtype, steps)
    if layout == "channels_last":
        x = x.flatten(0, -4).contiguous(memory_format=torch.channels_last).unflatten(0, shape[:-3])
    x = x.to(device)

    def g_s(out_shape):  # dL/dS for the output's shape, representable in dtype
        g = torch.Generator().manual_seed(seed + 1000)
        return torch.randn(out_shape, generator=g).to(dtype).float().to(device)

    s0, gx0, gp0 = _run(ref, "torch", x.float(), g_s, steps, make_x)
    s1, gx1, gp1 = _run(m, "triton", x, g_s, steps, make_x)
    assert s1.dtype == dtype and s1.shape == s0.shape
    assert torch.equal(s1.float(), s0), f"spikes differ in {(s1.float() != s0).sum().item()} of {s0.numel()}"
    if layout == "channels_last":
        assert s1.flatten(0, 1).is_contiguous(memory_format=torch.channels_last), "spikes not in x's format"
    assert gx1.dtype == dtype and gx1.shape == x.shape
    if dtype == torch.float32:
        assert_close(gx1, gx0, **SUMMED, what="dx")
    else:  # relative to the largest |dL/dx|
        assert_close(gx1, gx0, rtol=0, atol=TOLERANCES[dtype][0] * gx0.abs().max().item(), what="dx")
    for name, g in gp0.items():
        assert_close(gp1[name], g, **SUMMED, what=name)
    if norm == "bn":
        for buf in ("running_mean", "running_var", "num_batches_tracked"):
            assert_close(getattr(m.norm, buf), getattr(ref.norm, buf), **RUNNING, what=buf)
    return m, ref


_NEURONS = [
    dict(type="LIF", tau=2.0, surrogate="atan", detach_reset=True),  # the SEW-ResNet default
    dict(type="IF", v_reset=None, surrogate="sigmoid"),
    dict(type="PLIF", init_tau=2.5, surrogate="piecewise_quadratic", v_reset=None),
    dict(type="PLIF", init_tau=3.0, decay_input=False, v_reset=-0.1, v_threshold=0.7, surrogate="sigmoid",
         alpha=2.5),
    dict(type="LIF", tau=1.7, decay_input=False, detach_reset=True, v_reset=None, surrogate="atan", alpha=3.0),
]


_OPTION_CASES = [("bn", i) for i in range(len(_NEURONS))] + [("ln", i) for i in (0, 3)]


@pytest.mark.parametrize("norm,neuron", _OPTION_CASES)
def test_every_neuron_option(norm, neuron, device):
    _check(norm, _NEURONS[neuron], (3, 2, 5, 3, 7), device, seed=neuron)


@pytest.mark.parametrize("norm", ["bn", "ln"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_16_bit_input(norm, dtype, device):
    _check(norm, _NEURONS[2], (4, 3, 6, 5, 3), device, dtype=dtype, seed=7, layout="channels_last")


_LAYOUTS = ["nchw", "channels_last", "steps", "steps_channels_last", "stride0", "copied"]
_LAYOUT_CASES = [("bn", lay) for lay in _LAYOUTS] + [("ln", lay) for lay in ("channels_last", "steps", "copied")]


@pytest.mark.parametrize("norm,layout", _LAYOUT_CASES)
def test_layouts(norm, layout, device):
    """Both memory formats in place, the direct-encoding input (``steps``), a 5-D stride-0 time
    axis (statistics over all T copies, as MultiStep would) and a layout that is copied once."""
    neuron = _NEURONS[3]
    if layout in ("steps", "steps_channels_last"):
        x_cl = layout == "steps_channels_last"
        T = 3
        m, _ = _check(norm, neuron, (2, 5, 4, 3), device, steps=T, seed=11,
                      make_x=(lambda t: t.contiguous(memory_format=torch.channels_last)) if x_cl else None)
        return
    if layout == "stride0":
        _check(norm, neuron, (1, 2, 5, 4, 3), device, seed=12, make_x=lambda t: t.expand(3, 2, 5, 4, 3))
        return
    if layout == "copied":  # H and W transposed: they do not fold into one strided run
        _check(norm, neuron, (3, 2, 5, 4, 6), device, seed=13, make_x=lambda t: t.transpose(-1, -2))
        return
    _check(norm, neuron, (3, 2, 5, 4, 3), device, seed=14, layout="channels_last" if layout != "nchw" else None)


def test_eager_plans_are_reused_per_layout_and_kept_apart(device):
    """Eager calls keep one launch plan per layout (shape, strides, options): a second round over the same
    layouts adds no plan and gives the reference's spikes and gradients again, while a layout seen in between
    (other strides, another batch, the direct encoding) never runs with another layout's plan."""
    neuron = _NEURONS[0]
    layouts = [dict(shape=(3, 2, 5, 4, 3)), dict(shape=(3, 2, 5, 4, 3), layout="channels_last"),
               dict(shape=(3, 4, 5, 4, 3)), dict(shape=(3, 2, 5, 4, 6), make_x=lambda t: t.transpose(-1, -2)),
               dict(shape=(2, 5, 4, 3), steps=3)]
    for norm in ("bn", "ln"):
        for case in layouts:
            _check(norm, neuron, device=device, seed=31, **case)
    caches = (K._BN_FWD_PLANS, K._BN_BWD_PLANS, LN._LN_FWD_PLANS, LN._LN_BWD_PLANS)
    plans = [len(c) for c in caches]
    for norm in ("bn", "ln"):
        for case in reversed(layouts):
            _check(norm, neuron, device=device, seed=32, **case)
    assert [len(c) for c in caches] == plans


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_eager_plans_finish_their_sums_in_the_last_program(layout, device):
    """An eager plan's batch statistics and backward sums are finished by the last program of each channel block
    to store its partials (an arrival counter per block), the operator's plan by finishing kernels: both give the
    same statistics, running statistics, batch count and gradients, call after call, and every counter is back at
    zero after each launch (a counter left at one more would finish the next call's sums too early)."""
    C = 24
    x = torch.randn(3, 4, C, 6, 5, generator=torch.Generator().manual_seed(5)) * 1.3 + 0.2
    if layout == "channels_last":
        x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (3, 4))
    x, g = x.to(device), torch.randn(3, 4, C, 6, 5, generator=torch.Generator().manual_seed(6)).to(device)
    w, b = torch.linspace(0.5, 1.5, C, device=device), torch.linspace(-0.5, 0.5, C, device=device)
    T, flags, k, _ = NB._prepare(x, None, dict(kind="lif", tau=2.0))
    flags |= K.F_BATCH_STATS | K.F_UPDATE_RUNNING | NS.F_SAVE_CKPT
    params = [*NB._params(k, {}, 1e-5), 0.1]
    K._BN_FWD_PLANS.clear()
    K._BN_BWD_PLANS.clear()
    results = []
    for wrap in (K.direct, lambda kernel: kernel):  # the eager plan; the operator's, with finishing kernels
        rm, rv = torch.zeros(C, device=device), torch.ones(C, device=device)
        nbt = torch.zeros((), dtype=torch.long, device=device)
        for _ in range(3):
            spikes, mean, rstd, var, ckpt = K._bn_fwd_host(x, w, b, rm, rv, None, T, params, flags, True, wrap,
                                                           nbt=nbt, eager=wrap is K.direct)
            gx, gw, gb, _ = K._bn_bwd_host(x, w, b, mean, rstd, ckpt, None, g, T, params,
                                           flags | NS.F_GRAD_X | NB.F_GRAD_WB, True, wrap, eager=wrap is K.direct)
        results.append(dict(spikes=spikes, mean=mean, rstd=rstd, var=var, running_mean=rm, running_var=rv, nbt=nbt,
                            gx=gx, gw=gw, gb=gb))
    fused, kernels = results
    assert torch.equal(fused["spikes"], kernels["spikes"])
    assert int(fused["nbt"]) == int(kernels["nbt"]) == 3
    for name in ("mean", "rstd", "var", "running_mean", "running_var"):
        assert_close(fused[name], kernels[name], **RUNNING, what=name)
    for name in ("gx", "gw", "gb"):
        assert_close(fused[name], kernels[name], **SUMMED, what=name)
    counters = [a for cache in (K._BN_FWD_PLANS, K._BN_BWD_PLANS) for plan in cache.values()
                for planned in plan.launches for a in planned.args if isinstance(a, torch.Tensor)]
    assert len(counters) == 2, "one counter tensor per eager plan (forward statistics, backward sums)"
    for c in counters:
        assert c.dtype == torch.int32 and not c.any(), c


def test_stride0_grad_output_and_layout(device):
    """dL/dS given as an expanded tensor (a plain sum) and a channels-last input."""
    m = _module("bn", 3, _NEURONS[0]).to(device)
    ref = copy.deepcopy(m)
    x, _ = _inputs((2, 3, 3, 5, 5), 3)
    x = x.to(device)
    outs = []
    for mod, backend in ((ref, "torch"), (m, "triton")):
        set_backend(mod, backend)
        xl = x.clone().requires_grad_()
        mod(xl).sum().backward()
        outs.append(xl.grad)
    assert_close(outs[1], outs[0], **SUMMED, what="dx")


@pytest.mark.parametrize("norm", ["bn", "ln"])
@pytest.mark.parametrize("T,layout", [(1, None), (11, None), (11, "channels_last"), (11, "steps_channels_last"),
                                      (11, "stride0")])
def test_time_lengths(norm, T, layout, device):
    """T = 1, and T = 11: two chunks of 8 steps with a state checkpoint between them, in both memory formats (the
    checkpoints are kept in the input's), for the direct-encoding input (``steps``) and a 5-D stride-0 time axis
    (one input for every chunk)."""
    if layout == "steps_channels_last":
        _check(norm, _NEURONS[2], (2, 12, 5, 3), device, steps=T, seed=21,
               make_x=lambda t: t.contiguous(memory_format=torch.channels_last))
    elif layout == "stride0":
        _check(norm, _NEURONS[2], (1, 2, 12, 5, 3), device, seed=22, make_x=lambda t: t.expand(T, 2, 12, 5, 3))
    else:
        _check(norm, _NEURONS[2], (T, 2, 12, 5, 3) if layout else (T, 2, 3, 5, 3), device, seed=20 + T,
               layout=layout)


def test_backward_without_prefetch(monkeypatch, device):
    """The batch-norm neuron's backward with each chunk's loads issued at its own scan
    (``norm_neuron_tuning.BWD_PREFETCH`` off, a launch setting the sweep compares) gives the reference's results;
    ``clear_plans`` makes the setting reach the next call."""
    from snntrain.kernels import bn_neuron, norm_neuron_tuning

    monkeypatch.setattr(norm_neuron_tuning, "BWD_PREFETCH", False)
    bn_neuron.clear_plans()
    try:
        _check("bn", _NEURONS[2], (11, 2, 12, 5, 3), device, seed=31, layout="channels_last")
        _check("bn", _NEURONS[3], (1, 2, 5, 4, 3), device, seed=32, make_x=lambda t: t.expand(3, 2, 5, 4, 3))
    finally:
        bn_neuron.clear_plans()


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
def test_running_statistics_and_eval(momentum, device):
    """Several training steps update running statistics like BatchNorm2d; eval mode uses them,
    with gradients through the frozen statistics."""
    neuron = _NEURONS[0]
    m = _module("bn", 5, neuron, momentum=momentum).to(device)
    ref = copy.deepcopy(m)
    for step in range(3):
        x, g_s = _inputs((2, 2, 5, 3, 3), 30 + step)
        x, g_s = x.to(device), g_s.to(device)
        _run(ref, "torch", x, g_s)
        _run(m, "triton", x, g_s)
    assert int(m.norm.num_batches_tracked) == int(ref.norm.num_batches_tracked) == 3
    for buf in ("running_mean", "running_var"):
        assert_close(getattr(m.norm, buf), getattr(ref.norm, buf), **RUNNING, what=buf)
    m.eval()
    ref.eval()
    x, g_s = _inputs((2, 2, 5, 3, 3), 40)
    x, g_s = x.to(device), g_s.to(device)
    s0, gx0, gp0 = _run(ref, "torch", x, g_s)
    s1, gx1, gp1 = _run(m, "triton", x, g_s)
    assert torch.equal(s1, s0)
    assert_close(gx1, gx0, **SUMMED, what="dx")
    for name in gp0:
        assert_close(gp1[name], gp0[name], **SUMMED, what=name)
    assert int(m.norm.num_batches_tracked) == 3
    for p in (*m.parameters(), *ref.parameters()):  # a frozen norm: dL/dx alone, in one backward pass
        p.requires_grad_(False)
    _, gx0, _ = _run(ref, "torch", x, g_s)
    _, gx1, gp1 = _run(m, "triton", x, g_s)
    assert not gp1
    assert_close(gx1, gx0, **SUMMED, what="dx of a frozen norm")
    with torch.no_grad():  # inference: no checkpoints, no backward state
        set_backend(m, "triton")
        assert torch.equal(m(x), s0)


@pytest.mark.parametrize("shape,steps,layout", [((3, 2, 5, 4, 3), None, "contiguous"),
                                                 ((2, 6, 3, 3), 3, "channels_last"),
                                                 ((11, 2, 8, 5, 5), None, "channels_last")])
def test_inference_counts_spikes_per_channel_as_it_fires(shape, steps, layout, device):
    """``bn_neuron(..., count=row)`` (the activity report in validation): the forward kernel adds each channel's
    spikes to ``row`` (over every step, sample and position, tiles' padding excluded) and fires the same spikes
    as without it; with gradients it refuses, naming what to do."""
    torch.manual_seed(70)
    x = torch.randn(shape, device=device) * 2
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x.transpose(2, -1).contiguous() \
            .transpose(2, -1)
    C = x.shape[-3]
    weight, bias = torch.rand(C, device=device) + 0.5, torch.randn(C, device=device) * 0.5
    mean, var = torch.randn(C, device=device) * 0.1, torch.rand(C, device=device) + 0.5
    kw = dict(training=False, momentum=0.1, eps=1e-5, T=steps, kind="lif", tau=2.0)
    row = torch.full((C,), 3.0, device=device)  # adds to what is there
    with torch.no_grad():
        counted = K.bn_neuron(x, weight, bias, mean, var, count=row, **kw)
        plain = K.bn_neuron(x, weight, bias, mean, var, **kw)
    assert torch.equal(counted, plain) and 0 < float(plain.mean()) < 1
    assert torch.equal(row, plain.sum(dim=(0, 1, 3, 4)) + 3)
    with pytest.raises(ValueError, match="count= counts spikes during inference"):
        K.bn_neuron(x, weight.requires_grad_(), bias, mean, var, count=row, **kw)
    with pytest.raises(ValueError, match="count must be a contiguous float32 tensor of the"):
        with torch.no_grad():
            K.bn_neuron(x, weight, bias, mean, var, count=row.double(), **kw)


@pytest.mark.parametrize("case", ["no_affine", "no_running_stats", "no_running_stats_eval"])
def test_batch_norm_variants(case, device):
    if case == "no_affine":
        _check("bn", _NEURONS[1], (2, 3, 4, 3, 3), device, affine=False, seed=50)
        _check("ln", _NEURONS[1], (2, 3, 4, 3, 3), device, affine=False, seed=51)
        return
    m = _module("bn", 4, _NEURONS[0], track_running_stats=False).to(device)
    if case == "no_running_stats_eval":
        m.eval()  # no running statistics: batch statistics also in eval mode
    ref = copy.deepcopy(m)
    x, g_s = _inputs((2, 3, 4, 3, 5), 52)
    x, g_s = x.to(device), g_s.to(device)
    s0, gx0, _ = _run(ref, "torch", x, g_s)
    s1, gx1, _ = _run(m, "triton", x, g_s)
    assert torch.equal(s1, s0)
    assert_close(gx1, gx0, **SUMMED, what="dx")


def test_deterministic(device):
    m = _module("bn", 6, _NEURONS[2]).to(device)
    x, g_s = _inputs((2, 2, 6, 3, 5), 60)
    x, g_s = x.to(device), g_s.to(device)
    a = _run(m, "triton", x, g_s)
    b = _run(m, "triton", x, g_s)
    assert torch.equal(a[1], b[1]) and all(torch.equal(a[2][n], b[2][n]) for n in a[2])


def test_state_dict_moves_between_backends(device):
    """Fused (triton) and unfused (torch) SEW-ResNets have the same state-dict keys and load each other's."""
    torch.manual_seed(0)
    kw = dict(depth=18, width=4, T=2, num_classes=3, neuron={"type": "PLIF", "detach_reset": True})
    fused = SEWResNet(backend="triton", **kw).to(device)
    ref = SEWResNet(backend="torch", **kw).to(device)
    assert list(fused.state_dict()) == list(ref.state_dict())
    assert "sn1.norm.running_mean" in fused.state_dict() and "layer1.0.sn2.neuron.w" in fused.state_dict()
    ref.load_state_dict(fused.state_dict())
    x = torch.randn(2, 3, 8, 8, device=device)
    out_f, out_r = fused(x), ref(x)  # training mode: batch statistics, running statistics updated
    assert_close(out_f, out_r, **SUMMED, what="logits")
    for k, v in ref.state_dict().items():
        assert_close(fused.state_dict()[k], v, what=k)
    fused.load_state_dict(ref.state_dict())


def test_errors(device):
    m = NormNeuron(nn.BatchNorm2d(4), build_neuron("LIF"), backend="triton").to(device)
    with pytest.raises(ValueError, match="input has 3 channels"):
        m(torch.randn(2, 2, 3, 4, 4, device=device))
    with pytest.raises(ValueError, match=r"expects \[T, B, C, H, W\]"):
        m(torch.randn(2, 4, 4, 4, device=device))
    with pytest.raises(ValueError, match="T=2 expects"):
        m(torch.randn(2, 2, 4, 4, 4, device=device), T=2)
    with pytest.raises(ValueError, match="T=0 expects .* T a positive int"):
        m(torch.randn(2, 4, 4, 4, device=device), T=0)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        m(torch.randn(1, 1, 4, 1, 1, device=device))
    with pytest.raises(TypeError, match="BatchNorm2d, SyncBatchNorm or LayerNorm2d"):
        NormNeuron(nn.GroupNorm(2, 4), build_neuron("LIF"))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        K.bn_neuron(torch.randn(2, 2, 4, 3, 3, device=device, dtype=torch.float64), None, None, None, None,
                    training=True, momentum=0.1, eps=1e-5, kind="lif")


def test_profiler_shows_ops_by_name(device):
    m = _module("bn", 3, _NEURONS[0]).to(device)
    set_backend(m, "triton")
    x = torch.randn(2, 2, 3, 4, 4, device=device, requires_grad=True)
    with torch.profiler.profile() as prof:
        m(x).sum().backward()
    names = {e.name for e in prof.events()}
    assert "snntrain::bn_neuron_fwd" in names and "snntrain::bn_neuron_bwd" in names, sorted(names)


def test_unfused_flag_runs_norm_then_neuron(device):
    m = _module("bn", 3, _NEURONS[0]).to(device)
    set_backend(m, "triton")
    m.fused = False
    x = torch.randn(2, 2, 3, 4, 4, device=device, requires_grad=True)
    with torch.profiler.profile() as prof:
        s = m(x)
        s.sum().backward()
    names = {e.name for e in prof.events()}
    assert "snntrain::bn_neuron_fwd" not in names, sorted(names)
    ref = copy.deepcopy(m)
    set_backend(ref, "torch")
    assert torch.equal(s, ref(x))


def test_sync_batchnorm_runs_unfused(device):
    from snntrain.distributed import convert_sync_batchnorm

    m = _module("bn", 3, _NEURONS[0]).to(device)
    ref = copy.deepcopy(m)
    synced = convert_sync_batchnorm(m)
    assert isinstance(synced.norm, nn.SyncBatchNorm)
    set_backend(synced, "triton")
    x = torch.randn(2, 2, 3, 4, 4, device=device)
    with torch.profiler.profile() as prof:
        s = synced(x)  # no process group: SyncBatchNorm computes this process's statistics
    assert "snntrain::bn_neuron_fwd" not in {e.name for e in prof.events()}
    assert torch.equal(s, ref(x))
    assert torch.equal(synced.norm.running_mean, ref.norm.running_mean)


@pytest.mark.parametrize("norm", ["bn", "ln"])
def test_torch_compile_fullgraph(norm, device):
    """Forward, backward and the running-statistics update trace without graph breaks."""
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    torch._dynamo.reset()
    m = _module(norm, 5, _NEURONS[2]).to(device)
    ref = copy.deepcopy(m)
    set_backend(m, "triton")
    set_backend(ref, "triton")
    compiled = torch.compile(lambda x, g: (m(x) * g).sum(), fullgraph=True, backend=backend)
    x, g_s = _inputs((3, 2, 5, 4, 3), 70)
    x, g_s = x.to(device), g_s.to(device)
    results = []
    for fn in ((lambda x, g: (ref(x) * g).sum()), compiled):
        xl = x.clone().requires_grad_()
        fn(xl, g_s).backward()
        results.append(xl.grad)
    assert_close(results[1], results[0], **SUMMED, what="dx")
    if norm == "bn":
        torch.testing.assert_close(m.norm.running_var, ref.norm.running_var)
        assert int(m.norm.num_batches_tracked) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["bn", "ln"])
def test_cuda_graph_capture(norm, device):
    """A training step can be captured: nothing synchronises with the host."""
    m = _module(norm, 16, dict(type="PLIF"), momentum=None).to(device)
    set_backend(m, "triton")
    x = torch.randn(4, 8, 16, 10, 10, device=device, requires_grad=True)

    def step():
        x.grad = None
        m.zero_grad(set_to_none=True)
        m(x).sum().backward()

    step()
    eager = x.grad.clone()
    graph, _ = capture_cuda_graph(step)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.grad, eager)
