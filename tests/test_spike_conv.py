"""SpikeConv2d (a convolution of spikes that keeps its input for the backward packed in bits) against nn.Conv2d, the
packing kernels against their PyTorch reference, and the model families' ``spike_bytes`` option: which convolutions get it, what one SEW block saves, a whole SEW-ResNet step
with the option on and off, compiled, the state dict and the config key."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _testing import DEVICE
from snntrain.models import SEWResNet, build_model
from snntrain.models.common import LayerFactory
from snntrain.models.sew_resnet import BasicBlock
from snntrain.nn import StepNeuron
from snntrain.nn.layers import SpikeConv2d, make_conv2d, sew_connect_max
from snntrain.nn.neurons import build_neuron, spike_max

#: (kernel, stride, padding, groups, bias, padding_mode)
CONVS = [(3, 1, 1, 1, False, "zeros"), (3, 2, 1, 1, True, "zeros"), (1, 2, 0, 2, True, "zeros"),
         (5, 1, 2, 4, True, "zeros"), (3, 1, "same", 1, False, "zeros"), (4, 1, "same", 1, True, "zeros")]


@pytest.fixture(autouse=True)
def _deterministic_cudnn():
    """On CUDA, two convolutions of the same shapes compute alike only with deterministic cuDNN algorithms."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        yield


