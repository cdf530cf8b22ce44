"""Residual additions folded into the fused batch norm -> neuron kernel.

SEW's ADD (``bn_neuron(residual=...)``, :func:`snntrain.nn.norm_neuron_add`): the oracle is the same kernels without
the fold followed by PyTorch's addition. The kernel adds the residual in float32 and rounds once, as PyTorch adds
two float16/bfloat16 tensors, and the backward is the unfused one, so the sum, every gradient (x, the norm's weight
and bias, PLIF's ``w``, the residual) and the running statistics are equal bit for bit. Each fold is checked to have
happened: no ``aten.add`` of the output's shape ran.

Spiking ResNet's residual added to the neuron's input (``residual_to="input"``, :func:`snntrain.nn.norm_add_neuron`):
the oracle is PyTorch's batch norm, addition and neuron in float64; the kernel computes in float32 without rounding
the norm's output or the sum to the input's dtype, so spikes are equal on these inputs and gradients agree within the
float32 tolerance of the fused norm-neuron tests (two units in the last place of bfloat16 for 16-bit input).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from _testing import DEVICE, SUMMED, TOLERANCES, assert_close, capture_cuda_graph
from snntrain.kernels import bn_neuron as BN
from snntrain.kernels.bn_neuron import bn_neuron, residual_fits
from snntrain.nn import LayerNorm2d, MultiStep, NormNeuron, build_neuron, norm_add_neuron, norm_neuron_add

OPTIONS = dict(kind="lif", tau=2.0, v_threshold=1.0, v_reset=0.0, decay_input=True, detach_reset=True,
               surrogate="atan", alpha=2.0)


#: The ATen ops that form SEW's connections (``sew_connect``: ``A + S``, ``A * S``, ``(1 - A) * S``).
_CONNECT_OPS = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.rsub.Scalar)


class _Adds(TorchDispatchMode):
    """Records the shapes of the calls below autograd of the ops that form a connection (additions, products)."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _CONNECT_OPS:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def _cl(t: torch.Tensor) -> torch.Tensor:
    """A [T, B, C, H, W] (or [B, C, H, W]) tensor channels-last, as NormNeuron's kernels write spikes."""
    if t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    return t.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, t.shape[:2])


def _connected(spikes, r, connect):
    return {"ADD": lambda: spikes + r, "AND": lambda: spikes * r, "IAND": lambda: (1.0 - spikes) * r}[connect]()


def _run(fold: bool, x, weight, bias, residual, grad, T, training=True, connect="ADD", **neuron):
    """Output, gradients and running statistics of bn_neuron with the residual connected in the kernel (``fold``)
    or after it (SEW's ``connect``)."""
    x, r = x.clone().requires_grad_(), residual.clone().requires_grad_()
    w = None if weight is None else weight.clone().requires_grad_()
    b = None if bias is None else bias.clone().requires_grad_()
    stats = torch.zeros(x.shape[-3], device=DEVICE), torch.ones(x.shape[-3], device=DEVICE)
    options = {**OPTIONS, **neuron}
    if "w" in options:
        options["w"] = options["w"].clone().requires_grad_()
    args = dict(training=training, momentum=0.1, eps=1e-5, T=T, **options)
    adds = _Adds()
    with adds:
        y = (bn_neuron(x, w, b, *stats, residual=r, connect=connect, **args) if fold
             else _connected(bn_neuron(x, w, b, *stats, **args), r, connect))
    y.backward(grad)
    leaves = [x, r, w, b] + ([options["w"]] if "w" in options else [])
    return y.detach(), [t.grad for t in leaves if t is not None], stats, adds.shapes, y.stride()


CASES = {
    "fp32": (torch.float32, False, False, {}),
    "bf16-cl": (torch.bfloat16, True, False, {}),
    "fp16-cl-repeated": (torch.float16, True, True, {}),
    "bf16-plif-soft": (torch.bfloat16, False, False, dict(kind="plif", v_reset=None, tau=None)),
    "fp32-cl-if-eval": (torch.float32, True, False, dict(kind="if", tau=None, training=False)),
}


