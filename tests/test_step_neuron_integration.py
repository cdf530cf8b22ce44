"""A StepNeuron everywhere the built-in neurons go: torch.compile, torch.export and ONNX, NormNeuron, the
efficiency report, NIR, the model configs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from _testing import DEVICE, SUMMED, assert_close, capture_cuda_graph, count_plans
from snntrain import efficiency as E
from snntrain.kernels import step_neuron as step_kernels
from snntrain.kernels import step_neuron_tuning as step_tuning
from snntrain.kernels.op_utils import PlanCache
from snntrain.nn import ALIF, CUBALIF, QIF, ChannelwisePLIF, LayerNorm2d, MultiStep, NormNeuron, build_neuron


@pytest.mark.parametrize("per_channel", [(), ("beta", "tau")])
def test_torch_compile_fullgraph_forward_and_backward(per_channel):
    """The generated kernels' operators trace without graph breaks, also when the first call is compiled; two
    per-channel gradients come back as separate tensors (an operator's outputs may not alias)."""
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    torch._dynamo.reset()
    neuron = ALIF(tau_a=7.0, learnable=("beta", "tau"), per_channel=per_channel, channels=5,
                  backend="triton").to(DEVICE)

    def fn(x):
        return (neuron(x) * torch.linspace(0.5, 1.5, x.shape[-1], device=x.device)).sum()

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    x = (torch.randn(6, 3, 5, device=DEVICE) + 0.7)
    results = []
    for f in (compiled, fn):
        xl = x.clone().requires_grad_()
        loss = f(xl)
        results.append((loss.detach(), *torch.autograd.grad(loss, [xl, neuron.beta, neuron.tau])))
    (l1, *g1), (l0, *g0) = results
    assert_close(l1, l0, what="compiled loss")
    assert_close(g1[0], g0[0], what="compiled dx")
    for a, b in zip(g1[1:], g0[1:]):
        assert_close(a, b, **SUMMED, what="compiled dparam")


class _Net(nn.Module):
    def __init__(self, backend: str) -> None:
        super().__init__()
        self.fc = MultiStep(nn.Linear(4, 6))
        self.sn = build_neuron("Izhikevich", a=0.2, b=0.1, backend=backend)

    def forward(self, x):
        return self.sn(self.fc(x)).mean(0)


def test_torch_export_and_onnx_run_the_pytorch_loop(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    net = _Net("triton").to(DEVICE).eval()
    x = (torch.randn(5, 2, 4) * 2.0).to(DEVICE)
    with torch.no_grad():
        expected = net(x)
        program = torch.export.export(net, (x,))
        assert not any("step_neuron" in str(n.target) for n in program.graph.nodes)  # no process-local kernels
        assert torch.equal(program.module()(x), expected)
        torch.onnx.export(net, (x,), str(tmp_path / "m.onnx"), dynamo=True, opset_version=18)
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    (out,) = session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})
    assert np.abs(out - expected.cpu().numpy()).max() < 1e-5


