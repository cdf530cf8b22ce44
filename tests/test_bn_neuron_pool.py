"""The fused batch norm -> neuron -> 3x3/2 max-pool (snntrain.kernels.bn_neuron_pool, snntrain.nn.norm_neuron_max_pool).

Two oracles. The separate Triton ops, :class:`~snntrain.nn.NormNeuron` then :class:`~snntrain.nn.SpikeMaxPool2d`:
the fused op runs the same statistics pass, the same per-element arithmetic and the same backward from the same
dL/dS, so pooled spikes, window positions and running statistics are equal, and gradients equal within the fp32
tolerance (``SUMMED``: on these inputs they come out bit for bit). And the PyTorch backend (BatchNorm2d, the
PyTorch neuron, ``F.max_pool2d``) on the fp32 values of the input, with the tolerances of
``tests/test_norm_neuron.py``: pooled spikes equal, dL/dx within two units in the last place of its dtype (relative
to its largest value), parameter gradients within ``SUMMED`` (for 16-bit input within two units in the last place
of the dtype, relative to the largest: the Triton ops round dL/dS to the dtype once they have summed the windows'
gradients into it, as PyTorch's pooling does in that dtype, while the reference sums in fp32).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from _testing import DEVICE, SUMMED, TOLERANCES, assert_close, capture_cuda_graph
from snntrain.kernels import bn_neuron_pool as K
from snntrain.kernels import spike_pool as SP
from snntrain.nn import LayerNorm2d, MultiStep, NormNeuron, SpikeMaxPool2d, build_neuron, set_backend
from snntrain.nn import norm_neuron as NN
from snntrain.nn.norm_neuron import norm_neuron_max_pool

RUNNING = dict(rtol=1e-5, atol=1e-7)

NEURONS = {
    "lif": dict(type="LIF", tau=2.0, surrogate="atan", detach_reset=True),  # the SEW-ResNet default
    "if-soft": dict(type="IF", v_reset=None, surrogate="piecewise_quadratic"),
    "plif": dict(type="PLIF", init_tau=2.5, surrogate="sigmoid", v_reset=-0.1, v_threshold=0.7),
    "plif-no-decay": dict(type="PLIF", init_tau=3.0, decay_input=False, v_reset=None, surrogate="atan", alpha=3.0),
}


def _layers(C: int, neuron: str, seed: int = 0, affine: bool = True, **bn) -> tuple[NormNeuron, MultiStep]:
    g = torch.Generator().manual_seed(seed)
    norm = nn.BatchNorm2d(C, affine=affine, **bn)
    if affine:
        with torch.no_grad():
            norm.weight.copy_(torch.rand(C, generator=g) * 0.8 + 0.6)
            norm.bias.copy_(torch.rand(C, generator=g) * 0.8 - 0.3)
    sn = NormNeuron(norm, build_neuron(**NEURONS[neuron]), backend="triton").to(DEVICE)
    return sn, MultiStep(SpikeMaxPool2d(3, stride=2, padding=1, backend="triton"))


def _input(shape, seed: int, dtype, layout: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 1.5 + 0.4).to(dtype).to(DEVICE)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else \
            x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, shape[:2])
    return x


def _grad_of(shape, seed: int, dtype) -> torch.Tensor:
    """dL/d(pooled spikes), representable in ``dtype``, over a range of magnitudes (sums of several windows'
    gradients round)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g))).to(dtype).float().to(DEVICE)


def _step(fn, sn: NormNeuron, x: torch.Tensor, seed: int, dtype: torch.dtype | None = None):
    """Pooled spikes, dL/dx and the parameters' gradients of ``fn(x)`` for a random dL/d(pooled spikes)
    representable in ``dtype`` (x's by default)."""
    leaf = x.detach().clone().requires_grad_()
    y = fn(leaf)
    params = {name: p for name, p in sn.named_parameters() if p.requires_grad}
    g = _grad_of(y.shape, seed, dtype or x.dtype)
    grads = torch.autograd.grad((y.float() * g).sum(), [leaf, *params.values()])
    return y.detach(), grads[0], dict(zip(params, grads[1:]))


def _fused_called(monkeypatch) -> list:
    calls = []
    original = K.bn_neuron_pool

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(K, "bn_neuron_pool", spy)
    return calls


