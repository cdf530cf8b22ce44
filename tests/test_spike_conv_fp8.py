"""FP8 convolutions of spikes: the weight-rounding and convolution kernels (:mod:`snntrain.kernels.spike_conv`)
against their PyTorch reference, :class:`SpikeConv2d`'s ``fp8`` forward (its values, its backward, its fallbacks)
and the models' ``spike_fp8`` option."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from _testing import DEVICE
from snntrain.kernels import spike_conv as K
from snntrain.models import SEWResNet, build_model
from snntrain.nn import LIF, SpikeConv2d, set_spike_fp8
from snntrain.nn import layers as L


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """Each test sees the once-per-reason fallback warnings afresh."""
    L._fp8_fallback.seen.clear()
    yield
    L._fp8_fallback.seen.clear()


def spikes(shape, high=2, channels_last=True, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, high, shape, generator=g).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x.to(DEVICE)


def test_rounding_the_weight_gives_e4m3_values_per_output_channel_as_pytorch_does():
    g = torch.Generator().manual_seed(1)
    # channels of very different magnitudes, a zero channel, e4m3's subnormals, ties and values that round up
    # into the next binade (126.8 -> 128 at a scale of 1)
    w = torch.randn(6, 32, 3, 3, generator=g) * torch.tensor([1.0, 1e-3, 50.0, 0.0, 1.0, 1.0]).view(6, 1, 1, 1)
    w[4] = 0.0
    w[4, :6, 0, 0] = torch.tensor([448.0, 126.8, -124.0, 1e-3, -2 ** -10, 2 ** -9 * 1.5])
    w[5, :4, 0, 0] = torch.tensor([448.0, 3.0 * 2 ** -10, 2 ** -10, 2.25])  # ties: to even
    w = w.to(DEVICE)
    q, scale = K.quantize_weight(w)
    qr, sr = K.quantize_weight_reference(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (6, 32 * 9) and scale.shape == (6,)
    assert torch.equal(scale, sr) and torch.equal(q.float(), qr.float())
    # the largest magnitude times float32(1 / 448): the same bits on every device
    assert torch.equal(scale.cpu()[[0, 2]], (w.cpu().flatten(1).abs().amax(1) * (1 / K.E4M3_MAX))[[0, 2]])
    assert scale[3].item() > 0 and not q[3].float().any()  # a zero channel stays zero
    assert q[4, :6].float().tolist() == [448.0, 128.0, -128.0, 2 ** -9, -0.0, 2 ** -9 * 2]
    assert q[5, :4].float().tolist() == [448.0, 2 ** -9 * 2, 0.0, 2.25]
    # (kh, kw, ci) order: element (co, ci, kh, kw) sits at (kh * KW + kw) * Cin + ci
    w2 = torch.arange(2 * 32 * 2 * 3, dtype=torch.float32).view(2, 32, 2, 3).to(DEVICE)
    q2, s2 = K.quantize_weight(w2)
    back = K.dequantize(q2, s2, (2, 3))
    assert back.shape == w2.shape
    assert ((back - w2).abs() <= w2.abs() * 2 ** -4 + 1e-6).all()
    # any strides of the weight (a channels-last parameter)
    wcl = w.contiguous(memory_format=torch.channels_last)
    assert torch.equal(K.quantize_weight(wcl)[0].float(), q.float())


@pytest.mark.parametrize("cin,cout,k,stride,padding,dilation,hw,bias", [
    (32, 16, 3, 1, 1, 1, (6, 5), False),
    (64, 40, 3, 2, 1, 1, (7, 7), True),
    (32, 24, 1, 2, 0, 1, (7, 6), False),
    (32, 8, 3, 1, 2, 2, (6, 6), True),
    (96, 136, 3, 1, 1, 1, (3, 4), False),  # output channels over one tile, three reduction steps a position
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_convolution_kernel_equals_the_reference(cin, cout, k, stride, padding, dilation, hw, bias, dtype):
    x = spikes((2, cin, *hw), high=4, dtype=dtype)  # sums of up to three spike maps, exact in e4m3
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(cout, cin, k, k, generator=g) * 0.1).to(DEVICE)
    b = torch.randn(cout, generator=g).to(DEVICE) if bias else None
    q, s = K.quantize_weight(w)
    args = ((k, k), (stride, stride), (padding, padding), (dilation, dilation), dtype)
    y = K.conv2d(x, q, s, b, *args)
    ref = K.conv2d_reference(x, q, s, b, *args)
    assert y.shape == ref.shape and y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last)
    # the same products summed in another order, in float32 (on the GPU the FP8 tensor cores keep about 14 bits of
    # the sum's mantissa: 1e-3 of the output's range, where the weight's rounding is 2**-4), then rounded to the
    # output dtype
    scale = ref.float().abs().max().item()
    tol = dict(rtol=1e-3, atol=1e-3 * scale) if dtype == torch.float32 else dict(rtol=8e-3, atol=1e-2 * scale)
    torch.testing.assert_close(y.float(), ref.float(), **tol)
    # the reference is the convolution with the rounded weight (up to float32's rounding of the scaling)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        full = F.conv2d(x.float(), K.dequantize(q, s, (k, k)), b, stride, padding, dilation)
    torch.testing.assert_close(ref.float(), full.to(dtype).float(), **tol)
    # a row-major input is read as well (the kernel reads a channels-last copy), and one cast to e4m3 first (a
    # kernel with its A operand in shared memory, not registers: on the GPU the tensor cores may add the products in
    # another order, in their own precision)
    torch.testing.assert_close(K.conv2d(x.contiguous(), q, s, b, *args).float(), y.float(), rtol=0, atol=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(K.tuning, "PRECAST", not K.tuning.PRECAST)
        torch.testing.assert_close(K.conv2d(x.contiguous(), q, s, b, *args).float(), y.float(), **tol)


def test_the_kernels_refuse_what_they_do_not_take():
    w = torch.randn(8, 32, 3, 3, device=DEVICE)
    q, s = K.quantize_weight(w)
    with pytest.raises(ValueError, match=r"FP8 weight of shape \(8, 288\) does not fit 64 input channels"):
        K.conv2d(spikes((1, 64, 4, 4)), q, s, None, (3, 3), (1, 1), (1, 1), (1, 1), torch.float32)
    with pytest.raises(ValueError, match="weight of shape \\(8, 32\\): a 2-D convolution's weight is"):
        K.quantize_weight(torch.randn(8, 32, device=DEVICE))
    assert K.unsupported((8, 48, 3, 3), 1, (1, 1)) == "48 input channels (a multiple of 32 only)"
    assert K.unsupported((8, 32, 3, 3), 2, (1, 1)) == "groups=2 (only 1)"
    assert K.unsupported((8, 32, 3, 3), 1, (1, 1)) is None


def test_the_device_check_names_what_lacks_fp8(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    K._cuda_fp8_reason.cache_clear()
    try:
        reason = K.fp8_device_reason(torch.device("cuda", 0))
        assert reason == ("NVIDIA A100 (compute capability 8.0) has no FP8 tensor cores; they need 8.9 or newer "
                          "(Ada, Hopper, Blackwell)")
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        K._cuda_fp8_reason.cache_clear()
        assert K.fp8_device_reason(torch.device("cuda", 0)) is None
    finally:
        K._cuda_fp8_reason.cache_clear()
    monkeypatch.setattr(K, "INTERPRET", False)
    assert "need a CUDA GPU" in K.fp8_device_reason(torch.device("cpu"))


def _conv(fp8, backend, cin=32, cout=16, k=3, stride=1, groups=1, input_max=1, bias=True):
    torch.manual_seed(0)
    return SpikeConv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups, bias=bias, input_max=input_max,
                       backend=backend, fp8=fp8).to(DEVICE)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("autocast", [False, True])
def test_the_fp8_forward_rounds_only_the_weight_and_the_backward_is_conv2d_s(backend, autocast):
    """Output: the convolution with the rounded weight (in autocast's dtype under autocast); gradients of the input,
    weight and bias: Conv2d's backward with the weight itself, bit for bit (the same upstream gradient)."""
    fp8, plain = _conv(True, backend), _conv(False, backend)
    x = spikes((2, 32, 6, 6), seed=3)
    grads = []
    for conv in (fp8, plain):
        leaf = x.clone().requires_grad_()
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
            y = conv(leaf)
        assert y.dtype == (torch.bfloat16 if autocast else torch.float32)
        g = torch.Generator().manual_seed(5)
        y.backward(torch.randn(y.shape, generator=g).to(DEVICE, y.dtype))
        grads.append((y.detach(), leaf.grad, conv.weight.grad, conv.bias.grad))
    (y8, gx8, gw8, gb8), (y, gx, gw, gb) = grads
    q, s = K.quantize_weight_reference(fp8.weight)
    dtype = torch.bfloat16 if autocast else torch.float32
    expect = K.conv2d_reference(x, q, s, fp8.bias, (3, 3), (1, 1), (1, 1), (1, 1), dtype)
    scale = expect.float().abs().max().item()  # tolerances as in the kernel's test
    tol = dict(rtol=1e-3, atol=1e-3 * scale) if not autocast else dict(rtol=8e-3, atol=1e-2 * scale)
    torch.testing.assert_close(y8.float(), expect.float(), **tol)
    assert not torch.equal(y8, y)  # the rounding changed the values...
    torch.testing.assert_close(y8.float(), y.float(), rtol=0.07, atol=0.07)  # ...by at most the weight's rounding
    for a, b in ((gx8, gx), (gw8, gw), (gb8, gb)):
        assert torch.equal(a, b)


def test_evaluation_and_no_grad_calls_stay_conv2d_s():
    fp8, plain = _conv(True, "triton"), _conv(False, "triton")
    x = spikes((1, 32, 5, 5))
    with torch.no_grad():
        assert torch.equal(fp8(x), plain(x))
    fp8.eval(), plain.eval()
    assert torch.equal(fp8(x), plain(x))


@pytest.mark.parametrize("case,reason", [
    (dict(input_max=17), "input_max=17 is above 16, the largest integer up to which FP8 (e4m3) holds every value"),
    (dict(cin=48), "48 input channels (a multiple of 32 only)"),
    (dict(groups=2), "groups=2 (only 1)"),
])
def test_what_the_kernel_cannot_do_falls_back_to_conv2d_with_one_warning(case, reason):
    fp8, plain = _conv(True, "triton", **case), _conv(False, "triton", **case)
    x = spikes((1, case.get("cin", 32), 5, 5), high=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fp8(x.clone().requires_grad_())
        fp8(x.clone().requires_grad_())
    messages = [str(w.message) for w in caught]
    assert messages == [f"SpikeConv2d(fp8=True): {reason}; this convolution's forward runs in its own dtype instead"]
    assert torch.equal(y, plain(x.clone().requires_grad_()))


def test_a_device_without_fp8_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(K, "fp8_device_reason", lambda device: "NVIDIA T4 (compute capability 7.5) has no FP8")
    fp8, plain = _conv(True, "triton"), _conv(False, "triton")
    x = spikes((1, 32, 5, 5))
    with pytest.warns(UserWarning, match=r"SpikeConv2d\(fp8=True\): NVIDIA T4 \(compute capability 7.5\) has no"):
        y = fp8(x.clone().requires_grad_())
    assert torch.equal(y, plain(x.clone().requires_grad_()))


def test_the_option_is_checked_shown_and_switched():
    with pytest.raises(ValueError, match="fp8='yes' must be true or false"):
        SpikeConv2d(32, 8, 3, fp8="yes")
    conv = SpikeConv2d(32, 8, 3, input_max=1, fp8=True)
    assert repr(conv).endswith("input_max=1, kept in 1 bit, forward in fp8)")
    model = SEWResNet(depth=18, width=32, num_classes=3, in_channels=2, T=2, backend="torch", spike_bytes=True)
    assert set_spike_fp8(model) == 19 and all(m.fp8 for m in model.modules() if isinstance(m, SpikeConv2d))
    assert set_spike_fp8(model, False) == 19 and not any(getattr(m, "fp8", False) for m in model.modules())
    with pytest.raises(ValueError, match="on=1 must be true or false"):
        set_spike_fp8(model, 1)


def test_the_model_option_builds_spike_convolutions_in_fp8(monkeypatch):
    cfg = {"name": "sew_resnet", "depth": 18, "width": 32, "T": 2, "num_classes": 3, "in_channels": 2}
    on = build_model({**cfg, "spike_fp8": True}, backend="torch")  # spike_bytes (off here) is implied
    convs = [m for m in on.modules() if isinstance(m, SpikeConv2d)]
    assert len(convs) == 19 and all(m.fp8 for m in convs)
    assert not any(isinstance(m, SpikeConv2d) for m in build_model(cfg, backend="torch").modules())
    with pytest.raises(ValueError, match="spike_fp8='yes' must be true or false"):
        build_model({**cfg, "spike_fp8": "yes"}, backend="torch")
    monkeypatch.setattr(LIF, "spike_max", None)  # a neuron that does not declare the integers it fires
    with pytest.raises(ValueError, match="spike_fp8=true: model=sew_resnet with these neuron settings has no "
                                         "convolution whose input is known to be spikes"):
        build_model({**cfg, "spike_fp8": True}, backend="torch")


def test_a_sew_block_trains_with_the_fp8_forward_on_both_backends():
    """One step of a SEW block with a downsampling shortcut (three convolutions of spikes) built with
    ``spike_fp8``'s convolutions: the Triton kernels and the PyTorch reference give the same output and gradients
    (the same rounded weights, float32 sums in another order)."""
    from snntrain.models.common import LayerFactory
    from snntrain.models.sew_resnet import BasicBlock

    x = spikes((2 * 2, 32, 6, 6), seed=7, channels_last=False).unflatten(0, (2, 2))
    results = []
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        f = LayerFactory({"type": "LIF"}, backend=backend, T=2, spike_bytes=True)
        block = BasicBlock(f, 32, 64, 2, "ADD", input_max=1).to(DEVICE)
        assert set_spike_fp8(block) == 3
        leaf = x.clone().requires_grad_()
        out = block(leaf)
        (out * torch.linspace(-1, 1, out.shape[2], device=DEVICE).view(1, 1, -1, 1, 1)).sum().backward()
        results.append((out.detach(), leaf.grad, [p.grad for p in block.parameters()]))
    (o0, x0, g0), (o1, x1, g1) = results
    assert o0.sum() > 0 and torch.equal(o1, o0)  # the same spikes
    for a, b in zip([x1, *g1], [x0, *g0]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3 * b.abs().max().item())


@pytest.mark.gpu
def test_the_fp8_step_compiles_and_captures_in_a_cuda_graph():
    """SEW-ResNet-18 with ``spike_fp8`` on the GPU, bf16 autocast, channels-last: eager, compiled (the registered
    operators) and replayed from a CUDA graph give the same loss."""
    from snntrain.tasks.speed import to_channels_last

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if K.fp8_device_reason(torch.device("cuda")) is not None:
        pytest.skip(K.fp8_device_reason(torch.device("cuda")))
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 3, 64, 64, generator=g).cuda().contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 5, (4,), generator=g).cuda()
    torch.manual_seed(0)
    model = to_channels_last(build_model({"name": "sew_resnet", "depth": 18, "num_classes": 5, "T": 2, "width": 32,
                                          "stem": "imagenet", "spike_fp8": True}, backend="triton").cuda())

    def loss_of(m):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.cross_entropy(m(x), y)

    state = {k: v.clone() for k, v in model.state_dict().items()}
    eager = loss_of(model).detach()
    model.load_state_dict(state)
    compiled = loss_of(torch.compile(model)).detach()
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=2e-2)
    model.load_state_dict(state)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss_of(model).backward()
    torch.cuda.current_stream().wait_stream(s)
    model.load_state_dict(state)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = loss_of(model)
        loss.backward()
    graph.replay()
    torch.testing.assert_close(loss.detach(), eager, rtol=0, atol=0)