def _bn_step_case(mode: str, dtype: torch.dtype, monkeypatch):
    """The Triton NormNeuron(BatchNorm2d, ChannelwisePLIF) and the unfused PyTorch one (norm, then the step as a
    loop) on the same input, in ``dtype`` (the PyTorch one in float64 from the same values): for each, the spikes,
    running statistics, num_batches_tracked and the gradients of the input, PLIF's per-channel w and the norm's
    weight and bias. Modes: ``train``, ``eval``, ``steps`` ([B, C, H, W] input repeated over T: a stride-0 time
    axis; momentum None), ``channels_last``, ``no_affine``, ``eval_no_affine`` (no sums to take: dL/dx from the
    backward kernel alone), ``no_running`` (track_running_stats=False: batch
    statistics in eval too), ``wide`` (16 x 16 maps: each block of the backward in one channel) and
    ``wide_channels_last`` (rows of channels)."""
    torch.manual_seed(0)
    T, B, C, H, W = 5, 3, 4, 3, 2
    if mode.startswith("wide"):
        T, B, C, H, W = 3, 2, 2, 16, 16
    steps = 3 if mode == "steps" else None
    x = torch.randn((B, C, H, W) if steps else (T, B, C, H, W), dtype=torch.float64, device=DEVICE) * 2.0 + 0.3
    x = x.to(dtype)
    if mode.endswith("channels_last"):
        x = x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
    folded = []
    fused_step = NormNeuron._fused_step
    monkeypatch.setattr(NormNeuron, "_fused_step", staticmethod(lambda *a: folded.append(1) or fused_step(*a)))
    results = []
    for backend in ("torch", "triton"):
        torch.manual_seed(1)
        norm = nn.BatchNorm2d(C, affine="no_affine" not in mode, momentum=None if mode == "steps" else 0.1,
                              track_running_stats=mode != "no_running")
        layer = NormNeuron(norm, ChannelwisePLIF(channels=C, init_tau=2.5, backend=backend), backend=backend)
        # the module in float64 for the reference, else float32 (the norm's parameters as in mixed precision)
        layer = layer.to(device=DEVICE, dtype=torch.float64 if backend == "torch" else max(dtype, torch.float32,
                                                                                           key=lambda d: d.itemsize))
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for t, lo, hi in ((norm.running_mean, -0.5, 0.5), (norm.running_var, 0.5, 2.0), (norm.weight, 1.0, 2.0),
                              (norm.bias, 0.2, 0.8)):
                if t is not None:
                    t.copy_(torch.empty(C, dtype=torch.float64).uniform_(lo, hi, generator=gen))
        if mode.startswith("eval") or mode == "no_running":
            layer.eval()
        xl = (x.double() if backend == "torch" else x.clone()).requires_grad_()
        y = layer(xl, steps) if steps else layer(xl)  # (the repeat count positionally)
        leaves = [xl, layer.neuron.w] + ([norm.weight, norm.bias] if norm.affine else [])
        g = torch.linspace(-1.0, 1.0, y.numel(), dtype=torch.float64, device=DEVICE).view_as(y)
        stats = [norm.running_mean.clone(), norm.running_var.clone()] if norm.track_running_stats else []
        results.append((y, stats, int(norm.num_batches_tracked or 0),
                        torch.autograd.grad((y * g.to(y.dtype)).sum(), leaves)))
    assert folded == [1]  # the Triton layer folded the norm into the neuron's kernels; the PyTorch one did not
    return results


@pytest.mark.parametrize("mode", ["train", "eval", "steps", "channels_last", "no_affine", "no_running", "wide",
                                  "wide_channels_last"])
def test_batch_norm_folded_into_a_step_neuron_equals_the_norm_then_the_neuron(mode, monkeypatch):
    """NormNeuron(BatchNorm2d, StepNeuron) under Triton folds the norm into the neuron's generated kernels; float64
    against the unfused PyTorch path: the same spikes, running statistics and gradients (input, the norm's weight
    and bias, the neuron's per-channel parameter), in training (batch statistics) and in eval mode."""
    (y0, s0, n0, g0), (y1, s1, n1, g1) = _bn_step_case(mode, torch.float64, monkeypatch)
    assert 0 < y0.sum() < y0.numel()
    assert torch.equal(y1, y0.to(y1.dtype)) or y1.dtype != torch.float64
    for a, b, what in zip(s1, s0, ("running mean", "running var")):
        assert_close(a, b, what=what)
    assert n1 == n0
    for name, a, b in zip(["x", "w", "weight", "bias"], g1, g0):
        assert_close(a, b, rtol=1e-9, atol=1e-11, what=f"dL/d{name} (per-channel sums in another order)")


@pytest.mark.parametrize("mode", ["train", "eval", "steps", "channels_last", "no_affine", "eval_no_affine",
                                  "no_running", "wide", "wide_channels_last"])