CASES = {
    # name: (input shape, steps (stride-0 time axis) or None, dtype, layout, neuron)
    "lif-fp32-nchw-odd": ((2, 3, 4, 7, 9), None, torch.float32, "nchw", "lif"),
    "lif-bf16-cl": ((3, 2, 5, 6, 7), None, torch.bfloat16, "channels_last", "lif"),
    "stem-steps-cl": ((2, 4, 9, 7), 3, torch.float32, "channels_last", "lif"),
    "stem-steps-bf16-nchw-even": ((3, 5, 6, 8), 2, torch.bfloat16, "nchw", "plif"),
    "if-soft-fp16-cl": ((2, 2, 3, 5, 6), None, torch.float16, "channels_last", "if-soft"),
    "plif-T11-checkpoints": ((11, 2, 3, 5, 5), None, torch.float32, "nchw", "plif"),
    "plif-no-decay-1x1": ((2, 3, 2, 1, 2), None, torch.float32, "channels_last", "plif-no-decay"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_separate_ops_and_pytorch(case, monkeypatch):
    """Pooled spikes, dL/dx, the norm's and PLIF's gradients and the running statistics of the fused op against the
    NormNeuron and the SpikeMaxPool2d one after the other (Triton), and against the PyTorch backend."""
    shape, steps, dtype, layout, neuron = CASES[case]
    seed = sum(map(ord, case))
    sn, pool = _layers(shape[-3], neuron, seed)
    separate, ref = copy.deepcopy(sn), copy.deepcopy(sn)
    x = _input(shape, seed, dtype, layout)
    calls = _fused_called(monkeypatch)
    y1, gx1, gp1 = _step(lambda t: norm_neuron_max_pool(sn, pool, t, T=steps), sn, x, seed)
    assert len(calls) == 1, "the fused op did not run"
    y0, gx0, gp0 = _step(lambda t: pool(separate(t, T=steps)), separate, x, seed)
    T = steps or shape[0]
    assert y1.shape == (T, *shape[-4:-2], (shape[-2] - 1) // 2 + 1, (shape[-1] - 1) // 2 + 1) and y1.dtype == dtype
    assert torch.equal(y1, y0), f"pooled spikes differ in {int((y1 != y0).sum())} of {y0.numel()}"
    if layout == "channels_last" and shape[-3] > 1:
        assert y1.flatten(0, 1).is_contiguous(memory_format=torch.channels_last)
    if dtype == torch.float32:
        assert_close(gx1, gx0, **SUMMED, what="dx")
    else:  # relative to the largest |dL/dx|, as the batch norm's gradient subtracts channel means
        assert_close(gx1, gx0, rtol=0, atol=TOLERANCES[dtype][0] * gx0.abs().max().item(), what="dx")
    assert gp1.keys() == gp0.keys()
    for name in gp0:
        assert_close(gp1[name], gp0[name], **SUMMED, what=name)
    for buf in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(sn.norm, buf), getattr(separate.norm, buf)), buf
    # the PyTorch backend on the fp32 values
    set_backend(ref, "torch")
    ref_pool = MultiStep(SpikeMaxPool2d(3, stride=2, padding=1, backend="torch"))
    y2, gx2, gp2 = _step(lambda t: ref_pool(ref(t, T=steps)), ref, x.float(), seed, dtype)
    assert torch.equal(y1.float(), y2), f"pooled spikes differ from PyTorch's in {int((y1.float() != y2).sum())}"
    if dtype == torch.float32:
        assert_close(gx1, gx2, **SUMMED, what="dx against PyTorch")
    else:
        assert_close(gx1, gx2, rtol=0, atol=TOLERANCES[dtype][0] * gx2.abs().max().item(), what="dx against PyTorch")
    for name in gp2:  # 16-bit: dL/dS is rounded to the dtype once the windows' gradients are summed (PyTorch: fp32)
        tol = SUMMED if dtype == torch.float32 else dict(rtol=0, atol=TOLERANCES[dtype][0] * gp2[name].abs().max())
        assert_close(gp1[name], gp2[name], **tol, what=f"{name} against PyTorch")
    for buf in ("running_mean", "running_var"):
        assert_close(getattr(sn.norm, buf), getattr(ref.norm, buf), **RUNNING, what=buf)


@pytest.mark.parametrize("mode", ["eval", "no-affine", "no-running-stats", "cumulative"])
def test_norm_variants(mode, monkeypatch):
    """Eval mode (the running statistics, gradients through them), a norm without weight and bias, one without
    running statistics (batch statistics in eval too), and the cumulative average of ``momentum=None`` (as
    ``callbacks.precise_bn`` runs it) over two batches."""
    kw = {"no-affine": dict(affine=False), "no-running-stats": dict(track_running_stats=False),
          "cumulative": dict(momentum=None)}.get(mode, {})
    sn, pool = _layers(3, "lif", 3, **kw)
    if mode == "eval":
        with torch.no_grad():
            sn.norm.running_mean.copy_(torch.linspace(-0.3, 0.4, 3))
            sn.norm.running_var.copy_(torch.linspace(0.6, 1.9, 3))
    sn.train(mode in ("no-affine", "cumulative"))
    separate = copy.deepcopy(sn)
    x = _input((2, 2, 3, 7, 6), 4, torch.float32, "channels_last")
    calls = _fused_called(monkeypatch)
    if mode == "cumulative":  # a first batch, both ways
        first = _input((2, 2, 3, 7, 6), 40, torch.float32, "channels_last")
        _step(lambda t: norm_neuron_max_pool(sn, pool, t), sn, first, 5)
        _step(lambda t: pool(separate(t)), separate, first, 5)
    y1, gx1, gp1 = _step(lambda t: norm_neuron_max_pool(sn, pool, t), sn, x, 5)
    y0, gx0, gp0 = _step(lambda t: pool(separate(t)), separate, x, 5)
    assert calls and torch.equal(y1, y0)
    assert_close(gx1, gx0, **SUMMED, what="dx")
    for name in gp0:
        assert_close(gp1[name], gp0[name], **SUMMED, what=name)
    if mode == "eval":
        assert int(sn.norm.num_batches_tracked) == 0
    for buf in ("running_mean", "running_var", "num_batches_tracked"):
        a, b = getattr(sn.norm, buf), getattr(separate.norm, buf)
        assert (a is None and b is None) or torch.equal(a, b), buf
    if mode == "cumulative":
        assert int(sn.norm.num_batches_tracked) == 2


def test_positions_are_the_max_pools_and_ties_take_the_first():
    """The window positions the forward saves equal those the max-pool kernel saves on the separate op's spikes,
    for mixed windows and for windows without a spike or all spikes: a tie takes the first position inside the
    input (row-major), so a window of the top row or left column of the map skips its padding."""
    from snntrain.kernels import bn_neuron as BN
    from snntrain.kernels import neuron_step as NS
    from snntrain.kernels import norm_neuron_base as NB

    C = 3
    x = _input((2, 2, C, 7, 8), 6, torch.float32, "channels_last")
    weight = torch.ones(C, device=DEVICE)
    bias = torch.tensor([0.0, -50.0, 50.0], device=DEVICE)  # channel 1 never fires, channel 2 always
    T, flags, k, k_tensor = NB._prepare(x, None, dict(kind="lif", tau=2.0))
    flags |= BN.F_BATCH_STATS | NS.F_SAVE_CKPT
    params = NB._params(k, {}, 1e-5)
    pooled, pos, *_ = K._fwd_host(x, weight, bias, None, None, k_tensor, T, params, flags, True)
    spikes, *_ = BN._bn_fwd_host(x, weight, bias, None, None, k_tensor, T, params, flags, True)
    y_ref, pos_ref = SP._fwd_host(spikes.flatten(0, 1), list(K.POOL_PARAMS), True)
    assert torch.equal(pooled.flatten(0, 1), y_ref) and torch.equal(pos.flatten(0, 1), pos_ref)
    assert pos.dtype == torch.uint8 and pos.stride() == pooled.stride()
    first = torch.tensor([[4, 3, 3, 3], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.uint8, device=DEVICE)
    assert not pooled[:, :, 1].any() and pooled[:, :, 2].all()
    for c in (1, 2):  # every window a tie: its first position inside the map
        assert torch.equal(pos[:, :, c], first.expand_as(pos[:, :, c])), pos[0, 0, c]


def test_models_use_it_and_keep_their_state_dicts(monkeypatch):
    """SEW-ResNet's and Spiking ResNet's ImageNet stems, and the pooled stem stages of Spikformer and the
    Spike-driven Transformer, run the fused op under Triton: logits, every gradient and every buffer equal the same
    network running its NormNeuron and max-pool one after the other (a hook on the pool makes it so), the state dict
    has the same names as under the PyTorch backend, and loading it into the PyTorch model gives its logits."""
    from snntrain.models import SEWResNet, build_model
    from snntrain.models.spiking_resnet import SpikingResNet

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # on a GPU: the runs differ in the stem alone
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)

    def transformer(**config):
        return lambda backend: build_model({**config, "num_classes": 3, "in_channels": 3, "T": 2}, backend=backend)

    builds = {  # the model, its pools of a norm-neuron's spikes, the image
        "sew_resnet": (lambda backend: SEWResNet(depth=18, num_classes=3, T=2, stem="imagenet", width=4,
                                                 neuron={"type": "PLIF"}, backend=backend),
                       lambda m: [m.pool], (15, 17)),
        "spiking_resnet": (lambda backend: SpikingResNet(num_classes=3, T=2, stem="imagenet", width=4,
                                                         backend=backend), lambda m: [m.maxpool], (15, 17)),
        "spikformer": (transformer(name="spikformer", variant="spikformer_cifar10", embed_dim=16, depth=1, heads=2,
                                   patch_size=4), lambda m: list(m.stem.pools[2:]), (16, 16)),
        "spike_driven_transformer": (transformer(name="spike_driven_transformer", variant="sdt_2_512", embed_dim=16,
                                                 depth=1, pooling="0011"), lambda m: [m.stem.pools[2]], (16, 16)),
    }
    for family, (build, pools, size) in builds.items():
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1)).to(DEVICE)
        torch.manual_seed(0)
        model = build("triton").to(DEVICE)
        separate = copy.deepcopy(model)
        for pool in pools(separate):
            pool.register_forward_hook(lambda *args: None)
        calls = _fused_called(monkeypatch)
        results = []
        for m in (model, separate):
            leaf = x.clone().requires_grad_()
            logits = m(leaf)
            (logits * torch.arange(1.0, 4.0, device=DEVICE)).sum().backward()
            results.append((logits.detach(), leaf.grad, {n: p.grad for n, p in m.named_parameters()},
                            dict(m.named_buffers())))
        assert len(calls) == len(pools(model)), f"{family}: the fused op ran {len(calls)} times"
        (l0, g0, p0, b0), (l1, g1, p1, b1) = results
        assert torch.equal(l0, l1), family
        assert_close(g0, g1, **SUMMED, what=f"{family} dx")
        for name in p1:
            assert_close(p0[name], p1[name], **SUMMED, what=f"{family} {name}")
        for name in b1:
            assert torch.equal(b0[name], b1[name]), f"{family} {name}"
        torch.manual_seed(0)
        reference = build("torch").to(DEVICE)
        assert list(model.state_dict()) == list(reference.state_dict())
        reference.load_state_dict(model.state_dict())
        model.eval()
        reference.eval()
        with torch.no_grad():
            assert_close(model(x), reference(x), **SUMMED, what=f"{family} logits in eval")