@pytest.mark.parametrize("connect", ["ADD", "AND", "IAND"])
@pytest.mark.parametrize("case", CASES)
def test_folded_add_equals_the_kernel_then_the_addition(case, connect):
    """SEW's ADD, AND and IAND in the kernel equal the kernel's spikes connected by PyTorch, bit for bit."""
    dtype, cl, repeated, neuron = CASES[case]
    neuron = dict(neuron)
    training = neuron.pop("training", True)
    if neuron.get("kind") == "plif":
        neuron["w"] = torch.tensor(0.3, device=DEVICE)
    g = torch.Generator().manual_seed(0)
    T, B, C, H, W = 3, 2, 5, 4, 3
    shape = (B, C, H, W) if repeated else (T, B, C, H, W)
    x = (torch.randn(shape, generator=g) * 1.5 + 0.5).to(dtype).to(DEVICE)
    residual = torch.randint(0, 3, (T, B, C, H, W), generator=g).to(dtype).to(DEVICE)  # SEW counts
    grad = torch.randn(T, B, C, H, W, generator=g).to(dtype).to(DEVICE)
    if cl:
        x, residual, grad = _cl(x), _cl(residual), _cl(grad)
    w, b = (torch.rand(C, generator=g) + 0.5).to(DEVICE), (torch.rand(C, generator=g) - 0.3).to(DEVICE)
    steps = T if repeated else None
    assert residual_fits(x, steps, residual)
    folded = _run(True, x, w, b, residual, grad, steps, training, connect, **neuron)
    added = _run(False, x, w, b, residual, grad, steps, training, connect, **neuron)
    assert torch.equal(folded[0], added[0])
    assert len(folded[1]) == len(added[1]) and all(torch.equal(p, q) for p, q in zip(folded[1], added[1]))
    assert all(torch.equal(p, q) for p, q in zip(folded[2], added[2]))
    assert folded[4] == added[4]  # the spikes' layout
    out = (T, B, C, H, W)
    assert out not in folded[3] and out in added[3]  # the fold happened: no connection of the output's size
    if connect != "ADD":  # the connection's gradients reach the neuron: the outputs are not all zero
        assert folded[1][0].abs().sum() > 0 and folded[1][1].abs().sum() > 0


def test_other_layouts_and_dtypes_are_added_after():
    """A residual laid out otherwise than the spikes, or of another dtype, is added after the kernels: same
    results, with the addition."""
    g = torch.Generator().manual_seed(1)
    x = _cl(torch.randn(2, 2, 3, 4, 4, generator=g).to(DEVICE))  # channels-last spikes
    grad = torch.randn(2, 2, 3, 4, 4, generator=g).to(DEVICE)
    w, b = torch.ones(3, device=DEVICE), torch.zeros(3, device=DEVICE)
    for residual in (torch.randn(2, 2, 3, 4, 4, generator=g).to(DEVICE),  # contiguous
                     torch.randn(2, 2, 3, 4, 4, generator=g).double().to(DEVICE)):
        assert not residual_fits(x, None, residual)
        folded = _run(True, x, w, b, residual, grad, None)
        added = _run(False, x, w, b, residual, grad, None)
        assert torch.equal(folded[0], added[0]) and all(torch.equal(p, q) for p, q in zip(folded[1], added[1]))
        assert (2, 2, 3, 4, 4) in folded[3]
    assert not residual_fits(x, None, torch.zeros(2, 2, 3, 4, 5, device=DEVICE))


def _sn(norm: str = "batch", neuron: str = "LIF", backend: str = "triton") -> NormNeuron:
    torch.manual_seed(0)
    n = nn.BatchNorm2d(4) if norm == "batch" else LayerNorm2d(4)
    return NormNeuron(n, build_neuron(type=neuron, tau=2.0) if neuron != "IF" else build_neuron(type="IF"),
                      backend=backend).to(DEVICE)


def _module_run(sn: NormNeuron, x, r, fn):
    x, r = x.clone().requires_grad_(), r.clone().requires_grad_()
    adds = _Adds()
    with adds:
        y = fn(sn, x, r)
    y.backward(torch.arange(y.numel(), dtype=y.dtype, device=DEVICE).reshape(y.shape).remainder(7) - 3.0)
    grads = [x.grad, r.grad, *(p.grad for p in sn.parameters())]
    return y.detach(), grads, [t.clone() for t in sn.buffers()], adds.shapes


def _compare(make, x, r, fold_expected: bool):
    a, b = make(), make()
    got = _module_run(a, x, r, lambda sn, x, r: norm_neuron_add(sn, x, r))
    want = _module_run(b, x, r, lambda sn, x, r: sn(x) + r)
    assert torch.equal(got[0], want[0])
    assert all(torch.equal(p, q) for p, q in zip(got[1], want[1]))
    assert all(torch.equal(p, q) for p, q in zip(got[2], want[2]))
    assert (tuple(x.shape) not in got[3]) == fold_expected, got[3]
    return a


