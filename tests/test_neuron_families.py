"""The neuron families (snntrain.nn.families) against SpikingJelly 2.0's nodes of the same name.

Same parameters, same random input, SpikingJelly's node in multi-step mode with its torch path: the spikes
(ILIF: spike counts) must be identical, the final states and the gradients of the input and of the learnable
parameters equal within the fp32 table (``_testing.TOLERANCES``; a learnable scalar's gradient is a sum over
every neuron and step: ``SUMMED``). Each family runs on both backends: ``torch`` (the step as a PyTorch loop)
and ``triton`` (the generated kernels; Triton's interpreter without a GPU).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from _testing import DEVICE, SUMMED, assert_close
from snntrain.nn import ALIF, ChannelwisePLIF, LearnableThresholdLIF, build_neuron

sj_neuron = pytest.importorskip("spikingjelly.activation_based.neuron")
sj_surrogate = pytest.importorskip("spikingjelly.activation_based.surrogate")

# (type, our parameters, SpikingJelly node, its parameters, states compared, learnable parameters compared)
CASES = [
    ("KLIF", {}, "KLIFNode", {}, ["v"], ["k"]),
    ("KLIF", {"tau": 3.0, "v_reset": None, "scale_reset": True, "decay_input": False}, "KLIFNode",
     {"tau": 3.0, "v_reset": None, "scale_reset": True, "decay_input": False}, ["v"], ["k"]),
    ("CLIF", {"tau": 2.5}, "ComplementaryLIFNode", {"tau": 2.5}, ["v", "m"], []),
    ("CUBALIF", {"c_decay": 0.4, "v_decay": 0.7}, "CUBALIFNode", {"c_decay": 0.4, "v_decay": 0.7}, ["v", "c"], []),
    ("QIF", {"v_reset": None}, "QIFNode", {"v_reset": None}, ["v"], []),
    ("QIF", {"tau": 3.0, "detach_reset": True}, "QIFNode", {"tau": 3.0, "detach_reset": True}, ["v"], []),
    ("EIF", {}, "EIFNode", {}, ["v"], []),
    ("Izhikevich", {"a": 0.3, "b": 0.1}, "IzhikevichNode", {"a": 0.3, "b": 0.1}, ["v", "w"], []),
    ("RAF", {"b": -0.3, "omega": 0.7}, "RAFNode", {"b": -0.3, "omega": 0.7}, ["v", "u"], []),
    ("ILIF", {}, "ILIFNode", {}, ["v"], []),
]


def _sj(node: str, params: dict, surrogate: str):
    kw = dict(params)
    if node != "ILIFNode":  # ILIF's surrogate is its multi-level spike count
        kw["surrogate_function"] = {"sigmoid": sj_surrogate.Sigmoid(), "atan": sj_surrogate.ATan()}[surrogate]
    m = getattr(sj_neuron, node)(**kw)
    m.step_mode = "m"
    return m.to(DEVICE)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{len(c[1])}")
def test_family_matches_spikingjelly(case, backend):
    name, ours_kw, node, sj_kw, states, learnable = case
    surrogate = "atan" if name in ("QIF", "RAF") else "sigmoid"
    torch.manual_seed(3)
    x = (torch.randn(7, 2, 3, 5) * 1.5 + 0.6).to(DEVICE)
    extra = {} if name == "ILIF" else {"surrogate": surrogate}
    ours = build_neuron(name, backend=backend, **extra, **ours_kw).to(DEVICE)
    sj = _sj(node, sj_kw, surrogate)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, finals = ours(xa, return_state=True)
    yb = sj(xb)
    assert 0 < (yb != 0).sum() < yb.numel()
    assert torch.equal(ya, yb), f"{int((ya != yb).sum())} outputs differ"
    for s in states:
        assert_close(finals[s], getattr(sj, s).to(torch.float32), what=f"final {s}")
    g = torch.randn_like(ya)
    pa, pb = [getattr(ours, p) for p in learnable], [getattr(sj, p) for p in learnable]
    ga = torch.autograd.grad((ya * g).sum(), [xa, *pa])
    gb = torch.autograd.grad((yb * g).sum(), [xb, *pb])
    assert_close(ga[0], gb[0], what="dL/dx")
    for p, a, b in zip(learnable, ga[1:], gb[1:]):
        assert_close(a, b.reshape(a.shape), **SUMMED, what=f"dL/d{p}")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_channelwise_plif_is_spikingjelly_plif_per_channel(backend):
    """With every channel's w equal, the spikes are ParametricLIFNode's and the per-channel gradients sum to its
    one w's gradient; a different init_tau per channel gives each channel its own time constant."""
    torch.manual_seed(4)
    x = (torch.randn(6, 2, 4, 3) * 1.5 + 0.6).to(DEVICE)
    ours = ChannelwisePLIF(channels=4, init_tau=3.0, backend=backend).to(DEVICE)
    sj = sj_neuron.ParametricLIFNode(init_tau=3.0, surrogate_function=sj_surrogate.Sigmoid(), step_mode="m").to(DEVICE)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), sj(xb)
    assert torch.equal(ya, yb)
    g = torch.randn_like(ya)
    ga, gwa = torch.autograd.grad((ya * g).sum(), [xa, ours.w])
    gb, gwb = torch.autograd.grad((yb * g).sum(), [xb, sj.w])
    assert gwa.shape == (4,)
    assert_close(ga, gb, what="dL/dx")
    assert_close(gwa.sum(), gwb.reshape(()), **SUMMED, what="sum of dL/dw_c")
    # each channel is the layer-wide PLIF of its own time constant
    with torch.no_grad():
        ours.w.copy_(torch.tensor([0.5, -0.2, 1.0, -1.5]))
    y = ours(x)
    for c in range(4):
        sj_c = sj_neuron.ParametricLIFNode(surrogate_function=sj_surrogate.Sigmoid(), step_mode="m").to(DEVICE)
        with torch.no_grad():
            sj_c.w.copy_(ours.w[c])
        assert torch.equal(y[:, :, c], sj_c(x[:, :, c]))