def test_efficiency_report_sees_the_stems_spikes(monkeypatch):
    """With an activity counter attached (validation with the efficiency report) the stem runs its NormNeuron and
    its max-pool, so the counter sees the full-resolution spikes: the report of the Triton network equals the
    PyTorch network's."""
    from snntrain import efficiency as E
    from snntrain.models import sew_resnet18

    torch.manual_seed(0)
    net = sew_resnet18(num_classes=3, in_channels=1, T=2, width=4, stem="imagenet", backend="triton").to(DEVICE)
    net.eval()
    reference = copy.deepcopy(net)
    set_backend(reference, "torch")
    calls = _fused_called(monkeypatch)
    batches = [torch.randn(2, 1, 13, 11, generator=torch.Generator().manual_seed(i)).to(DEVICE) for i in range(2)]
    reports = []
    for m in (net, reference):
        counter = E.ActivityCounter(m, backend="torch").attach()
        with torch.inference_mode():
            for x in batches:
                m(x)
        counter.detach()
        reports.append(E.build_report(counter.unpack(counter.totals()), E.static_metrics(m)))
    assert not calls
    assert reports[0]["layers"] == reports[1]["layers"] and reports[0]["workload"] == reports[1]["workload"]
    stem = [layer for layer in reports[0]["layers"] if layer["name"] == "sn1"]
    assert len(stem) == 1 and stem[0]["firing_rate"] > 0, stem
    with torch.inference_mode():  # detached: the fused op again
        net(batches[0])
    assert len(calls) == 1