def test_norm_neuron_add_folds_the_batch_norm_and_the_built_in_neurons():
    g = torch.Generator().manual_seed(2)
    x = _cl(torch.randn(3, 2, 4, 5, 5, generator=g).to(DEVICE) + 0.5)
    r = _cl(torch.randint(0, 2, (3, 2, 4, 5, 5), generator=g).float().to(DEVICE))
    for neuron in ("LIF", "IF", "PLIF"):
        _compare(lambda neuron=neuron: _sn(neuron=neuron), x, r, True)
    sn = _compare(_sn, x, r, True)
    assert sn.norm.num_batches_tracked.item() == 1


def test_norm_neuron_add_runs_the_module_then_the_addition_where_it_does_not_fold():
    """The PyTorch backend, a layer norm, a generated neuron, fused = False, the membrane kept, and a hook or an
    activity counter watching: the module runs (hooks see its spikes) and the addition follows."""
    g = torch.Generator().manual_seed(3)
    x = _cl(torch.randn(2, 2, 4, 3, 3, generator=g).to(DEVICE))
    r = _cl(torch.randint(0, 2, (2, 2, 4, 3, 3), generator=g).float().to(DEVICE))
    _compare(lambda: _sn(backend="torch"), x, r, False)
    _compare(lambda: _sn(norm="layer"), x, r, False)
    _compare(lambda: _sn(neuron="ALIF"), x, r, False)

    def unfused():
        sn = _sn()
        sn.fused = False
        return sn

    _compare(unfused, x, r, False)

    def keeps_membrane():
        sn = _sn()
        sn.neuron.store_v_seq = True
        return sn

    _compare(keeps_membrane, x, r, False)
    seen = []

    def hooked():
        sn = _sn()
        sn.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
        return sn

    _compare(hooked, x, r, False)
    assert seen and all(((s == 0) | (s == 1)).all() for s in seen)  # the hook saw spikes, not the sum


@pytest.mark.parametrize("connect", ["ADD", "IAND"])
def test_sew_resnet_blocks_fold_their_add(connect):
    """SEW-ResNet's blocks fold their connection (ADD, and IAND as AND's representative) into their last
    norm-neuron: logits and every gradient equal the model's with the fold held off (a forward hook on each block's
    last norm-neuron), and the fold takes the connections of the blocks' outputs away."""
    from snntrain.models.sew_resnet import SEWResNet

    torch.manual_seed(0)
    model = SEWResNet(depth=18, num_classes=3, T=2, stem="cifar", width=4, backend="triton",
                      connect=connect).to(DEVICE)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    def lasts(m):
        return [block.sn2 for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for block in layer]

    def run(m, hold_off: bool):
        handles = [sn.register_forward_hook(lambda *a: None) for sn in lasts(m)] if hold_off else []
        m.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_()
        adds = _Adds()
        with adds:
            logits = m(leaf)
        (logits * torch.arange(1.0, 4.0, device=DEVICE)).sum().backward()
        for h in handles:
            h.remove()
        return logits.detach(), [leaf.grad, *(p.grad.clone() for p in m.parameters())], adds.shapes

    copy_ = copy.deepcopy(model)
    folded, held = run(model, False), run(copy_, True)
    assert torch.equal(folded[0], held[0])
    assert all(torch.equal(p, q) for p, q in zip(folded[1], held[1]))
    assert all(torch.equal(p, q) for p, q in zip(model.buffers(), copy_.buffers()))
    five = [s for s in held[2] if len(s) == 5]
    assert len(five) >= len(lasts(model)) and not [s for s in folded[2] if len(s) == 5]



def test_a_residual_function_runs_after_the_module_unless_the_add_is_folded():
    g = torch.Generator().manual_seed(6)
    x = _cl(torch.randn(2, 2, 4, 3, 3, generator=g).to(DEVICE))
    r = _cl(torch.randint(0, 2, (2, 2, 4, 3, 3), generator=g).float().to(DEVICE))
    for hooked in (False, True):
        sn, order = _sn(), []
        if hooked:
            sn.register_forward_hook(lambda *a: order.append("sn"))

        def shortcut():
            order.append("shortcut")
            return r

        y = norm_neuron_add(sn, x, shortcut)
        assert torch.equal(y, _sn()(x) + r)
        assert order == (["sn", "shortcut"] if hooked else ["shortcut"])