@pytest.mark.parametrize("channelwise", [False, True])
def test_learnable_threshold_lif(channelwise):
    """Spikes of SpikingJelly's LIFNode at the same threshold; the threshold's gradient from the generated kernels
    equals autograd through the PyTorch loop."""
    torch.manual_seed(5)
    x = (torch.randn(9, 2, 3, 4) * 1.5 + 0.6).to(DEVICE)
    sj = sj_neuron.LIFNode(tau=2.0, v_threshold=0.8, surrogate_function=sj_surrogate.Sigmoid(), step_mode="m")
    grads = {}
    for backend in ("torch", "triton"):
        ours = LearnableThresholdLIF(tau=2.0, v_threshold=0.8, channelwise=channelwise, channels=3,
                                     backend=backend).to(DEVICE)
        y = ours(x)
        assert torch.equal(y, sj.to(DEVICE)(x))
        sj.reset()
        (grads[backend],) = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel(), device=DEVICE).view_as(y)).sum(),
                                                ours.v_threshold)
    assert grads["triton"].shape == ((3,) if channelwise else ())
    assert_close(grads["triton"], grads["torch"], **SUMMED, what="dL/dv_threshold")


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("v_reset", [0.0, None])
def test_alif_follows_its_equations(backend, v_reset):
    """ALIF against its documented equations written out as a plain PyTorch loop."""
    torch.manual_seed(6)
    tau, tau_a, beta, th = 2.0, 4.0, 0.4, 1.0
    x = (torch.randn(8, 3, 6) * 1.5 + 0.7).to(DEVICE)
    y, finals = ALIF(tau=tau, tau_a=tau_a, beta=beta, v_threshold=th, v_reset=v_reset,
                     backend=backend).to(DEVICE)(x, return_state=True)
    v = torch.zeros(3, 6, device=DEVICE)
    a = torch.zeros(3, 6, device=DEVICE)
    for t in range(8):
        h = v + (x[t] - v) / tau
        theta = th + beta * a
        s = (h - theta >= 0).float()
        v = s * 0.0 + (1.0 - s) * h if v_reset is not None else h - s * theta
        a = a - a / tau_a + s
        assert torch.equal(y[t], s)
    assert_close(finals["v"], v, what="final v")
    assert_close(finals["a"], a, what="final a")
    assert finals["a"].max() > 0.5  # the threshold did adapt


@pytest.mark.parametrize("model", ["sew_resnet", "spikformer"])
def test_every_type_builds_from_the_config_by_its_name(model, compose_run):
    """``model.neuron.type=NAME`` alone builds every registered type (the parallel spiking neurons with the ``k`` they
    require): the config's settings for its default LIF that a type lacks are left out with a warning naming them;
    a key that no type takes is still refused, and a per-channel type in a transformer is refused with the reason."""
    from snntrain.models import build_model
    from snntrain.nn import NEURONS

    for name in NEURONS:
        if model == "spikformer" and name == "ChannelwisePLIF":
            continue
        extra = ["+model.neuron.k=2"] if name in ("MaskedPSN", "SlidingPSN") else []
        cfg = compose_run(None, f"model={model}", f"model.neuron.type={name}", "debug=tiny", *extra)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            net = build_model(cfg.model, backend="torch")
        types = {type(m) for m in net.modules()}
        assert NEURONS[name] in types, name
        notes = [str(w.message) for w in caught if "has no parameter" in str(w.message)]
        if name == "IF":
            assert notes and "neuron IF has no parameter tau, decay_input" in notes[0]
        if name in ("LIF", "PLIF", "ALIF"):
            assert not notes, notes
    cfg = compose_run(None, f"model={model}", "model.neuron.type=IF", "+model.neuron.tua=2.0", "debug=tiny")
    with pytest.raises(ValueError, match="bad parameter for neuron IF: 'tua'; valid parameters: v_threshold"):
        build_model(cfg.model, backend="torch")
    if model == "spikformer":
        cfg = compose_run(None, f"model={model}", "model.neuron.type=ChannelwisePLIF", "debug=tiny")
        with pytest.raises(ValueError, match="ChannelwisePLIF needs the channel count of every layer"):
            build_model(cfg.model, backend="torch")


def test_the_config_imports_no_other_registered_type(compose_run):
    """Reading a model config's neuron section leaves the other registered types as they are: one registered by
    ``"module:Class"`` that cannot be imported does not stop a LIF network from building."""
    from snntrain.models import build_model
    from snntrain.nn import NEURONS, register_neuron

    register_neuron("Unavailable", "no_such_package.neurons:Missing")
    try:
        cfg = compose_run(None, "model=sew_resnet", "debug=tiny")
        build_model(cfg.model, backend="torch")
        assert NEURONS["Unavailable"] == "no_such_package.neurons:Missing"
    finally:
        del NEURONS["Unavailable"]