def test_batch_norm_folded_into_a_step_neuron_fp32_kernels(mode, monkeypatch):
    """The float32 path runs the kernels end to end (the statistics kernel with the running statistics' update,
    the generated kernels' per-channel sums, dL/dx finished in one elementwise pass, summed over T for a stride-0
    time axis): the same spikes as the float64 reference on the same values, the running statistics and the
    gradients within float32 rounding."""
    (y0, s0, n0, g0), (y1, s1, n1, g1) = _bn_step_case(mode, torch.float32, monkeypatch)
    assert 0 < y0.sum() < y0.numel()
    assert y1.dtype == torch.float32 and torch.equal(y1, y0.float())
    if mode.endswith("channels_last"):
        assert y1.stride()[2] == 1 and g1[0].stride()[2] == 1  # spikes and dL/dx laid out like the input
    for a, b, what in zip(s1, s0, ("running mean", "running var")):
        assert_close(a.double(), b, rtol=1e-5, atol=1e-6, what=what)
    assert n1 == n0
    for name, a, b in zip(["x", "w", "weight", "bias"], g1, g0):
        assert a.dtype == torch.float32
        # 1e-4 of the largest: the norm's backward over C cancels terms (one input of the 16 x 16 maps differs by
        # 5e-5 of the largest on an H200)
        assert_close(a.double(), b, rtol=1e-4, atol=1e-4 * float(b.abs().max()), what=f"dL/d{name}")


@pytest.mark.parametrize("mode, csum", [("wide", "CSUM_PROGRAM"), ("wide_channels_last", "CSUM_ROWS"),
                                        ("train", "CSUM_NEURON")])
def test_batch_norm_sums_finished_in_the_backward_kernel_equal_the_separate_reduction(mode, csum, monkeypatch):
    """Eager calls: the generated backward's last program to store its part of a channel's sums adds up the batch
    norm's two sums and PLIF's per-channel dL/dw (no reduction launched after it; bn_input_grad reads them). The
    same dL/dx, dL/dw, dL/dweight and dL/dbias as one reduction after the kernel (traced calls' plans; here forced
    with a limit of 0), and as the float64 PyTorch reference, in float32 kernels."""
    from snntrain.kernels import neuron_codegen

    runs = {}
    for finish in (True, False):
        monkeypatch.setattr(step_kernels, "_BWD_PLANS", PlanCache())  # the plan made here
        if not finish:
            monkeypatch.setattr(step_tuning, "FINISH_MAX_VALUES", 0)
        chosen, pick = [], step_kernels._channel_sums
        monkeypatch.setattr(step_kernels, "_channel_sums", lambda *a: chosen.append(pick(*a)[0]) or pick(*a))
        (_y0, _s0, _n0, ref), (_y1, _s1, _n1, runs[finish]) = _bn_step_case(mode, torch.float32, monkeypatch)
        assert chosen == [getattr(neuron_codegen, csum)]
        assert [plan.finish for plan in step_kernels._BWD_PLANS.values()] == [finish]
        monkeypatch.undo()
    for name, a, b, r in zip(["x", "w", "weight", "bias"], runs[True], runs[False], ref):
        scale = float(r.abs().max())
        # the two ways add the same partial sums in another order: float32 rounding apart
        assert_close(a, b, rtol=1e-5, atol=1e-6 * scale, what=f"dL/d{name}, finished in the kernel vs reduced after")
        assert_close(a.double(), r, rtol=1e-4, atol=1e-4 * scale, what=f"dL/d{name} vs the reference")