@pytest.mark.parametrize("family", ["spikformer", "qkformer"])
def test_transformer_stems_fold_their_add(family):
    """Spikformer's relative position encoding (``x + norm-neuron(conv(x))``) and QKFormer's stem stages (``spikes +
    shortcut spikes``) add in their last norm-neuron's kernel: the same logits and gradients as with the fold held
    off, and fewer additions of maps."""
    from snntrain.models import build_model

    spec = {"spikformer": dict(name="spikformer", variant="spikformer_cifar10", embed_dim=16, depth=1, heads=2,
                               patch_size=4),
            "qkformer": dict(name="qkformer", variant="qkformer_4_384", embed_dim=16, heads=[2, 2, 2],
                             depths=[1, 1, 1], pooling="0011")}[family]
    torch.manual_seed(0)
    # row-major weights: PyTorch's CPU convolution is unreliable for channels-last weights of few channels
    # (one_cpu_thread), and contiguous maps give contiguous spikes and shortcuts, which fold as channels-last do
    model = build_model({**spec, "num_classes": 3, "in_channels": 3, "T": 2}, backend="triton").to(DEVICE)
    held = copy.deepcopy(model)
    lasts = {"spikformer": lambda m: [m.stem.rpe_sn],
             "qkformer": lambda m: [m.embed1.sn3, m.embed2.sn2, m.embed3.sn2]}[family]
    for sn in lasts(held):
        sn.register_forward_hook(lambda *a: None)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    runs = []
    for m in (model, held):
        leaf = x.clone().requires_grad_()
        adds = _Adds()
        with adds:
            logits = m(leaf)
        (logits * torch.arange(1.0, 4.0, device=DEVICE)).sum().backward()
        runs.append((logits.detach(), [leaf.grad, *(p.grad for p in m.parameters())],
                     [s for s in adds.shapes if len(s) == 5]))
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(p, q) for p, q in zip(runs[0][1], runs[1][1]))
    assert len(runs[1][2]) - len(runs[0][2]) == len(lasts(model)), (runs[0][2], runs[1][2])


INPUT_CASES = {  # dtype, channels-last, T, neuron, training
    "fp32-checkpoints": (torch.float32, False, 9, dict(type="LIF", tau=2.0, surrogate="sigmoid"), True),
    "bf16-cl": (torch.bfloat16, True, 3, dict(type="LIF", tau=2.0, surrogate="atan", detach_reset=True), True),
    "fp32-cl-plif-soft": (torch.float32, True, 4, dict(type="PLIF", init_tau=2.5, v_reset=None), True),
    "fp16-if-eval": (torch.float16, False, 3, dict(type="IF", v_threshold=0.8), False),
}


def _input_reference(x, r, weight, bias, running, neuron, training):
    """neuron(batch_norm(x) + r) in float64 with PyTorch's modules: output, gradients, running statistics."""
    T, B = x.shape[:2]
    xs, rs = x.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    w, b = weight.detach().double().requires_grad_(), bias.detach().double().requires_grad_()
    rm, rv = (t.double().clone() for t in running)
    y = torch.nn.functional.batch_norm(xs.flatten(0, 1), rm, rv, w, b, training=training, momentum=0.1,
                                       eps=1e-5).unflatten(0, (T, B))
    ref = copy.deepcopy(neuron).double()
    ref.backend = "torch"
    out = ref(y + rs)
    return out, [xs, rs, w, b, *ref.parameters()], (rm, rv)


