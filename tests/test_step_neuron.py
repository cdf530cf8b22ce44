"""StepNeuron: a neuron from its Python step, generated into Triton kernels (snntrain.kernels.step_neuron).

The reference is the same step run as a PyTorch loop (``backend="torch"``), differentiated by autograd. In
float64 the generated backward (derived on the traced graph) must give the same gradients for the input,
the initial states and every learnable parameter, scalar or per channel; in float32 and 16-bit input the
spikes are identical and the gradients within the per-dtype table. The API's LIF equals the hand-written
LIF kernel.
"""

from __future__ import annotations

import pytest
import torch

from _testing import DEVICE, SUMMED, assert_close, count_plans
from snntrain.kernels import neuron_jit
from snntrain.kernels.op_utils import PlanCache
from snntrain.nn import LIF, NEURONS, StepNeuron, UnsupportedOp, build_neuron, register_neuron, spike


class AdaptiveLIF(StepNeuron):
    """Two states, a spike-triggered threshold, hard reset."""

    states = {"v": 0.0, "a": 0.0}
    defaults = {"tau": 2.0, "tau_a": 5.0, "beta": 0.3, "v_threshold": 1.0}

    def step(self, x, v, a, tau, tau_a, beta, v_threshold):
        h = v + (x - v) / tau
        s = self.heaviside(h - (v_threshold + beta * a))
        return s, h * (1.0 - s), a - a / tau_a + s


class KitchenSink(StepNeuron):
    """Every supported operation with a derivative, so that each rule is checked against autograd."""

    states = {"v": "v0", "u": 0.25}
    defaults = {"k": 0.7, "g": 1.3, "v0": 0.1, "v_threshold": 0.8}

    def step(self, x, v, u, k, g, v0, v_threshold):
        h = v * k + torch.sigmoid(x) * g - torch.tanh(u) * 0.5 + torch.exp(-torch.abs(v)) * 0.1
        h = h + torch.log(1.0 + u * u) * 0.2 + torch.sqrt(1.0 + x * x) * 0.05 - (0.5 ** x) * 0.01
        h = torch.where(x > 0.0, h, h * 0.9) + torch.clamp(x, -0.5, 0.5) * 0.1
        h = torch.minimum(h, 3.0 + u) + torch.maximum(u, -1.0 + x * 0.0) * 0.1 + torch.relu(x - 1.0) ** 2 * 0.01
        s = spike(h - v_threshold, "atan", 2.0)
        v_new = h - s.detach() * v_threshold + v0 * s
        u_new = u * 0.8 + s - torch.floor(u) * 0.0 + (u / g)
        return s, v_new, u_new


def _grads(neuron, x, init, backend, params, weights):
    neuron.backend = backend
    xl = x.detach().clone().requires_grad_()
    il = {k: v.detach().clone().requires_grad_() for k, v in init.items()}
    y, finals = neuron(xl, init=il or None, return_state=True)
    loss = (y * weights[0]).sum() + sum((finals[n] * w).sum() for n, w in zip(neuron.state_names, weights[1:]))
    tensors = [xl, *il.values(), *params]
    return y, finals, torch.autograd.grad(loss, tensors, allow_unused=True)


def _weights(neuron, x, seed):
    g = torch.Generator().manual_seed(seed)
    shape = tuple(x.shape)
    return [torch.randn(shape, generator=g, dtype=x.dtype).to(x.device)] + \
        [torch.randn(shape[1:], generator=g, dtype=torch.float64).to(x.device) for _ in neuron.state_names]