def _ln_step_case(mode: str, dtype: torch.dtype, monkeypatch):
    """The Triton NormNeuron(LayerNorm2d, ALIF) and the unfused PyTorch one (the norm, then the step as a loop) on
    the same input, in ``dtype`` (the PyTorch one in float64 from the same values): for each, the spikes and the
    gradients of the input, the norm's weight and bias and the neuron's learnable ``beta`` (per channel) and
    ``tau`` (one value). Modes: ``train``, ``channels_last``, ``steps`` ([B, C, H, W] input repeated over T: a
    stride-0 time axis, statistics per (b, h, w)), ``steps_channels_last``, ``no_affine``, ``wide`` (16 x 16
    maps: several position tiles per sample), ``chunks`` (T = 10: the backward recomputes from a checkpoint),
    ``hwbc`` (dense in the order T, H, W, B, C: read in place by the tile kernels) and the three-pass path that
    channels beyond the tile kernels' limit take (the limit lowered below C): ``fallback`` (in ``hwbc``, whose
    neuron numbering would put the positions out of the statistics' order, the input is copied once),
    ``fallback_steps`` and ``fallback_chunks``. Asserts which path ran: the statistics pass only in the three-pass
    one."""
    torch.manual_seed(0)
    T, B, C, H, W = 5, 3, 4, 3, 2
    if mode == "wide":
        T, B, C, H, W = 3, 2, 2, 16, 16
    if mode.endswith("chunks"):
        T, B, C, H, W = 10, 1, 3, 2, 2
    fallback = mode.startswith("fallback")
    if fallback:
        monkeypatch.setattr(step_tuning, "LN_TILE_MAX_C", 2)
    stats_calls = []
    stats = step_kernels.layer_norm_stats
    monkeypatch.setattr(step_kernels, "layer_norm_stats", lambda *a: stats_calls.append(1) or stats(*a))
    steps = 3 if mode.startswith("steps") or mode == "fallback_steps" else None
    # drawn on the CPU: the same values on every device (the cases are chosen so that every gradient is nonzero)
    x = torch.randn((B, C, H, W) if steps else (T, B, C, H, W), dtype=torch.float64) * 2.0 + 0.3
    x = x.to(device=DEVICE, dtype=dtype)
    if mode.endswith("channels_last"):
        x = x.movedim(-3, -1).contiguous().movedim(-1, -3)
    if mode in ("hwbc", "fallback"):
        x = x.permute(0, 3, 4, 1, 2).contiguous().permute(0, 3, 4, 1, 2)
    folded = []
    fused_step = NormNeuron._fused_step
    monkeypatch.setattr(NormNeuron, "_fused_step", staticmethod(lambda *a: folded.append(1) or fused_step(*a)))
    results = []
    for backend in ("torch", "triton"):
        norm = LayerNorm2d(C, affine=mode != "no_affine", backend="torch")
        neuron = ALIF(tau=2.5, beta=0.3, learnable=("beta", "tau"), per_channel=("beta",), channels=C,
                      backend=backend)
        layer = NormNeuron(norm, neuron, backend=backend)
        layer = layer.to(device=DEVICE, dtype=torch.float64 if backend == "torch" else max(dtype, torch.float32,
                                                                                           key=lambda d: d.itemsize))
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            neuron.beta.copy_(torch.empty(C, dtype=torch.float64).uniform_(0.1, 0.5, generator=gen))
            if norm.affine:
                norm.weight.copy_(torch.empty(C, dtype=torch.float64).uniform_(1.0, 2.0, generator=gen))
                norm.bias.copy_(torch.empty(C, dtype=torch.float64).uniform_(0.2, 0.8, generator=gen))
        xl = (x.double() if backend == "torch" else x.clone()).requires_grad_()
        y = layer(xl, steps) if steps else layer(xl)
        leaves = [xl, neuron.beta, neuron.tau] + ([norm.weight, norm.bias] if norm.affine else [])
        g = torch.linspace(-1.0, 1.0, y.numel(), dtype=torch.float64, device=DEVICE).view_as(y)
        results.append((y, torch.autograd.grad((y * g.to(y.dtype)).sum(), leaves)))
    assert folded == [1]  # the Triton layer folded the norm into the neuron's kernels; the PyTorch one did not
    assert stats_calls == ([1] if fallback else [])  # the statistics pass: only on the three-pass path
    return results


_LN_NAMES = ["x", "beta", "tau", "weight", "bias"]
_LN_MODES = ["train", "channels_last", "steps", "steps_channels_last", "no_affine", "wide", "chunks", "hwbc",
             "fallback", "fallback_steps", "fallback_chunks"]