def saved_during(fn):
    """``fn()``'s result and the tensors autograd saved for the backward while it ran."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fn()
    return out, saved


def step(conv: nn.Conv2d, x: torch.Tensor, grad: torch.Tensor, autocast: bool = False):
    """Output, input, weight and bias gradients of ``conv`` on ``x``, and what the forward saved."""
    conv.zero_grad(set_to_none=True)
    leaf = x.clone().requires_grad_()
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        y, saved = saved_during(lambda: conv(leaf))
    y.backward(grad.to(y.dtype))
    return (y, leaf.grad, conv.weight.grad, None if conv.bias is None else conv.bias.grad), saved


def pair(k, stride, padding, groups, bias, padding_mode, dtype=torch.float32, channels_last=False, **kw):
    torch.manual_seed(0)
    ours = SpikeConv2d(8, 12, k, stride=stride, padding=padding, groups=groups, bias=bias,
                       padding_mode=padding_mode, **kw).to(dtype)
    ref = nn.Conv2d(8, 12, k, stride=stride, padding=padding, groups=groups, bias=bias,
                    padding_mode=padding_mode).to(dtype)
    ref.load_state_dict(ours.state_dict())
    if channels_last:
        ours.to(memory_format=torch.channels_last)
        ref.to(memory_format=torch.channels_last)
    return ours, ref


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("conv", CONVS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("dtype, autocast", [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)],
                         ids=["fp32", "bf16", "fp32-autocast"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("input_max, bits", [(1, 1), (3, 2), (9, 4), (255, 8)],
                         ids=["spikes", "counts3", "counts9", "counts255"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gradients_equal_conv2d_and_the_input_is_kept_packed(conv, dtype, autocast, channels_last, input_max, bits,
                                                             backend):
    dev = DEVICE if backend == "triton" else torch.device("cpu")  # the kernels: CUDA, or the interpreter
    ours, ref = pair(*conv, dtype=dtype, channels_last=channels_last, input_max=input_max, backend=backend)
    ours, ref = ours.to(dev), ref.to(dev)
    assert ours.bits == bits
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, input_max + 1, (3, 8, 9, 9), generator=g).to(dtype)
    if input_max == 255:
        x[0, 0, 0, 0] = 255  # the largest value a byte holds
    x = x.to(dev)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    grad = torch.randn(ref(x).shape, generator=g).to(dev)
    if channels_last:
        grad = grad.contiguous(memory_format=torch.channels_last)
    got, saved = step(ours, x, grad, autocast)
    want, _ = step(ref, x, grad, autocast)
    for a, b, name in zip(got, want, ("output", "input grad", "weight grad", "bias grad")):
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and torch.equal(a, b), name  # bit for bit
    kept = [t for t in saved if t.dtype == torch.uint8]  # the input (padded for an even kernel's same), packed
    assert len(kept) == 1 and kept[0].dim() == 1
    side = x.shape[2] + (conv[0] - 1 if conv[2] == "same" and conv[0] % 2 == 0 else 0)  # padded for an even "same"
    padded = x.shape[0] * x.shape[1] * side ** 2
    assert kept[0].numel() == -(-padded * bits // 8)
    assert all(t.dtype != dtype or t.dim() < 4 or t.shape[0] != 3 for t in saved)  # the input itself is not kept
    if autocast:
        assert all(t.dtype != torch.bfloat16 for t in saved)  # not autocast's 16-bit copy of the weight either


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("layout", ["rows", "channels_last", "strided", "odd"])
def test_packing_kernel_equals_the_reference_and_unpacks_exactly(bits, layout):
    """The Triton pack (interpreter here) writes the reference's bytes, in the tensor's memory order; both unpack
    to the values, shape and strides they packed; a strided view is packed as its row-major copy."""
    from snntrain.kernels import spike_pack

    g = torch.Generator().manual_seed(bits)
    shape = (1001,) if layout == "odd" else (3, 5, 7, 9)
    x = torch.randint(0, 1 << bits, shape, generator=g).to(torch.bfloat16).to(DEVICE)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":
        x = x[:, 1:4]
    p = spike_pack.pack(x, bits)
    assert torch.equal(p, spike_pack.pack_reference(x, bits))
    assert p.numel() == -(-x.numel() * bits // 8)
    d = spike_pack.dense(x)
    first = d.as_strided((8 // bits,), (1,))  # the first byte holds the first elements of memory order
    assert int(p[0]) == sum(int(v) << (i * bits) for i, v in enumerate(first.tolist()))
    for fn in (spike_pack.unpack, spike_pack.unpack_reference):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            y = fn(p, bits, d.shape, d.stride(), dtype)
            assert y.dtype == dtype and torch.equal(y, x.to(dtype)) and y.stride() == d.stride()
    with pytest.raises(ValueError, match="bits=3 is not a packed width"):
        spike_pack.pack(x, 3)
    with pytest.raises(ValueError, match="packed bytes do not hold"):
        spike_pack.unpack(p[1:], bits, d.shape, d.stride(), torch.float32)


def test_input_max_picks_the_width_and_bad_values_are_named():
    assert [SpikeConv2d(2, 3, 3, input_max=m).bits for m in (1, 2, 3, 4, 15, 16, 255)] == [1, 2, 2, 4, 4, 8, 8]
    assert "input_max=3, kept in 2 bits" in repr(SpikeConv2d(2, 3, 3, input_max=3))
    for bad in (0, 256, 1.0, True):
        with pytest.raises(ValueError, match=f"value_max={bad!r} must be an int from 1 to 255"):
            SpikeConv2d(2, 3, 3, input_max=bad)
    with pytest.raises(ValueError, match="backend"):
        SpikeConv2d(2, 3, 3, backend="cuda")


def test_evaluation_and_no_grad_run_conv2d():
    ours, ref = pair(3, 1, 1, 1, True, "zeros")
    x = torch.randint(0, 2, (2, 8, 6, 6)).float()
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x))
    ours.eval()
    leaf = x.clone().requires_grad_()
    y, saved = saved_during(lambda: ours(leaf))
    assert torch.equal(y, ref(x)) and not any(t.dtype == torch.uint8 for t in saved)  # Conv2d.forward's own autograd


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_convolutions_of_one_tensor_share_its_packed_copy_and_an_in_place_change_makes_a_new_one(backend):
    torch.manual_seed(0)
    dev = DEVICE if backend == "triton" else torch.device("cpu")
    a = SpikeConv2d(4, 6, 3, padding=1, input_max=3, backend=backend).to(dev)
    b = SpikeConv2d(4, 5, 1, stride=2, input_max=3, backend=backend).to(dev)
    ref_a, ref_b = nn.Conv2d(4, 6, 3, padding=1).to(dev), nn.Conv2d(4, 5, 1, stride=2).to(dev)
    ref_a.load_state_dict(a.state_dict())
    ref_b.load_state_dict(b.state_dict())
    x = torch.randint(0, 3, (2, 3, 4, 6, 6)).float().to(dev).requires_grad_()

    def both(bump):
        s = x * 1.0  # not a leaf: it can change in place
        y1 = a(s.flatten(0, 1))  # two views of one tensor, as MultiStep hands a block's convolutions
        if bump:
            s.add_(1.0)
        return y1, b(s.flatten(0, 1))

    for bump, copies in ((False, 1), (True, 2)):
        a.zero_grad(), b.zero_grad(), ref_a.zero_grad(), ref_b.zero_grad()
        (y1, y2), saved = saved_during(lambda: both(bump))
        assert len({t.untyped_storage().data_ptr() for t in saved if t.dtype == torch.uint8}) == copies
        (1.5 * y1.sum() + y2.square().sum()).backward()
        s = x.detach().flatten(0, 1)
        (1.5 * ref_a(s).sum() + ref_b(s + float(bump)).square().sum()).backward()
        for ours, ref in ((a, ref_a), (b, ref_b)):
            assert torch.equal(ours.weight.grad, ref.weight.grad) and torch.equal(ours.bias.grad, ref.bias.grad)


@pytest.mark.parametrize("input_max", [255, 1])
def test_check_input_refuses_values_the_packing_does_not_hold(input_max):
    conv = SpikeConv2d(2, 3, 3, padding=1, input_max=input_max)
    conv.check_input = True
    conv(torch.randint(0, input_max + 1, (1, 2, 5, 5)).float().requires_grad_())  # integers in [0, input_max]: fine
    for bad in (0.5, -1.0, input_max + 1.0):
        x = torch.zeros(1, 2, 5, 5)
        x[0, 1, 2, 3] = bad
        with pytest.raises(RuntimeError, match=rf"integers in \[0, {input_max}\]"):
            conv(x.requires_grad_())


@pytest.mark.parametrize("backend", ["torch", "aot_eager", pytest.param("inductor", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_compiled_convolution_equals_eager(backend):
    """Compiled, the convolution packs its input (through the registered ``spike_pack``/``spike_unpack`` ops on
    CUDA, where inductor compiles the Triton kernels into its graph) and computes what ``Conv2d`` does."""
    torch._dynamo.reset()
    dev = DEVICE if backend == "inductor" else torch.device("cpu")
    ours, ref = pair(3, 2, 1, 2, True, "zeros", input_max=3, backend="auto")
    ours, ref = ours.to(dev), ref.to(dev)
    x = torch.randint(0, 4, (2, 8, 7, 7)).float().to(dev)
    grad = torch.randn(ref(x).shape, generator=torch.Generator().manual_seed(2)).to(dev)
    compiled = torch.compile(ours, backend="eager" if backend == "torch" else backend, fullgraph=True)
    got, saved = step(compiled, x, grad)
    want, _ = step(ref, x, grad)
    for a, b in zip(got, want):
        if backend == "inductor":  # inductor may pick other convolution algorithms than eager cuDNN
            torch.testing.assert_close(a, b)
        else:
            assert torch.equal(a, b)
    if backend != "torch":
        assert any(t.dtype == torch.uint8 and t.numel() == -(-x.numel() // 4) for t in saved)  # 2 bits an element


# --------------------------------------------------------------------------------------------- which convolutions


def _kinds(model: nn.Module) -> dict[str, str]:
    return {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, nn.Conv2d)}


def test_spike_max_of_the_neurons():
    assert spike_max(build_neuron("LIF")) == spike_max(build_neuron("ALIF")) == spike_max(build_neuron("PSN", T=4)) == 1
    assert spike_max(build_neuron("ILIF", max_spike_count=6)) == 6

    class Graded(StepNeuron):  # fires its membrane: not integers
        states = {"v": 0.0}
        defaults = {"tau": 2.0}

        def step(self, x, v, tau):
            h = v + (x - v) / tau
            return torch.relu(h), h

    assert spike_max(Graded()) is None
    assert spike_max(nn.ReLU()) is None


def test_sew_connect_max():
    assert sew_connect_max("ADD", 1, 3) == 4
    assert sew_connect_max("AND", 2, 3) == 6
    assert sew_connect_max("IAND", 1, 3) == 3
    assert sew_connect_max("IAND", 2, 3) is None  # 1 - 2 < 0
    assert sew_connect_max("ADD", None, 3) is None


def test_sew_resnet_builds_spike_convolutions_after_the_stem_only():
    kinds = _kinds(SEWResNet(depth=18, width=4, stem="imagenet", backend="torch", spike_bytes=True))
    assert kinds.pop("stem.0") == "Conv2d"  # reads the image
    assert set(kinds.values()) == {"SpikeConv2d"} and len(kinds) == 19
    assert set(_kinds(SEWResNet(depth=18, width=4, backend="torch")).values()) == {"Conv2d"}  # the default: off
    # ILIF fires counts up to 100: a stage's ADD sums reach 300 (the next stage's first block reads them with plain
    # convolutions), IAND of counts can be negative
    m = SEWResNet(depth=18, width=4, backend="torch", neuron={"type": "ILIF", "max_spike_count": 100}, spike_bytes=True)
    assert m.stage_max == [300, 300, 300, 300]
    assert type(m.layer1[1].conv1[0]) is SpikeConv2d  # reads sums up to 200
    assert type(m.layer2[0].conv1[0]) is type(m.layer2[0].downsample[0][0]) is nn.Conv2d
    assert type(m.layer2[0].conv2[0]) is SpikeConv2d
    m = SEWResNet(depth=18, width=4, backend="torch", connect="IAND", neuron={"type": "ILIF"}, spike_bytes=True)
    assert type(m.layer1[0].conv1[0]) is SpikeConv2d and type(m.layer1[1].conv1[0]) is nn.Conv2d


def test_families_keep_convolutions_of_images_and_currents_plain():
    zoo = {name: build_model({"name": name, "num_classes": 3, "in_channels": 2, "T": 2, "width": 4, "spike_bytes": True,
                              **kw},
                             backend="torch")
           for name, kw in (("spiking_resnet", {}), ("ms_resnet", {}), ("spiking_vgg", {"classifier": "linear"}))}
    plain = {n for n, k in _kinds(zoo["spiking_resnet"]).items() if k == "Conv2d"}
    assert plain == {"conv1.0"}
    plain = {n for n, k in _kinds(zoo["ms_resnet"]).items() if k == "Conv2d"}
    assert plain == {"stem.0", "layer1.0.downsample.0", "layer2.0.downsample.0", "layer3.0.downsample.0",
                     "layer4.0.downsample.0"}  # the stem and the shortcuts read currents
    plain = {n for n, k in _kinds(zoo["spiking_vgg"]).items() if k == "Conv2d"}
    assert plain == {"features.0.0"}
    tiny_head = {"fpn_levels": [1, 2], "fpn_channels": 4, "num_convs": 1}
    det = build_model({"name": "sew_fcos", "width": 4, "T": 2, "head": tiny_head, "spike_bytes": True}, backend="torch")
    plain = {n for n, k in _kinds(det).items() if k == "Conv2d"}
    assert plain == {"backbone.stem.0", "fpn.output.0.0", "fpn.output.1.0"}  # the pyramid's sums of currents
    # an unknown neuron output (a type without spike_max) keeps every convolution plain
    f = LayerFactory({"type": "LIF"}, backend="torch", spike_bytes=True)
    f.spike_max = None
    assert type(BasicBlock(f, 4, 8, 2, "ADD", input_max=f.spike_max).conv2[0]) is nn.Conv2d


@pytest.mark.parametrize("family", ["spikformer", "spike_driven_transformer", "qkformer"])
def test_transformers_keep_their_stem_image_convolution_plain(family):
    from snntrain.nn.attention import SpikeLinear
    from test_transformers import tiny

    on, off = tiny(family, spike_bytes=True), tiny(family)
    kinds = _kinds(on)
    first = {"spikformer": "stem.convs.0.0", "spike_driven_transformer": "stem.convs.0.0",
             "qkformer": "embed1.conv1.0"}[family]
    assert kinds.pop(first) == "Conv2d" and set(kinds.values()) == {"SpikeConv2d"}
    assert set(_kinds(off).values()) == {"Conv2d"}
    # projections of binary spikes keep their input as uint8 whatever the option says
    assert any(isinstance(m, SpikeLinear) for m in on.modules()) and any(isinstance(m, SpikeLinear) for m in off.modules())
    assert on.state_dict().keys() == off.state_dict().keys()


def test_make_conv2d_refuses_a_bad_bound():
    assert type(make_conv2d(2, 3, 3, input_max=255, spike_bytes=True)) is SpikeConv2d
    assert type(make_conv2d(2, 3, 3, input_max=256, spike_bytes=True)) is nn.Conv2d
    assert type(make_conv2d(2, 3, 3, input_max=1)) is nn.Conv2d  # the default: off
    with pytest.raises(ValueError, match="input_max=0"):
        make_conv2d(2, 3, 3, input_max=0, spike_bytes=True)


# ------------------------------------------------------------------------------------------------- the networks


def test_one_sew_block_saves_its_convolution_inputs_packed():
    """The block's input (sums of two spike maps, up to 2: read by its first convolution and its shortcut, one copy)
    is kept in 2 bits an element and the first neuron's spikes (read by the second convolution) in 1, instead of
    float32's 4 bytes; nothing else changes."""
    sizes = {}
    for on in (False, True):
        torch.manual_seed(0)
        f = LayerFactory(None, "batchnorm", "triton", T=2, spike_bytes=on)
        block = BasicBlock(f, 4, 8, 2, "ADD", input_max=2).to(DEVICE)
        x = torch.randint(0, 3, (2, 3, 4, 8, 8)).float().to(DEVICE).requires_grad_()
        _, saved = saved_during(lambda: block(x))
        params = {p.untyped_storage().data_ptr() for p in block.parameters()}
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
        sizes[on] = sum(n for ptr, n in storages.items() if ptr not in params)
    spikes = 2 * 3 * 8 * 4 * 4  # the first neuron's output, [T, B, 8, 4, 4]
    assert sizes[True] == sizes[False] - 4 * (x.numel() + spikes) + x.numel() // 4 + spikes // 8