@pytest.mark.parametrize("T", [3, 11])
@pytest.mark.parametrize("cls, learnable, per_channel", [
    (AdaptiveLIF, ("beta",), ("tau",)),
    (AdaptiveLIF, ("tau", "tau_a", "beta", "v_threshold"), ()),
    (KitchenSink, ("k", "g", "v0"), ("g",)),
])
def test_gradients_equal_autograd_through_the_reference_fp64(T, cls, learnable, per_channel):
    torch.manual_seed(0)
    C = 3
    neuron = cls(learnable=learnable, per_channel=per_channel, channels=C).to(DEVICE)
    x = (torch.randn(T, 2, C, 5, dtype=torch.float64) * 1.5 + 0.6).to(DEVICE)
    init = {"v": torch.randn(2, C, 5, dtype=torch.float64, device=DEVICE) * 0.5}
    params = [getattr(neuron, n) for n in learnable]
    weights = _weights(neuron, x, 1)
    y_ref, f_ref, g_ref = _grads(neuron, x, init, "torch", params, weights)
    y, f, g = _grads(neuron, x, init, "triton", params, weights)
    assert 0 < y_ref.sum() < y_ref.numel()  # some neurons fire, not all
    assert torch.equal(y, y_ref)
    for n in neuron.state_names:
        assert_close(f[n], f_ref[n], what=f"final {n}")
    names = ["x", "v_init", *learnable]
    for name, a, b in zip(names, g, g_ref):
        assert_close(a, b, what=f"dL/d{name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_16_and_32_bit_input_match_the_reference(dtype):
    torch.manual_seed(1)
    neuron = AdaptiveLIF(learnable=("beta",), per_channel=("tau_a",), channels=4).to(DEVICE)
    x = (torch.randn(10, 3, 4, 7) * 1.5 + 0.6).to(device=DEVICE, dtype=dtype)
    weights = _weights(neuron, x, 2)
    y_ref, f_ref, g_ref = _grads(neuron, x, {}, "torch", [neuron.beta], weights)
    y, f, g = _grads(neuron, x, {}, "triton", [neuron.beta], weights)
    assert y.dtype == dtype and torch.equal(y, y_ref)
    assert_close(f["v"], f_ref["v"], what="final v")
    assert_close(g[0], g_ref[0], what="dL/dx")
    assert_close(g[1], g_ref[1], **SUMMED, what="dL/dbeta (a sum over every neuron and step)")


class ApiLIF(StepNeuron):
    states = {"v": "v_reset"}
    defaults = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}

    def step(self, x, v, tau, v_threshold, v_reset):
        h = v + (x - (v - v_reset)) * (1.0 / tau)
        s = self.heaviside(h - v_threshold)
        return s, h - h * s + v_reset * s


@pytest.mark.parametrize("T", [4, 13])
def test_api_lif_equals_the_hand_written_lif_kernel(T):
    torch.manual_seed(2)
    x = (torch.randn(T, 2, 3, 9) * 1.5 + 0.6).to(DEVICE)
    ours = ApiLIF(tau=2.0, surrogate="atan", backend="triton")
    builtin = LIF(tau=2.0, surrogate="atan", backend="triton")
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, st = ours(xa, return_state=True)
    yb, vb = builtin(xb, return_state=True)
    assert torch.equal(ya, yb)
    assert_close(st["v"], vb, rtol=1e-6, atol=1e-6, what="final membrane")
    g = torch.randn_like(ya)
    (ga,) = torch.autograd.grad((ya * g).sum(), xa)
    (gb,) = torch.autograd.grad((yb * g).sum(), xb)
    assert_close(ga, gb, **SUMMED, what="dL/dx (the hand-written kernel's surrogate uses fast divisions)")


def test_eager_plans_are_reused_for_one_layout_and_made_for_another(monkeypatch):
    """An eager call makes the forward's and the backward's launch plans of its layout once: a second identical call
    makes none, another shape, stride order or dtype makes new ones, and every call equals the PyTorch loop."""
    from snntrain.kernels import step_neuron

    made = count_plans(monkeypatch, step_neuron, ("_fwd_plan", "_bwd_plan"), ("_FWD_PLANS", "_BWD_PLANS"))
    neuron = ApiLIF(tau=2.0, backend="triton")
    torch.manual_seed(3)

    def call(x):
        results = []
        for backend in ("torch", "triton"):
            neuron.backend = backend
            xl = x.detach().clone().requires_grad_()
            y = neuron(xl)
            (y * torch.arange(y.numel(), device=DEVICE).reshape(y.shape).sin()).sum().backward()
            results.append((y, xl.grad))
        (y_ref, g_ref), (y, g) = results
        assert torch.equal(y, y_ref) and 0 < y.sum() < y.numel()
        assert_close(g, g_ref, what="dL/dx")
        return len(made)

    x = (torch.randn(4, 2, 3, 5) * 1.5 + 0.6).to(DEVICE)
    assert call(x) == 2 and made == ["_fwd_plan", "_bwd_plan"]
    assert call(x + 0.25) == 2  # the same layout: both plans found
    assert call(x[:, :, :, :4]) == 4  # another shape
    assert call(x.transpose(2, 3).contiguous().transpose(2, 3)) == 6  # the same shape, other strides
    assert call(x.to(torch.bfloat16)) == 8  # another dtype
    assert call(x) == 8  # the first layout's plans are still there
    assert len(step_neuron._FWD_PLANS) == len(step_neuron._BWD_PLANS) == 4