@pytest.mark.parametrize("mode", _LN_MODES)
def test_layer_norm_folded_into_a_step_neuron_equals_the_norm_then_the_neuron(mode, monkeypatch):
    """NormNeuron(LayerNorm2d, StepNeuron) under Triton folds the norm into the neuron's generated kernels (the
    statistics per position, normalised as the kernels read); float64 against the unfused PyTorch path: the same
    spikes and gradients (input, the norm's weight and bias, the neuron's per-channel and scalar parameters)."""
    (y0, g0), (y1, g1) = _ln_step_case(mode, torch.float64, monkeypatch)
    assert 0 < y0.sum() < y0.numel()
    assert y1.dtype == torch.float64 and torch.equal(y1, y0)
    assert len(g1) == len(g0)
    for name, a, b in zip(_LN_NAMES, g1, g0):
        assert a.shape == b.shape and float(b.abs().max()) > 0, name
        assert_close(a, b, rtol=1e-9, atol=1e-11, what=f"dL/d{name} (sums in another order)")


@pytest.mark.parametrize("mode", _LN_MODES)
def test_layer_norm_folded_into_a_step_neuron_fp32_kernels(mode, monkeypatch):
    """The float32 path runs the kernels end to end (the layer norm's statistics kernel, the generated kernels
    normalising per position, dL/dx, dW and dB in one pass of the layer norm's backward kernel, dL/dy summed over T
    first for a stride-0 time axis): the same spikes as the float64 reference on the same values, the gradients
    within float32 rounding, spikes and dL/dx laid out like the input."""
    (y0, g0), (y1, g1) = _ln_step_case(mode, torch.float32, monkeypatch)
    assert 0 < y0.sum() < y0.numel()
    assert y1.dtype == torch.float32 and torch.equal(y1, y0.float())
    if mode.endswith("channels_last"):
        assert y1.stride()[2] == 1 and g1[0].stride()[-3] == 1
    for name, a, b in zip(_LN_NAMES, g1, g0):
        assert a.dtype == torch.float32
        # 1e-4 of the largest: the norm's backward over C cancels terms (one input of the 16 x 16 maps differs by
        # 5e-5 of the largest on an H200)
        assert_close(a.double(), b, rtol=1e-4, atol=1e-4 * float(b.abs().max()), what=f"dL/d{name}")


def test_layer_norm_tile_plans_are_reused_for_one_layout_and_made_for_another(monkeypatch):
    """The layer-norm tile kernels' eager launch plans: made once per layout (a second call on the same layout makes
    none, another shape or a channels-last map makes new ones), and every call equals the unfused PyTorch path."""
    made = count_plans(monkeypatch, step_kernels, ("_ln_tile_fwd_plan", "_ln_tile_bwd_plan"),
                       ("_LN_FWD_PLANS", "_LN_BWD_PLANS"))
    C = 3

    def call(x):
        results = []
        for backend in ("torch", "triton"):
            layer = NormNeuron(LayerNorm2d(C, backend="torch"), ALIF(beta=0.3, v_threshold=0.5, backend=backend),
                               backend=backend).to(device=DEVICE, dtype=torch.float64)
            xl = x.clone().requires_grad_()
            y = layer(xl)
            (gx,) = torch.autograd.grad((y * torch.linspace(-1.0, 1.0, y.numel(), dtype=y.dtype,
                                                            device=DEVICE).view_as(y)).sum(), xl)
            results.append((y, gx))
        (y_ref, g_ref), (y, g) = results
        assert torch.equal(y, y_ref) and 0 < y.sum() < y.numel()
        assert_close(g, g_ref, rtol=1e-9, atol=1e-11, what="dL/dx (sums in another order)")
        return len(made)

    torch.manual_seed(4)
    x = torch.randn(4, 2, C, 3, 2, dtype=torch.float64, device=DEVICE) * 2.0 + 0.3
    assert call(x) == 2 and made == ["_ln_tile_fwd_plan", "_ln_tile_bwd_plan"]
    assert call(x * 0.5 + 0.2) == 2  # the same layout: both plans found
    assert call(x[:, :, :, :2]) == 4  # another shape
    assert call(x.movedim(2, -1).contiguous().movedim(-1, 2)) == 6  # channels-last
    assert call(x) == 6


