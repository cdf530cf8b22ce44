"""Max pooling (snntrain.kernels.spike_pool, snntrain.nn.SpikeMaxPool2d) against torch.nn.functional.max_pool2d.

Every comparison is exact. The kernels pick PyTorch's window position (the first maximum in row-major
order; NaN wins) and sum each input's gradients in fp32 in ascending output order, rounding once: PyTorch's
CUDA kernels, and its CPU kernel in fp32. On a GPU the reference is F.max_pool2d itself in every dtype. On
the CPU, PyTorch adds fp16/bf16 gradients in their own dtype, so the reference there is F.max_pool2d on the
fp32 copy, rounded to the dtype; and Triton's interpreter rounds fp32 to bf16 toward zero (the GPU rounds to
nearest), which the CPU reference does too (:func:`_rounded`).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _testing import DEVICE, capture_cuda_graph, one_cpu_thread
from snntrain.kernels import spike_pool as K
from snntrain.nn import MultiStep, SpikeMaxPool2d, set_backend
from snntrain.nn import pool as pool_mod

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (shape [N, C, H, W], kernel_size, stride, padding, dilation, ceil_mode): the stem's 3x3/2 pad 1 at odd and
# even sizes, VGG's 2x2/2 rounding up, a dilated stride-1 window, a non-square window with ceil_mode, more
# channels than one tile holds (70 > 64), one channel
CONFIGS = [
    ((2, 5, 9, 11), 3, 2, 1, 1, False),
    ((2, 3, 8, 8), 3, 2, 1, 1, False),
    ((3, 4, 7, 5), 2, 2, 0, 1, True),
    ((1, 3, 8, 10), 3, 1, 1, 2, False),
    ((2, 70, 6, 5), (2, 3), (1, 2), (1, 1), 1, True),
    ((2, 1, 5, 6), 3, 2, 1, 1, True),
]


def _layout(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if fmt == "cl" else x.contiguous()


def _rounded(ref32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An fp32 result rounded to ``dtype`` as the kernels round it on this device."""
    if dtype == torch.bfloat16 and ref32.device.type == "cpu":  # the interpreter truncates fp32 -> bf16
        return (ref32.contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
    return ref32.to(dtype)


def _reference(x: torch.Tensor, grad: torch.Tensor, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """F.max_pool2d's output and input gradient, with the CUDA kernels' rounding (module docstring)."""
    k, s, p, d, ceil = args
    if x.device.type == "cuda" or x.dtype == torch.float32:
        leaf = x.detach().clone().requires_grad_()
        y = F.max_pool2d(leaf, k, s, p, d, ceil_mode=ceil)
        y.backward(grad)
        return y.detach(), leaf.grad
    leaf = x.detach().float().requires_grad_()
    y = F.max_pool2d(leaf, k, s, p, d, ceil_mode=ceil)
    y.backward(grad.float())
    return y.detach().to(x.dtype), _rounded(leaf.grad, x.dtype)


def _ours(x: torch.Tensor, grad: torch.Tensor, args: tuple, backend: str = "triton"):
    leaf = x.detach().clone().requires_grad_()
    y = SpikeMaxPool2d(*args[:4], ceil_mode=args[4], backend=backend)(leaf)
    y.backward(grad)
    return y.detach(), leaf.grad


def _spikes(shape, dtype, seed, p=0.4):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < p).to(dtype).to(DEVICE)


def _grad(shape, dtype, seed):
    """Gradients over a wide range of magnitudes, so that the order and precision of sums matter."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.exp(3 * torch.randn(shape, generator=g))).to(dtype).to(DEVICE)


def _check(x, args, seed=0):
    y_shape = F.max_pool2d(torch.empty(x.shape, device="meta"), *args[:4], ceil_mode=args[4]).shape
    grad = _grad(y_shape, x.dtype, seed + 100)
    y, gx = _ours(x, grad, args)
    y_ref, gx_ref = _reference(x, grad, args)
    assert torch.equal(y, y_ref), "forward differs from F.max_pool2d"
    assert torch.equal(gx, gx_ref), f"gradient differs from F.max_pool2d's in {int((gx != gx_ref).sum())} places"
    return y, gx, y_ref, gx_ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["nchw", "cl"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c[0])) + f"-k{c[1]}s{c[2]}p{c[3]}d{c[4]}"
                         + ("-ceil" if c[5] else ""))
def test_matches_pytorch_on_spikes(dtype, fmt, config):
    shape, *args = config
    x = _layout(_spikes(shape, dtype, seed=len(shape) + shape[-1]), fmt)
    y, gx, y_ref, _ = _check(x, tuple(args))
    # PyTorch's memory formats: channels-last in, channels-last out and gradient
    cl = fmt == "cl" and shape[1] > 1
    assert y.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
    assert gx.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)


@pytest.mark.parametrize("fill", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_everywhere(fill, dtype):
    """All zeros or all ones: every window is one tie, and the whole routing is PyTorch's choice."""
    x = torch.full((2, 3, 9, 10), fill, dtype=dtype, device=DEVICE)
    for args in ((3, 2, 1, 1, False), (2, 2, 0, 1, True), (3, 1, 1, 1, False)):
        _check(_layout(x, "cl"), args)


def test_tie_rule_is_the_first_position_in_the_window():
    """The rule itself, written out: 3x3 windows, stride 2, padding 1 over a 5x5 map of ones. Each output's
    gradient goes to its window's first position inside the map (row-major); PyTorch does the same."""
    x = torch.ones(1, 1, 5, 5, device=DEVICE)
    grad = torch.arange(1.0, 10.0, device=DEVICE).view(1, 1, 3, 3)
    _, gx = _ours(x, grad, (3, 2, 1, 1, False))
    expected = torch.zeros(5, 5)
    for (oh, ow), g in zip(((0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)), range(1, 10)):
        expected[max(2 * oh - 1, 0), max(2 * ow - 1, 0)] = g
    assert torch.equal(gx.cpu().view(5, 5), expected)
    _check(x, (3, 2, 1, 1, False))


def test_any_values_nan_and_infinity():
    """Not only spikes: repeated small integers (ties between non-zero values), -inf, +inf and NaN, whose
    window routes to it (the last NaN of a window, as PyTorch's kernels)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-2, 3, (2, 4, 9, 8), generator=g).float()
    x[0, 0, 0, :3] = float("-inf")
    x[0, 1, 2, 2] = float("inf")
    x[1, 2, 3, 3] = float("nan")
    x[1, 2, 3, 4] = float("nan")
    x = _layout(x.to(DEVICE), "cl")
    grad = _grad((2, 4, 5, 4), torch.float32, 6)
    y, gx = _ours(x, grad, (3, 2, 1, 1, False))
    y_ref, gx_ref = _reference(x, grad, (3, 2, 1, 1, False))
    assert torch.equal(y.isnan(), y_ref.isnan()) and torch.equal(y.nan_to_num(), y_ref.nan_to_num())
    assert torch.equal(gx, gx_ref)


def test_expanded_gradient_and_3d_input():
    """The gradient of ``y.sum()`` (an expanded, stride-0 tensor) and a ``[C, H, W]`` map."""
    x = _layout(_spikes((2, 3, 9, 9), torch.float32, 7), "cl")
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    SpikeMaxPool2d(3, 2, 1, backend="triton")(a).sum().backward()
    F.max_pool2d(b, 3, 2, 1).sum().backward()
    assert torch.equal(a.grad, b.grad)
    x3 = x[0].contiguous()
    assert torch.equal(SpikeMaxPool2d(3, 2, 1, backend="triton")(x3), F.max_pool2d(x3, 3, 2, 1))


def test_64_bit_offsets(monkeypatch):
    """The kernels' 64-bit addressing (``WIDE``, for tensors past 2**31 elements) on a small map."""
    monkeypatch.setattr(K, "_wide", lambda *tensors: True)
    _check(_layout(_spikes((2, 5, 9, 11), torch.float32, 8), "cl"), (3, 2, 1, 1, False))


def test_saves_one_byte_per_output_for_the_backward():
    """What the forward keeps for the backward: the uint8 window positions, one per output element, and not the
    input (PyTorch keeps the input and an int64 index per output); nothing without a gradient."""
    x = _layout(_spikes((2, 8, 9, 9), torch.bfloat16, 9), "cl").requires_grad_()
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = SpikeMaxPool2d(3, 2, 1, backend="triton")(x)
    assert [(t.dtype, tuple(t.shape)) for t in saved] == [(torch.uint8, tuple(y.shape))]
    params = K.pool_params(3, 2, 1, 1, False)
    _, pos = K._fwd_host(x.detach(), params, save_pos=False)
    assert pos.numel() == 0
    with torch.no_grad():
        assert not SpikeMaxPool2d(3, 2, 1, backend="triton")(x).requires_grad


def test_fallback_warns_once_and_matches_pytorch(monkeypatch):
    monkeypatch.setattr(pool_mod._fallback, "seen", set())
    x = _spikes((1, 2, 10, 10), torch.float32, 10)
    pool = SpikeMaxPool2d(9, stride=1, padding=4, backend="triton")  # 81 elements > MAX_WINDOW
    with pytest.warns(UserWarning, match=r"kernel_size=\(9, 9\) \(81 elements"):
        y = pool(x)
    assert torch.equal(y, F.max_pool2d(x, 9, 1, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool(x)  # once per process


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"padding=\(2, 2\) is not valid for kernel_size=\(3, 3\)"):
        SpikeMaxPool2d(3, stride=2, padding=2)
    with pytest.raises(ValueError, match=r"stride=\(0, 0\) is not valid"):
        SpikeMaxPool2d(3, stride=0)
    with pytest.raises(ValueError, match="kernel_size='3' is not valid"):
        SpikeMaxPool2d("3")
    with pytest.raises(ValueError, match="backend"):
        SpikeMaxPool2d(3, backend="cuda")
    with pytest.raises(ValueError, match="gives a 0x0 output"):
        SpikeMaxPool2d(3, backend="triton")(torch.zeros(1, 1, 2, 2, device=DEVICE))


def test_module_is_a_maxpool2d_with_a_backend():
    pool = SpikeMaxPool2d(3, 2, 1, backend="torch")
    assert isinstance(pool, nn.MaxPool2d) and pool.stride == 2 and not pool.state_dict()
    assert "backend=torch" in repr(pool)
    x = _spikes((2, 3, 9, 9), torch.float32, 11)
    assert torch.equal(pool(x), F.max_pool2d(x, 3, 2, 1))
    set_backend(MultiStep(pool), "triton")
    assert pool.backend == "triton"


def test_visible_in_profiler():
    from torch.profiler import ProfilerActivity, profile

    x = _layout(_spikes((2, 3, 9, 9), torch.float32, 12), "cl").requires_grad_()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE.type == "cuda" else [])
    with profile(activities=acts) as prof:
        SpikeMaxPool2d(3, 2, 1, backend="triton")(x).sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert {"snntrain::max_pool_fwd", "snntrain::max_pool_bwd"} <= names, sorted(names)


@pytest.mark.slow  # a compile
def test_torch_compile_fullgraph():
    """The registered operators under ``torch.compile(fullgraph=True)``: the values and gradients of eager."""
    import torch._dynamo

    torch._dynamo.reset()
    pool = MultiStep(SpikeMaxPool2d(3, 2, 1, backend="triton"))
    x = _spikes((2, 2, 3, 9, 9), torch.float32, 13)

    def step(x):
        return (pool(x) * torch.arange(1.0, 6.0, device=x.device)).sum()

    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    compiled(a).backward()
    step(b).backward()
    assert torch.equal(a.grad, b.grad)


@pytest.mark.slow  # an export
def test_torch_export_calls_the_operator():
    """An exported program of the pool calls ``snntrain::max_pool_fwd`` and gives the module's output."""
    pool = MultiStep(SpikeMaxPool2d(3, 2, 1, backend="triton"))
    x = _spikes((2, 2, 3, 9, 9), torch.float32, 17)
    program = torch.export.export(pool, (x,))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "snntrain.max_pool_fwd.default" in targets, targets
    assert torch.equal(program.module()(x), pool(x))


@pytest.mark.gpu
def test_cuda_graph_and_stem_shape_on_the_gpu():
    """The SEW-ResNet stem's pooling at batch 8 (bf16, channels-last) equals F.max_pool2d bit for bit, and a
    forward plus backward is captured in a CUDA graph (no host synchronisation) and replays on new spikes."""
    if DEVICE.type != "cuda":
        pytest.skip("needs a CUDA GPU")
    x = _layout(_spikes((8, 64, 112, 112), torch.bfloat16, 14), "cl")
    _check(x, (3, 2, 1, 1, False))
    leaf = x.clone().requires_grad_()
    grad = _grad((8, 64, 56, 56), torch.bfloat16, 15)
    pool = SpikeMaxPool2d(3, 2, 1, backend="triton")

    def step():
        leaf.grad = None
        y = pool(leaf)
        y.backward(grad)
        return y

    graph, y = capture_cuda_graph(step)
    new = _layout(_spikes((8, 64, 112, 112), torch.bfloat16, 16), "cl")
    with torch.no_grad():
        leaf.copy_(new)
    graph.replay()
    y_ref, gx_ref = _reference(new, grad, (3, 2, 1, 1, False))
    assert torch.equal(y, y_ref) and torch.equal(leaf.grad, gx_ref)


# ------------------------------------------------------------------------------------------------------------
# the models pool their spikes with it: the same spikes and gradients as with PyTorch's pooling
# ------------------------------------------------------------------------------------------------------------


#: The transformers' stems at test size: Spikformer pools its last two stages' spikes, the Spike-driven
#: Transformer its third stage's spikes (and PyTorch pools its fourth, a norm's output).
TRANSFORMERS = {
    "spikformer": dict(name="spikformer", variant="spikformer_cifar10", embed_dim=16, depth=1, heads=2, patch_size=4),
    "spike_driven_transformer": dict(name="spike_driven_transformer", variant="sdt_2_512", embed_dim=16, depth=1,
                                     pooling="0011"),
}


def _model(family: str):
    from snntrain.models import build_model
    from snntrain.models.sew_resnet import SEWResNet
    from snntrain.models.spiking_resnet import SpikingResNet
    from snntrain.models.spiking_vgg import SpikingVGG

    torch.manual_seed(0)
    if family in TRANSFORMERS:
        return build_model({**TRANSFORMERS[family], "num_classes": 3, "in_channels": 3, "T": 2}, backend="torch")
    if family == "sew_resnet":
        return SEWResNet(depth=18, num_classes=3, T=2, stem="imagenet", width=4, backend="torch")
    if family == "spiking_resnet":
        return SpikingResNet(num_classes=3, T=2, stem="imagenet", width=4, backend="torch")
    return SpikingVGG("spiking_vgg11_bn", num_classes=3, T=2, width=4, classifier="linear", backend="torch")


@pytest.mark.parametrize("family", ["sew_resnet", "spiking_resnet", "spiking_vgg", *TRANSFORMERS])
def test_models_pool_spikes_with_it(family, monkeypatch):
    """The models' max-pools of spikes are SpikeMaxPool2d following the model's backend; with the Triton kernels
    in them (the rest on PyTorch, fp32, channels-last) logits and every gradient equal PyTorch's pooling bit for
    bit. (cuDNN's deterministic algorithms on a GPU, one thread on the CPU: the two runs differ only in the
    pools.)"""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    model = _model(family).to(DEVICE).to(memory_format=torch.channels_last)
    pools = [m for m in model.modules() if isinstance(m, SpikeMaxPool2d)]
    expected = {"spikformer": 2, "spike_driven_transformer": 1, "spiking_vgg": 5}.get(family, 1)
    assert len(pools) == expected and all(m.backend == "torch" for m in pools)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    results = []
    for backend in ("torch", "triton"):
        for m in pools:
            m.backend = backend
        model.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_()
        with one_cpu_thread():
            logits = model(leaf)
            (logits * torch.arange(1.0, 4.0, device=DEVICE)).sum().backward()
        results.append((logits.detach(), leaf.grad, [p.grad.clone() for p in model.parameters()]))
    (l0, g0, p0), (l1, g1, p1) = results
    assert torch.equal(l0, l1) and torch.equal(g0, g1)
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))


def test_model_backend_reaches_the_pool():
    from snntrain.models.sew_resnet import SEWResNet

    model = SEWResNet(depth=18, num_classes=3, stem="imagenet", width=4, backend="triton")
    assert model.pool[0].backend == "triton"
    assert isinstance(SEWResNet(depth=18, num_classes=3, stem="cifar", width=4).pool, nn.Identity)