def test_expanded_input_and_gradient_and_frozen_learnable_parameter():
    neuron = AdaptiveLIF(learnable=("beta",), backend="triton").to(DEVICE)
    x = (torch.randn(9, 1, 6, dtype=torch.float64) + 0.8).to(DEVICE).requires_grad_()
    xe = x.expand(9, 4, 6)  # stride-0 batch: read in place
    neuron.beta.requires_grad_(False)
    (gx,) = torch.autograd.grad(neuron(xe).sum(), x)  # an expanded dL/dy
    neuron.backend = "torch"
    (gx_ref,) = torch.autograd.grad(neuron(xe).sum(), x)
    assert_close(gx, gx_ref)


def test_generated_source_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("SNNTRAIN_CACHE_DIR", str(tmp_path))

    class Unique(StepNeuron):
        states = {"v": 0.0}
        defaults = {"tau": 2.0}

        def step(self, x, v, tau):
            h = v + (x - v) / tau + 0.123456789  # a graph no other test builds
            s = self.heaviside(h - 1.0)
            return s, h * (1.0 - s)

    n = Unique(backend="triton")
    key = n.kernel_key()
    compiled = neuron_jit.lookup(key)
    assert compiled.path.parent == tmp_path / "neurons" and compiled.path.exists()
    assert "def fwd_kernel(" in compiled.path.read_text() and "def bwd_kernel(" in compiled.path.read_text()
    assert Unique(backend="triton").kernel_key() == key  # the same graph, the same kernels
    assert n(torch.ones(2, 3, device=DEVICE) * 2.0).tolist() == [[1.0] * 3, [1.0] * 3]  # H = 1.12 each step


# ---------------------------------------------------------------- bad input


def test_unsupported_operation_is_refused_at_build_naming_it():
    class Sine(StepNeuron):
        states = {"v": 0.0}
        defaults = {}

        def step(self, x, v):
            h = v + torch.sin(x)
            return self.heaviside(h - 1.0), h

    with pytest.raises(UnsupportedOp, match=r"torch\.sin"):
        Sine()
    with pytest.warns(UserWarning, match=r"torch\.sin"):
        n = Sine(unsupported="torch", backend="triton")
    x = torch.randn(3, 2, 4, device=DEVICE)
    assert torch.equal(n(x), Sine(unsupported="torch", backend="torch")(x))  # the PyTorch loop


def test_value_dependent_python_branch_is_refused():
    class Branchy(StepNeuron):
        states = {"v": 0.0}
        defaults = {}

        def step(self, x, v):
            if v > 1.0:
                v = v * 0.0
            return self.heaviside(v + x - 1.0), v + x

    with pytest.raises(UnsupportedOp, match="torch.where"):
        Branchy()