def test_other_configurations_run_separately_and_say_so_once(monkeypatch):
    """What the fused op does not take (a layer norm, another pool, a neuron of another kind, float64) runs the two
    modules one after the other, with one warning per configuration; the PyTorch backend, ``fused = False``, a hook
    and the neuron's ``store_v_seq`` run them silently."""
    monkeypatch.setattr(NN._pool_fallback, "seen", set())
    calls = _fused_called(monkeypatch)
    x = _input((2, 2, 4, 6, 5), 8, torch.float32, "nchw")

    def check(sn, pool, match, x=x):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                y = norm_neuron_max_pool(sn, pool, x)
        said = [str(w.message) for w in caught if "norm_neuron_max_pool" in str(w.message)]
        if match is None:
            assert not said, said
        else:
            assert len(said) == 1 and match in said[0], said
        assert torch.equal(y, pool(sn(x))) and not calls

    ln = NormNeuron(LayerNorm2d(4), build_neuron("LIF"), backend="triton").to(DEVICE)
    check(ln, _layers(4, "lif")[1], "LayerNorm2d as the norm")
    sn, _ = _layers(4, "lif")
    check(sn, MultiStep(SpikeMaxPool2d(2, stride=2, backend="triton")), "kernel_size=2, stride=2, padding=0")
    check(sn, MultiStep(SpikeMaxPool2d(3, stride=2, padding=1, ceil_mode=True, backend="triton")), "ceil_mode=True")
    check(sn, MultiStep(nn.MaxPool2d(3, 2, 1)), "MaxPool2d as the pool")
    alif = NormNeuron(nn.BatchNorm2d(4), build_neuron("ALIF"), backend="triton").to(DEVICE)
    check(alif, _layers(4, "lif")[1], "ALIF as the neuron")
    if DEVICE.type == "cuda":  # there the Triton neuron kernels refuse float64, fused or not, naming it
        with pytest.raises(TypeError, match="float64"):
            norm_neuron_max_pool(copy.deepcopy(sn).double(), _layers(4, "lif")[1], x.double())
    else:
        check(copy.deepcopy(sn).double(), _layers(4, "lif")[1], "torch.float64 input", x=x.double())
    pool = _layers(4, "lif")[1]
    for quiet in ("torch", "unfused", "hook", "store_v_seq"):
        q = copy.deepcopy(sn)
        if quiet == "torch":
            set_backend(q, "torch")
        elif quiet == "unfused":
            q.fused = False
        elif quiet == "hook":
            q.register_forward_hook(lambda *args: None)
        else:
            q.neuron.store_v_seq = True
        check(q, pool, None)