@pytest.mark.parametrize("mode", ["train", "steps", "channels_last"])
def test_layer_norm_folded_into_a_step_neuron_bf16_equals_fp32_on_the_same_values(mode):
    """bf16 input runs the same fp32 arithmetic as fp32 input holding the same values (the statistics, the
    normalised input, the scan, the neuron's parameter sums): the same spikes and neuron parameter gradients; dL/dx
    and the norm's dW, dB differ by the rounding of dL/dy to bf16 before the finishing pass (and dL/dx's own)."""
    torch.manual_seed(3)
    T, B, C, H, W = 4, 2, 3, 4, 4
    steps = 3 if mode == "steps" else None
    x = (torch.randn((B, C, H, W) if steps else (T, B, C, H, W), device=DEVICE) * 2.0 + 0.3).to(torch.bfloat16)
    if mode == "channels_last":
        x = x.movedim(-3, -1).contiguous().movedim(-1, -3)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        norm = LayerNorm2d(C)
        neuron = ChannelwisePLIF(channels=C, init_tau=2.5, backend="triton")
        layer = NormNeuron(norm, neuron, backend="triton").to(DEVICE)
        with torch.no_grad():
            norm.weight.copy_(torch.tensor([1.2, 1.6, 0.8]))
            norm.bias.copy_(torch.tensor([0.5, 0.3, 0.7]))
        xl = x.to(dtype).requires_grad_()
        y = layer(xl, steps) if steps else layer(xl)
        g = torch.linspace(-1.0, 1.0, y.numel(), device=DEVICE).view_as(y).bfloat16().float()  # dL/dS exact in bf16
        out.append((y, torch.autograd.grad((y.float() * g).sum(), [xl, neuron.w, norm.weight, norm.bias])))
    (y0, g0), (y1, g1) = out
    assert y1.dtype == torch.bfloat16 and torch.equal(y1.float(), y0) and 0 < y0.sum() < y0.numel()
    assert_close(g1[1], g0[1], rtol=1e-5, atol=1e-6, what="dL/dw")
    for name, a, b in zip(["x", "weight", "bias"], (g1[0].float(), *g1[2:]), (g0[0], *g0[2:])):
        assert_close(a, b, rtol=2e-2, atol=2e-2 * float(b.abs().max()), what=f"dL/d{name}")
    assert g1[0].dtype == torch.bfloat16


def test_efficiency_report_counts_step_neuron_spikes():
    net = nn.Sequential(MultiStep(nn.Linear(4, 8)), ALIF(backend="torch"), MultiStep(nn.Linear(8, 2)))
    counter = E.ActivityCounter(net, backend="torch").attach()
    x = torch.randn(6, 3, 4) * 3.0
    with torch.no_grad():
        net(x)
        counter.detach()
        spikes = net[1](net[0](x))
    totals = counter.unpack(counter.totals())
    (layer,) = totals["spiking"].values()
    assert layer["spikes"] == float(spikes.sum()) > 0 and layer["neuron_steps"] == spikes.numel()
    assert totals["connections"]["2.0"]["ac"] > 0  # the ALIF's spikes drive the next layer's accumulates