def test_bad_parameters_and_shapes_are_named():
    with pytest.raises(ValueError, match=r"no parameter 'taus'.*valid parameters: tau, tau_a, beta, v_threshold"):
        AdaptiveLIF(taus=3.0)
    with pytest.raises(ValueError, match=r"learnable names 'gamma'.*valid parameters"):
        AdaptiveLIF(learnable=("gamma",))
    with pytest.raises(ValueError, match="needs channels"):
        AdaptiveLIF(per_channel=("tau",))
    n = AdaptiveLIF(per_channel=("tau",), channels=3)
    with pytest.raises(ValueError, match=r"parameter tau has 3 values, one per channel, but a step of the input has "
                                         r"shape \(2, 5\)"):
        n(torch.zeros(4, 2, 5))
    with pytest.raises(ValueError, match=r"initial state a has shape \(2,\); it must have the shape of one step, "
                                         r"\(2, 3\)"):
        n(torch.zeros(4, 2, 3), init={"a": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"init names 'w'.*valid states: v, a"):
        n(torch.zeros(4, 2, 3), init={"w": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"tau has shape \(2, 2\)"):
        AdaptiveLIF(tau=torch.ones(2, 2))


# ---------------------------------------------------------------- the registry


def test_registry_builds_user_neurons_and_knows_every_family():
    for name in ("IF", "LIF", "PLIF", "KLIF", "CLIF", "CUBALIF", "QIF", "EIF", "Izhikevich", "RAF", "ILIF", "ALIF",
                 "ChannelwisePLIF", "LearnableThresholdLIF", "PSN", "MaskedPSN", "SlidingPSN"):
        assert name in NEURONS
    register_neuron("TestAdaptiveLIF", AdaptiveLIF, replace=True)
    n = build_neuron("TestAdaptiveLIF", tau=3.0, beta=0.1, channels=8)
    assert isinstance(n, AdaptiveLIF) and float(n.tau) == 3.0
    with pytest.raises(ValueError, match="already registered"):
        register_neuron("TestAdaptiveLIF", AdaptiveLIF)
    with pytest.raises(ValueError, match="neuron type"):
        build_neuron("NoSuchNeuron")
    with pytest.raises(ValueError, match=r"neuron QIF: 'decay_input'; valid parameters: tau, v_c, a0"):
        build_neuron("QIF", tau=2.0, decay_input=True)
    with pytest.raises(ValueError, match="neuron CUBALIF: 'bogus'; valid parameters: c_decay, v_decay"):
        build_neuron("CUBALIF", bogus=1.0)
    assert build_neuron("ChannelwisePLIF", tau=3.0, channels=4).w.shape == (4,)


def test_channels_last_maps_are_read_in_place_with_per_channel_parameters():
    """[T, B, C, H, W] maps in channels-last memory: the neurons are numbered in memory order (channel fastest),
    outputs and gradients keep that layout, per-channel parameters and their gradients still follow C."""
    torch.manual_seed(7)
    neuron = AdaptiveLIF(learnable=("tau", "beta"), per_channel=("tau", "beta"), channels=3).to(DEVICE)
    with torch.no_grad():
        neuron.tau.copy_(torch.tensor([1.5, 2.0, 4.0]))
    base = torch.randn(10, 2, 3, 4, 5, dtype=torch.float64, device=DEVICE) * 1.5 + 0.6
    x = base.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)  # channels-last per step
    init = {"v": torch.randn(2, 3, 4, 5, dtype=torch.float64, device=DEVICE).to(memory_format=torch.channels_last)}
    weights = _weights(neuron, x, 3)
    y_ref, f_ref, g_ref = _grads(neuron, x, init, "torch", [neuron.tau, neuron.beta], weights)
    y, f, g = _grads(neuron, x, init, "triton", [neuron.tau, neuron.beta], weights)
    assert y.stride() == x.stride()  # the output in the input's layout, no transposes around the neuron
    assert torch.equal(y, y_ref)
    assert_close(f["a"], f_ref["a"], what="final a")
    for name, a, b in zip(["x", "v_init", "tau", "beta"], g, g_ref):
        assert_close(a, b, what=f"dL/d{name}")


@pytest.mark.parametrize("finish", [True, False])
@pytest.mark.parametrize("layout, csum", [("short_runs", "CSUM_NEURON"), ("run", "CSUM_PROGRAM"),
                                           ("channels_last", "CSUM_ROWS"), ("one_channel", "CSUM_PROGRAM")])
def test_per_channel_sums_in_each_layout_of_the_backward(layout, csum, finish, monkeypatch):
    """The backward stores a per-channel gradient per program where a block of neurons lies in one channel, per
    channel of each program where a block is whole rows of channels (channels-last), else per neuron; each way
    gives autograd's gradients, whether the kernel's last program to arrive adds the sums up (``finish``, eager
    calls with few sums) or one reduction after it does (the traced calls' way, here forced with a limit of 0)."""
    from snntrain.kernels import neuron_codegen, step_neuron, step_neuron_tuning

    if not finish:
        monkeypatch.setattr(step_neuron_tuning, "FINISH_MAX_VALUES", 0)

    T, B, C, H, W = 3, 2, {"channels_last": 4, "one_channel": 1}.get(layout, 3), 4, 5
    if layout == "run":  # H * W a multiple of the backward's block
        H, W = 16, step_neuron.BWD_BLOCK // 16
    torch.manual_seed(11)
    neuron = AdaptiveLIF(learnable=("tau", "beta"), per_channel=("tau", "beta"), channels=C).to(DEVICE)
    with torch.no_grad():
        neuron.tau.copy_(torch.linspace(1.5, 4.0, C))
    x = torch.randn(T, B, C, H, W, dtype=torch.float64, device=DEVICE) * 1.5 + 0.6
    if layout == "channels_last":
        x = x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
    chosen = []
    monkeypatch.setattr(step_neuron, "_BWD_PLANS", PlanCache())  # a backward plan made here, not found
    pick = step_neuron._channel_sums
    monkeypatch.setattr(step_neuron, "_channel_sums", lambda *a: chosen.append(pick(*a)[0]) or pick(*a))
    weights = _weights(neuron, x, 5)
    y_ref, _f, g_ref = _grads(neuron, x, {}, "torch", [neuron.tau, neuron.beta], weights)
    y, _f, g = _grads(neuron, x, {}, "triton", [neuron.tau, neuron.beta], weights)
    assert chosen == [getattr(neuron_codegen, csum)]
    assert [plan.finish for plan in step_neuron._BWD_PLANS.values()] == [finish]
    assert torch.equal(y, y_ref) and 0 < y.sum() < y.numel()
    for name, a, b in zip(["x", "tau", "beta"], g, g_ref):
        assert_close(a, b, what=f"dL/d{name}")


class _TakesT(torch.nn.Module):
    def __init__(self, T: int, channels: int, scale: float = 1.0) -> None:
        super().__init__()
        self.T, self.channels, self.scale = T, channels, scale


def test_registry_passes_T_and_channels_where_a_type_names_them():
    from snntrain.models.common import LayerFactory

    register_neuron("TestTakesT", _TakesT, replace=True)
    try:
        f = LayerFactory({"type": "TestTakesT", "scale": 2.0}, backend="torch", T=6)
        m = f.norm_neuron(5).neuron
        assert (m.T, m.channels, m.scale) == (6, 5, 2.0)
        assert isinstance(build_neuron("LIF", T=4, channels=3), LIF)  # types that do not name them do not get them
    finally:
        NEURONS.pop("TestTakesT")


def test_psn_family_is_built_with_T_and_a_type_can_be_registered_by_import_path():
    from snntrain.nn import ALIF, PSN

    m = build_neuron("PSN", T=4, backend="torch")
    assert isinstance(m, PSN)
    register_neuron("TestLazyALIF", "snntrain.nn.families:ALIF", replace=True)
    register_neuron("TestMissing", "snntrain.nn.no_such_module:Neuron", replace=True)
    try:
        assert isinstance(build_neuron("TestLazyALIF", tau_a=5.0), ALIF)
        assert NEURONS["TestLazyALIF"] is ALIF  # imported once, then the class itself
        with pytest.raises(ValueError, match="needs snntrain.nn.no_such_module:Neuron, which is not available"):
            build_neuron("TestMissing")
    finally:
        NEURONS.pop("TestLazyALIF")
        NEURONS.pop("TestMissing")


def test_gradient_of_the_final_states_alone():
    """A loss of the final states only (no gradient reaches the outputs): the backward reads no dL/dy."""
    neuron = AdaptiveLIF(learnable=("beta",)).to(DEVICE)
    x = (torch.randn(10, 3, 4, dtype=torch.float64, device=DEVICE) + 0.8)
    grads = []
    for backend in ("torch", "triton"):
        neuron.backend = backend
        xl = x.clone().requires_grad_()
        _y, finals = neuron(xl, return_state=True)
        grads.append(torch.autograd.grad(finals["v"].sum() + 2.0 * finals["a"].sum(), [xl, neuron.beta]))
    for a, b in zip(grads[1], grads[0]):
        assert_close(a, b)