@pytest.mark.parametrize("case", INPUT_CASES)
def test_residual_to_input_matches_pytorch_in_float64(case):
    dtype, cl, T, spec, training = INPUT_CASES[case]
    g = torch.Generator().manual_seed(11)
    B, C, H, W = 2, 5, 4, 3
    x = (torch.randn(T, B, C, H, W, generator=g) * 1.2 + 0.3).to(dtype).to(DEVICE)
    r = torch.randn(T, B, C, H, W, generator=g).to(dtype).to(DEVICE)
    grad = torch.randn(T, B, C, H, W, generator=g).to(dtype).to(DEVICE)
    if cl:
        x, r, grad = _cl(x), _cl(r), _cl(grad)
    weight = (torch.rand(C, generator=g) + 0.5).to(DEVICE)
    bias = (torch.rand(C, generator=g) - 0.3).to(DEVICE)
    running = (torch.rand(C, generator=g) * 0.2).to(DEVICE), (torch.rand(C, generator=g) + 0.5).to(DEVICE)
    neuron = build_neuron(**spec).to(DEVICE)
    want, leaves, stats = _input_reference(x, r, weight, bias, running, neuron, training)
    want.backward(grad.double())
    xs, rs = x.clone().requires_grad_(), r.clone().requires_grad_()
    w, b = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    rm, rv = (t.clone() for t in running)
    got = bn_neuron(xs, w, b, rm, rv, training=training, momentum=0.1, eps=1e-5, residual=rs, residual_to="input",
                    w=neuron._w(), **_options(neuron))
    got.backward(grad)
    assert torch.equal(got.double(), want.detach()), "spikes"
    low = dtype != torch.float32
    for name, ours, theirs in zip(("dx", "dresidual", "dweight", "dbias", "dw"),
                                  [xs.grad, rs.grad, w.grad, b.grad, *(p.grad for p in neuron.parameters())],
                                  [t.grad for t in leaves]):
        scale = theirs.abs().max().item() or 1.0
        tol = TOLERANCES[dtype][0] if low and name in ("dx", "dresidual") else SUMMED["rtol"]
        assert_close(ours.double(), theirs, rtol=0, atol=tol * scale * (4 if low else 1), what=name)
    for ours, theirs in zip((rm, rv), stats):
        assert_close(ours.double(), theirs, rtol=1e-5, atol=1e-7, what="running statistics")


def _options(neuron) -> dict:
    from snntrain.nn.norm_neuron import _neuron_options

    return _neuron_options(neuron.params)


def test_residual_to_input_refuses_what_it_cannot_fold():
    x = _cl(torch.randn(2, 2, 3, 4, 4, device=DEVICE))
    args = (torch.ones(3, device=DEVICE), torch.zeros(3, device=DEVICE), None, None)
    opts = dict(training=True, momentum=0.1, eps=1e-5, kind="lif", tau=2.0, v_threshold=1.0, v_reset=0.0,
                decay_input=True, detach_reset=False, surrogate="atan", alpha=2.0)
    with pytest.raises(ValueError, match="residual_to='output' is not valid; choose 'spikes' or 'input'"):
        bn_neuron(x, *args, residual=torch.zeros_like(x), residual_to="output", **opts)
    with pytest.raises(ValueError, match=r"residual \(2, 2, 3, 4, 4\) at strides \(96, 48, 16, 4, 1\)"):
        bn_neuron(x, *args, residual=torch.zeros(2, 2, 3, 4, 4, device=DEVICE), residual_to="input", **opts)
    with pytest.raises(ValueError, match="T=2"):
        bn_neuron(x[0], *args, T=2, residual=torch.zeros_like(x), residual_to="input", **opts)


def _block_parts(backend: str = "triton", norm: str = "batch", neuron: str = "LIF"):
    torch.manual_seed(0)
    bn = MultiStep(nn.BatchNorm2d(4) if norm == "batch" else LayerNorm2d(4)).to(DEVICE)
    return bn, build_neuron(type=neuron, backend=backend).to(DEVICE)


def _add_neuron_run(parts, x, r, fused_fn: bool):
    norm, neuron = parts
    x, r = x.clone().requires_grad_(), r.clone().requires_grad_()
    adds = _Adds()
    with adds:
        y = norm_add_neuron(norm, neuron, x, r) if fused_fn else neuron(norm(x) + r)
    y.backward(torch.arange(y.numel(), dtype=y.dtype, device=DEVICE).reshape(y.shape).remainder(5) - 2.0)
    grads = [x.grad, r.grad, *(p.grad for p in norm.parameters()), *(p.grad for p in neuron.parameters())]
    return y.detach(), grads, [b.clone() for b in norm.buffers()], adds.shapes