def test_nir_maps_lif_like_families_and_refuses_the_others_with_the_reason():
    nir = pytest.importorskip("nir")
    from snntrain.nir import NIRError, neuron_to_nir

    plif = ChannelwisePLIF(channels=3, init_tau=2.0)
    with torch.no_grad():
        plif.w.copy_(torch.tensor([0.0, 1.0, -1.0]))
    node = neuron_to_nir(plif, (3, 2, 2), dt=1e-3)
    assert isinstance(node, nir.LIF)
    assert np.allclose(node.tau[:, 0, 0], 1e-3 / torch.sigmoid(plif.w.detach()).double().numpy())
    with pytest.raises(NIRError, match="QIF integrates a quadratic function"):
        neuron_to_nir(QIF(), (3,), dt=1e-3)
    with pytest.raises(NIRError, match="soft reset"):
        neuron_to_nir(CUBALIF(v_reset=None), (3,), dt=1e-3)
    # CUBALIF as CubaLIF: NIR's equations stepped by forward Euler fire the same spikes
    cuba = CUBALIF(c_decay=0.6, v_decay=0.8, v_threshold=0.7, backend="torch")
    dt = 1e-3
    node = neuron_to_nir(cuba, (5,), dt=dt, name="sn")
    assert isinstance(node, nir.CubaLIF)
    x = torch.randn(12, 1, 5, dtype=torch.float64) * 0.8 + 0.2
    y = cuba(x)[:, 0].numpy()
    i = v = np.zeros(5)
    for t in range(12):
        i = i + dt / node.tau_syn * (-i + node.w_in * x[t, 0].numpy())
        v = v + dt / node.tau_mem * (node.v_leak - v + node.r * i)
        s = (v >= node.v_threshold).astype(float)
        v = np.where(s > 0, node.v_reset, v)
        assert np.array_equal(s, y[t])
    assert y.sum() > 0


def test_model_config_builds_every_family(compose_run):
    """``model.neuron.type=NAME`` reaches the families, with the channel count at each norm-neuron site."""
    from snntrain.models import build_model

    for name in ("ALIF", "ChannelwisePLIF"):
        cfg = compose_run(None, "debug=tiny", f"model.neuron.type={name}")
        model = build_model(cfg.model, backend="torch")
        neurons = [m for m in model.modules() if type(m).__name__ == name]
        assert neurons, name
        if name == "ChannelwisePLIF":
            sizes = {int(m.w.numel()) for m in neurons}
            assert len(sizes) > 1 or sizes != {1}
        out = model(torch.randn(2, cfg.model.in_channels, 16, 16))
        assert out.shape[0] == 2 and torch.isfinite(out).all()