def test_input_errors_are_the_norm_neurons():
    sn, pool = _layers(4, "lif")
    with pytest.raises(ValueError, match="input has 3 channels"):
        norm_neuron_max_pool(sn, pool, torch.randn(2, 2, 3, 6, 6, device=DEVICE))
    with pytest.raises(ValueError, match=r"expects \[T, B, C, H, W\]"):
        norm_neuron_max_pool(sn, pool, torch.randn(2, 4, 6, 6, device=DEVICE))
    with pytest.raises(ValueError, match="T=0 expects"):
        norm_neuron_max_pool(sn, pool, torch.randn(2, 4, 6, 6, device=DEVICE), T=0)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        norm_neuron_max_pool(sn, pool, torch.randn(1, 1, 4, 1, 1, device=DEVICE))


def test_profiler_names_and_what_the_backward_keeps():
    """The eager op runs under its operators' names; the autograd graph keeps the input, not a tensor of the
    spikes' size (the positions, one byte per pooled element, stay on the op's context)."""
    sn, pool = _layers(3, "lif")
    x = _input((2, 3, 6, 6), 9, torch.bfloat16, "channels_last").requires_grad_()  # repeated over T = 3
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.profiler.profile() as prof:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = norm_neuron_max_pool(sn, pool, x, T=3)
        y.float().sum().backward()
    names = {e.name for e in prof.events()}
    assert {"snntrain::bn_neuron_pool_fwd", "snntrain::bn_neuron_pool_bwd"} <= names, sorted(names)
    assert "snntrain::max_pool_fwd" not in names and "snntrain::bn_neuron_fwd" not in names
    assert all(t.numel() <= x.numel() for t in saved), [tuple(t.shape) for t in saved]  # spikes: 3 x.numel()