def test_norm_add_neuron_fuses_where_it_can_and_runs_the_modules_elsewhere():
    g = torch.Generator().manual_seed(12)
    x = _cl(torch.randn(3, 2, 4, 5, 5, generator=g).to(DEVICE))
    r = _cl(torch.randn(3, 2, 4, 5, 5, generator=g).to(DEVICE))
    for neuron in ("LIF", "PLIF", "IF"):
        got = _add_neuron_run(_block_parts(neuron=neuron), x, r, True)
        want = _add_neuron_run(_block_parts(neuron=neuron), x, r, False)
        assert torch.equal(got[0], want[0]), neuron
        for a, b in zip(got[1], want[1]):
            assert_close(a, b, **SUMMED, what=neuron)
        for a, b in zip(got[2], want[2]):
            assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-7, what=f"{neuron} running statistics")
        assert tuple(x.shape) not in got[3] and tuple(x.shape) in want[3], neuron  # fused: no addition of maps
    for parts in (_block_parts(backend="torch"), _block_parts(norm="layer"), _block_parts(neuron="ALIF")):
        got, want = _add_neuron_run(parts, x, r, True), _add_neuron_run(copy.deepcopy(parts), x, r, False)
        assert torch.equal(got[0], want[0]) and tuple(x.shape) in got[3]
    norm, neuron = _block_parts()
    order = []
    norm.register_forward_hook(lambda *a: order.append("norm"))
    norm_add_neuron(norm, neuron, x, lambda: order.append("shortcut") or r)
    assert order == ["norm", "shortcut"]  # watched: the modules, in the block's order


def test_spiking_resnet_blocks_use_it():
    """Spiking ResNet's blocks run their last norm, shortcut addition and neuron as the fused op under Triton: the
    same logits as with it held off (hooks on the neurons), gradients within the float32 tolerance."""
    from snntrain.models.spiking_resnet import SpikingResNet

    torch.manual_seed(0)
    model = SpikingResNet(num_classes=3, T=2, stem="cifar", width=4, backend="triton").to(DEVICE)
    held = copy.deepcopy(model)
    blocks = [m for m in held.modules() if hasattr(m, "sn2") and hasattr(m, "bn2")]
    for block in blocks:
        block.sn2.register_forward_hook(lambda *a: None)
    calls = []
    original = BN.bn_neuron

    def spy(*args, **kwargs):
        calls.append(kwargs.get("residual_to", "spikes"))
        return original(*args, **kwargs)

    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    runs = []
    try:
        BN.bn_neuron = spy
        for m in (model, held):
            leaf = x.clone().requires_grad_()
            logits = m(leaf)
            (logits * torch.arange(1.0, 4.0, device=DEVICE)).sum().backward()
            runs.append((logits.detach(), [leaf.grad, *(p.grad for p in m.parameters())]))
    finally:
        BN.bn_neuron = original
    assert calls.count("input") == len(blocks) == 8
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(runs[0][1], runs[1][1]):
        scale = b.abs().max().item() or 1.0
        assert_close(a, b, rtol=0, atol=1e-4 * scale)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (gpu marker)")
def test_folded_add_in_a_cuda_graph():
    """A captured forward and backward of the folded layer replays to the eager results."""
    g = torch.Generator().manual_seed(5)
    x = _cl(torch.randn(4, 8, 64, 14, 14, generator=g).bfloat16().to(DEVICE))
    r = _cl(torch.randint(0, 3, (4, 8, 64, 14, 14), generator=g).bfloat16().to(DEVICE))
    sn = _sn().to(DEVICE)
    sn.norm = nn.BatchNorm2d(64).to(DEVICE)
    xs, rs = x.clone().requires_grad_(), r.clone().requires_grad_()

    def replayed(fold):
        """Eager results of the layer's forward and backward, and a captured graph's replay of them."""
        def step():
            xs.grad = rs.grad = None
            y = fold(xs, rs)
            y.backward(torch.ones_like(y))
            return y, xs.grad, rs.grad

        # detached: a clone that kept y's autograd graph would keep the leaves' gradient accumulators, made on the
        # default stream, alive into the capture, and the captured backward would wait on the default stream
        want = [t.detach().clone() for t in step()]
        graph, outs = capture_cuda_graph(step)
        graph.replay()
        torch.cuda.synchronize()
        return want, outs

    for connect in ("ADD", "AND", "IAND"):
        want, outs = replayed(lambda x, r: norm_neuron_add(sn, x, r, connect=connect))
        assert torch.equal(outs[0], want[0]) and torch.equal(outs[2], want[2])
        torch.testing.assert_close(outs[1], want[1])
    # the residual added to the neuron's input (eval: the same statistics at every replay)
    norm, neuron = MultiStep(nn.BatchNorm2d(64)).to(DEVICE).eval(), build_neuron(type="LIF").to(DEVICE)
    want, outs = replayed(lambda x, r: norm_add_neuron(norm, neuron, x, r))
    assert torch.equal(outs[0], want[0])
    torch.testing.assert_close(outs[1], want[1])
    torch.testing.assert_close(outs[2], want[2])