def test_benchmark_script_smoke(tmp_path):
    """scripts/bench_neurons.py --suite families / api-lif --smoke: every provider runs and writes its JSON line."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("spikingjelly")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    for suite in (["families", "--family", "QIF"], ["api-lif"]):
        subprocess.run([sys.executable, str(root / "scripts" / "bench_neurons.py"), "--out", str(tmp_path), "--suite",
                        *suite, "--smoke"], check=True, env=env, capture_output=True, timeout=600)
    rows = [json.loads(line) for name in ("bench_neuron_families", "bench_neuron_api_lif")
            for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    got = {(r["bench"], r["provider"], r["dtype"], r["T"]) for r in rows if "ms" in r}
    errors = [(r["provider"], r["dtype"], r["T"], r["error"]) for r in rows if "error" in r]
    for provider in ("ours", "sj-node", "sj-flexsn"):
        assert ("families", provider, "fp32", 9) in got, (provider, errors)
    for bench in ("api_lif", "bn_api_lif", "ln_api_lif"):
        assert (bench, "api", "bf16", 9) in got and (bench, "hand-written", "bf16", 9) in got
    ours = {r["T"]: r["output_sum"] for r in rows if r["provider"] == "ours" and r["dtype"] == "fp32"}
    node = {r["T"]: r["output_sum"] for r in rows if r["provider"] == "sj-node" and r["dtype"] == "fp32"}
    assert ours == node  # the same neuron: the same spikes


@pytest.mark.gpu
def test_cuda_graph_capture_of_a_training_step():
    """A step with a generated neuron (per-channel learnable parameter, initial state) can be captured: nothing
    synchronises with the host."""
    neuron = ALIF(learnable=("beta",), per_channel=("beta",), channels=4, backend="triton").to(DEVICE)
    x = torch.randn(12, 2, 4, 9, device=DEVICE, requires_grad=True)
    v0 = torch.zeros(2, 4, 9, device=DEVICE, requires_grad=True)

    def step():
        x.grad = v0.grad = neuron.beta.grad = None
        y, finals = neuron(x * 2.0, init={"v": v0}, return_state=True)
        (y.sum() + finals["a"].sum()).backward()

    step()
    eager = [t.grad.clone() for t in (x, v0, neuron.beta)]
    graph, _ = capture_cuda_graph(step)
    graph.replay()
    torch.cuda.synchronize()
    for t, e in zip((x, v0, neuron.beta), eager):
        assert torch.equal(t.grad, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_folded_into_a_step_neuron_16_and_32_bit(dtype):
    """fp32 statistics (the statistics kernel, of the input as it is) and the fp32 normalised input inside
    the kernels, where the unfused path rounds the norm's output to the input dtype: the same running statistics,
    nearly every spike the same, gradients finite."""
    torch.manual_seed(2)
    x = (torch.randn(4, 8, 3, 6, 6, device=DEVICE) * 2.0 + 0.3).to(dtype)
    out = []
    for backend in ("torch", "triton"):
        torch.manual_seed(1)
        layer = NormNeuron(nn.BatchNorm2d(3), ALIF(backend=backend), backend=backend).to(DEVICE)
        xl = x.clone().requires_grad_()
        y = layer(xl)
        (gx,) = torch.autograd.grad(y.float().sum(), xl)
        out.append((y, layer.norm.running_mean, layer.norm.running_var, gx))
    (y0, rm0, rv0, _), (y1, rm1, rv1, gx1) = out
    assert y1.dtype == dtype and (y1 != y0).float().mean() < 0.01
    assert_close(rm1, rm0, rtol=1e-4, atol=1e-5, what="running mean")
    assert_close(rv1, rv0, rtol=1e-4, atol=1e-5, what="running var")
    assert torch.isfinite(gx1).all() and gx1.abs().sum() > 0


@pytest.mark.parametrize("mode", ["train", "steps", "channels_last", "eval"])
def test_batch_norm_folded_into_a_step_neuron_bf16_equals_fp32_on_the_same_values(mode):
    """bf16 input runs the same fp32 arithmetic as fp32 input holding the same values (statistics, the normalised
    input, the scan, the per-channel sums): the same spikes, running statistics and parameter gradients; dL/dx
    differs by its rounding to bf16 (and that of dL/dy before the finishing pass)."""
    torch.manual_seed(3)
    T, B, C, H, W = 4, 2, 3, 4, 4
    steps = 3 if mode == "steps" else None
    x = (torch.randn((B, C, H, W) if steps else (T, B, C, H, W), device=DEVICE) * 2.0 + 0.3).to(torch.bfloat16)
    if mode == "channels_last":
        x = x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(1)
        norm = nn.BatchNorm2d(C)
        layer = NormNeuron(norm, ChannelwisePLIF(channels=C, init_tau=2.5, backend="triton"), backend="triton")
        layer = layer.to(DEVICE)
        with torch.no_grad():
            norm.weight.copy_(torch.tensor([1.2, 1.6, 0.8]))
            norm.bias.copy_(torch.tensor([0.5, 0.3, 0.7]))
        if mode == "eval":
            layer.eval()
        xl = x.to(dtype).requires_grad_()
        y = layer(xl, steps) if steps else layer(xl)
        g = torch.linspace(-1.0, 1.0, y.numel(), device=DEVICE).view_as(y).bfloat16().float()  # dL/dS exact in bf16
        grads = torch.autograd.grad((y.float() * g).sum(), [xl, layer.neuron.w, norm.weight, norm.bias])
        out.append((y, norm.running_mean.clone(), norm.running_var.clone(), grads))
    (y0, rm0, rv0, g0), (y1, rm1, rv1, g1) = out
    assert y1.dtype == torch.bfloat16 and torch.equal(y1.float(), y0) and 0 < y0.sum() < y0.numel()
    assert torch.equal(rm1, rm0) and torch.equal(rv1, rv0)
    for name, a, b in zip(["w", "weight", "bias"], g1[1:], g0[1:]):
        assert_close(a, b, rtol=1e-5, atol=1e-6, what=f"dL/d{name}")
    assert g1[0].dtype == torch.bfloat16
    assert_close(g1[0].float(), g0[0], rtol=2e-2, atol=2e-2 * float(g0[0].abs().max()), what="dL/dx")