def _sew_step(spike_bytes: bool, compiled: bool = False, backend: str = "torch"):
    torch.manual_seed(0)
    dev = DEVICE if backend == "triton" else torch.device("cpu")  # the kernels: CUDA, or the interpreter
    model = SEWResNet(depth=18, num_classes=5, in_channels=2, T=2, width=4, stem="imagenet", backend=backend,
                      spike_bytes=spike_bytes).to(dev)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(3, 2, 32, 32, generator=g).to(dev), torch.randint(0, 5, (3,), generator=g).to(dev)
    fn = torch.compile(model, backend="aot_eager") if compiled else model
    loss = F.cross_entropy(fn(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, model.state_dict()


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_sew_resnet_step_is_the_same_with_the_option_on_and_off(backend):
    loss_on, grads_on, state_on = _sew_step(True, backend=backend)
    loss_off, grads_off, state_off = _sew_step(False, backend=backend)
    assert torch.equal(loss_on, loss_off)
    assert grads_on.keys() == grads_off.keys() and all(torch.equal(grads_on[n], grads_off[n]) for n in grads_on)
    assert state_on.keys() == state_off.keys()
    model = SEWResNet(depth=18, num_classes=5, in_channels=2, T=2, width=4, stem="imagenet", spike_bytes=False)
    model.load_state_dict(state_on)  # checkpoints load across the option


@pytest.mark.slow  # a compile of the whole network
def test_compiled_sew_resnet_step_equals_eager():
    torch._dynamo.reset()
    loss_c, grads_c, _ = _sew_step(True, compiled=True)
    loss_e, grads_e, _ = _sew_step(False)
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-6, atol=0)
    for n, g in grads_e.items():
        torch.testing.assert_close(grads_c[n], g, rtol=1e-5, atol=1e-7, msg=n)


def test_config_key_is_validated(compose_run):
    cfg = compose_run(None, "model=spiking_vgg")
    assert cfg.model.spike_bytes is False
    for name in ("sew_resnet", "spiking_resnet", "ms_resnet", "spiking_vgg"):
        with pytest.raises(ValueError, match="spike_bytes='yes' must be true or false"):
            build_model({"name": name, "spike_bytes": "yes"}, backend="torch")
    with pytest.raises(ValueError, match="spike_bytes=1 must be true or false"):
        build_model({"name": "spikformer", "spike_bytes": 1}, backend="torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_step_and_cuda_graph_equal_the_option_off():
    """SEW-ResNet-18 on the Triton kernels, channels-last, bf16 autocast: the step with the option on equals the one
    with it off bit for bit (deterministic cuDNN), eager and captured in a CUDA graph (nothing waits for the host)."""
    from snntrain.tasks.speed import to_channels_last

    deterministic = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        g = torch.Generator().manual_seed(4)
        x = torch.randn(4, 3, 64, 64, generator=g).cuda().contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 5, (4,), generator=g).cuda()
        runs = {}
        for on in (False, True):
            torch.manual_seed(0)
            model = to_channels_last(SEWResNet(depth=18, num_classes=5, T=2, width=16, stem="imagenet",
                                               backend="triton", spike_bytes=on).cuda())

            def fwd_bwd(model=model):
                model.zero_grad(set_to_none=False)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss

            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            state = {k: v.clone() for k, v in model.state_dict().items()}
            eager = fwd_bwd().detach().clone(), [p.grad.clone() for p in model.parameters()]
            model.load_state_dict(state)  # running statistics back as they were
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fwd_bwd()  # warm-up
            torch.cuda.current_stream().wait_stream(s)
            model.load_state_dict(state)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                loss = fwd_bwd()
            graph.replay()
            captured = loss.detach().clone(), [p.grad.clone() for p in model.parameters()]
            runs[on] = eager, captured
        for i in range(2):
            (loss_on, grads_on), (loss_off, grads_off) = runs[True][i], runs[False][i]
            assert torch.equal(loss_on, loss_off)
            assert all(torch.equal(a, b) for a, b in zip(grads_on, grads_off))
    finally:
        torch.backends.cudnn.deterministic = deterministic