def test_torch_compile_fullgraph():
    """A compiled step (which runs the norm-neuron and the max-pool operators, not the fused one) traces without graph
    breaks: its gradient and running statistics are the fused eager step's."""
    import torch._dynamo

    torch._dynamo.reset()
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    sn, pool = _layers(5, "plif", 10)
    eager_sn = copy.deepcopy(sn)
    x = _input((3, 2, 5, 7, 5), 11, torch.float32, "channels_last")
    g = _grad_of((3, 2, 5, 4, 3), 12, torch.float32)
    compiled = torch.compile(lambda t: (norm_neuron_max_pool(sn, pool, t) * g).sum(), fullgraph=True,
                             backend=backend)
    results = []
    for fn in (compiled, lambda t: (norm_neuron_max_pool(eager_sn, pool, t) * g).sum()):
        leaf = x.clone().requires_grad_()
        fn(leaf).backward()
        results.append(leaf.grad)
    assert_close(results[0], results[1], **SUMMED, what="dx")
    assert_close(sn.norm.running_var, eager_sn.norm.running_var, **RUNNING, what="running_var")
    assert int(sn.norm.num_batches_tracked) == int(eager_sn.norm.num_batches_tracked) == 1
    assert_close(sn.neuron.w.grad, eager_sn.neuron.w.grad, **SUMMED, what="PLIF w")


@pytest.mark.slow  # an export
def test_torch_export_runs_the_two_operators():
    """An exported inference program of the stem calls the norm-neuron and max-pool operators (a compiled graph does
    not take the fused one) and gives the fused eager call's output."""
    sn, pool = _layers(3, "lif", 13)

    class Stem(nn.Module):
        def __init__(self):
            super().__init__()
            self.sn, self.pool = sn, pool

        def forward(self, x):
            return norm_neuron_max_pool(self.sn, self.pool, x, T=2)

    stem = Stem().eval()
    x = _input((2, 3, 7, 6), 14, torch.float32, "nchw")
    program = torch.export.export(stem, (x,))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "snntrain.bn_neuron_pool_fwd.default" not in targets, targets
    assert {"snntrain.bn_neuron_fwd.default", "snntrain.max_pool_fwd.default"} <= targets, targets
    with torch.no_grad():
        assert torch.equal(program.module()(x), stem(x))


@pytest.mark.gpu
def test_sew_resnet_stem_on_the_gpu_and_cuda_graph():
    """The SEW-ResNet-18 stem at batch 8 (bf16, channels-last, T = 4 over one convolution output): the fused op
    equals the separate ops, and a forward plus backward is captured in a CUDA graph and replays on new input."""
    if DEVICE.type != "cuda":
        pytest.skip("needs a CUDA GPU")
    sn, pool = _layers(64, "lif", 15)
    separate = copy.deepcopy(sn)
    x = _input((8, 64, 112, 112), 16, torch.bfloat16, "channels_last")
    y1, gx1, gp1 = _step(lambda t: norm_neuron_max_pool(sn, pool, t, T=4), sn, x, 17)
    y0, gx0, gp0 = _step(lambda t: pool(separate(t, T=4)), separate, x, 17)
    assert torch.equal(y1, y0)
    assert_close(gx1, gx0, rtol=0, atol=TOLERANCES[torch.bfloat16][0] * gx0.abs().max().item(), what="dx")
    for name in gp0:
        assert_close(gp1[name], gp0[name], **SUMMED, what=name)
    leaf = x.clone().requires_grad_()
    grad = _grad_of(y1.shape, 18, torch.bfloat16).to(torch.bfloat16)

    def step():
        leaf.grad = None
        y = norm_neuron_max_pool(sn, pool, leaf, T=4)
        y.backward(grad)
        return y

    graph, y = capture_cuda_graph(step)
    new = _input((8, 64, 112, 112), 19, torch.bfloat16, "channels_last")
    with torch.no_grad():
        leaf.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():  # training mode: batch statistics, which depend on the input alone
        assert torch.equal(y, pool(separate(new, T=4)))
