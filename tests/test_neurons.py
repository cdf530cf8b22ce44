"""PyTorch-backend neurons against hand-computed cases, surrogate formulas and validation."""

from __future__ import annotations

import math

import pytest
import torch

from _testing import assert_close
from snntrain.nn import IF, LIF, PLIF, build_neuron, set_backend
from snntrain.nn import functional as SF
from snntrain.nn.surrogate import SURROGATES, spike


def col(*values: float) -> torch.Tensor:
    """A [T, 1] input from per-step values."""
    return torch.tensor(values, dtype=torch.float32).unsqueeze(1)


def sigmoid_grad(x: float, alpha: float) -> float:
    s = 1.0 / (1.0 + math.exp(-alpha * x))
    return alpha * s * (1.0 - s)


# ----------------------------------------------------------------------------- dynamics


def test_if_hard_reset():
    out = SF.if_(col(0.6, 0.6, 0.6, 1.5), backend="torch", return_state=True, return_membrane=True)
    assert out.spikes.flatten().tolist() == [0, 1, 0, 1]
    assert out.v_seq.flatten().tolist() == pytest.approx([0.6, 0.0, 0.6, 0.0])
    assert out.v_final.item() == pytest.approx(0.0)


def test_if_soft_reset():
    out = SF.if_(col(0.6, 0.6, 0.6, 1.5), v_reset=None, backend="torch", return_state=True, return_membrane=True)
    assert out.spikes.flatten().tolist() == [0, 1, 0, 1]
    assert out.v_seq.flatten().tolist() == pytest.approx([0.6, 0.2, 0.8, 1.3])
    assert out.v_final.item() == pytest.approx(1.3)


def test_lif_decay_input_hard_reset():
    # H = V + (X - V) / 2: 0.5, 0.75, 0.875, 0.9375 never reaches 1
    out = SF.lif(col(1, 1, 1, 1), tau=2.0, backend="torch", return_membrane=True)
    assert out.spikes.sum() == 0
    assert out.v_seq.flatten().tolist() == pytest.approx([0.5, 0.75, 0.875, 0.9375])
    # X = 2 gives H = 1 at every step: fires (H >= threshold) and resets to 0
    assert SF.lif(col(2, 2, 2), tau=2.0, backend="torch").flatten().tolist() == [1, 1, 1]


def test_lif_no_decay_input():
    # H = V - V / 2 + X: 0.6, 0.9, 1.05
    out = SF.lif(col(0.6, 0.6, 0.6), tau=2.0, decay_input=False, backend="torch", return_membrane=True)
    assert out.spikes.flatten().tolist() == [0, 0, 1]
    assert out.v_seq.flatten().tolist() == pytest.approx([0.6, 0.9, 0.0])


def test_lif_nonzero_reset_potential():
    # V0 = -0.5; H1 = -0.5 + (1.5 - 0) / 2 = 0.25; H2 = 0.25 + (3 - 0.75) / 2 = 1.375 -> spike, V = -0.5
    out = SF.lif(col(1.5, 3.0), tau=2.0, v_reset=-0.5, backend="torch", return_membrane=True)
    assert out.spikes.flatten().tolist() == [0, 1]
    assert out.v_seq.flatten().tolist() == pytest.approx([0.25, -0.5])


def test_lif_soft_reset_charges_towards_zero():
    # soft reset: v_r = 0 in the charge; H1 = 1.5 -> spike, V = 0.5; H2 = 0.5 + (0 - 0.5) / 2 = 0.25
    out = SF.lif(col(3.0, 0.0), tau=2.0, v_reset=None, backend="torch", return_membrane=True)
    assert out.spikes.flatten().tolist() == [1, 0]
    assert out.v_seq.flatten().tolist() == pytest.approx([0.5, 0.25])


def test_v_threshold_and_tau_are_used():
    # tau = 4: H1 = 0.5, H2 = 0.5 + (2 - 0.5) / 4 = 0.875; threshold 0.8 fires at step 2 only
    out = SF.lif(col(2.0, 2.0), tau=4.0, v_threshold=0.8, backend="torch")
    assert out.flatten().tolist() == [0, 1]


def test_initial_state_and_final_state():
    v0 = torch.tensor([0.9])
    out = SF.if_(col(0.2, 0.0), v_init=v0, backend="torch", return_state=True)
    assert out.spikes.flatten().tolist() == [1, 0]
    assert out.v_final.item() == pytest.approx(0.0)
    # without v_init the same input does not fire: the state starts at v_reset on every call
    assert SF.if_(col(0.2, 0.0), backend="torch").sum() == 0
    with pytest.raises(ValueError, match="v_init has shape"):
        SF.if_(col(0.2, 0.0), v_init=torch.zeros(3), backend="torch")


def test_plif_forward_matches_lif_and_learns_w():
    x = torch.randn(5, 7)
    m = PLIF(init_tau=2.0, backend="torch")
    assert m.tau == pytest.approx(2.0)
    assert torch.equal(m(x), SF.lif(x, tau=2.0, backend="torch"))
    # one step, V0 = 0: H = x k with k = sigmoid(w) = 0.5; dL/dw = sg'(H - 1) * x * k (1 - k)
    x1 = col(1.0)
    m(x1).sum().backward()
    assert m.w.grad.item() == pytest.approx(sigmoid_grad(0.5 - 1.0, 4.0) * 1.0 * 0.25, rel=1e-5)


def test_detach_reset_stops_gradient_through_reset():
    # IF hard reset, L = S_2. Step 1 fires (H1 = 1.2), V1 = H1 (1 - S1).
    # dL/dx1 = sg'(H2 - 1) * dV1/dH1 with dV1/dH1 = (1 - S1) + (v_reset - H1) sg'(H1 - 1) = -1.2 sg'(0.2)
    for detach, expected in ((False, sigmoid_grad(-0.9, 4.0) * -1.2 * sigmoid_grad(0.2, 4.0)), (True, 0.0)):
        x = col(1.2, 0.1).requires_grad_()
        s = SF.if_(x, detach_reset=detach, backend="torch")
        s[1].sum().backward()
        assert x.grad[0].item() == pytest.approx(expected, abs=1e-7)
        assert x.grad[1].item() == pytest.approx(sigmoid_grad(-0.9, 4.0), rel=1e-6)


# autograd through the loop, the spike through SpikeFunction: what the backend runs under torch.compile,
# and the definition its written-out backward must match (the cases above pin the dynamics themselves)
autograd_loop = SF._differentiable_loop


_OPTIONS = [(kind, hard, detach, decay, surrogate)
            for kind in ("if", "lif", "plif") for hard in (True, False) for detach in (True, False)
            for decay in (True, False) for surrogate in SURROGATES if kind != "if" or decay]


@pytest.mark.parametrize("kind,hard,detach,decay,surrogate", _OPTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_written_out_backward_matches_autograd_through_the_loop(kind, hard, detach, decay, surrogate, dtype):
    """Spikes and membranes bit for bit, and every gradient (input, PLIF's w, initial state) of a loss
    on the spikes, the final state and the membrane trace, against autograd through the loop."""
    p = SF.NeuronParams(kind, tau=2.5, v_threshold=0.9, v_reset=0.1 if hard else None, decay_input=decay,
                        detach_reset=detach, surrogate=surrogate)
    g = torch.Generator().manual_seed(_OPTIONS.index((kind, hard, detach, decay, surrogate)))
    T, n = 6, 40
    x0 = (torch.randn(T, n, generator=g) * 1.5 + 0.6).to(dtype)
    v0 = torch.randn(n, generator=g) * 0.5
    g_s, g_v, g_q = torch.randn(T, n, generator=g), torch.randn(n, generator=g), torch.randn(T, n, generator=g)
    results = []
    for fn in (autograd_loop, "torch"):
        x, v_init = x0.clone().requires_grad_(), v0.clone().requires_grad_()
        w = torch.tensor(-0.3, requires_grad=True) if kind == "plif" else None
        if fn == "torch":
            out = SF.neuron_multistep(x, p, w, v_init, return_state=True, return_membrane=True, backend="torch")
            s, v, trace = out.spikes, out.v_final, out.v_seq
        else:
            s, v, trace = fn(x, p, w, v_init, True)
        ((s.float() * g_s).sum() + (v * g_v).sum() + (trace * g_q).sum()).backward()
        results.append((s, v, trace, x.grad, v_init.grad, None if w is None else w.grad))
    (s_a, v_a, q_a, *grads_a), (s_b, v_b, q_b, *grads_b) = results
    assert s_b.dtype == dtype and torch.equal(s_a, s_b) and torch.equal(v_a, v_b) and torch.equal(q_a, q_b)
    for name, a, b in zip(("x", "v_init", "w"), grads_a, grads_b):
        if a is None:
            assert b is None, f"d{name} should be absent"
            continue
        assert b.dtype == a.dtype, name
        # dL/dx in x's dtype: the table's row; the fp32 dL/dv_init and dL/dw add up every step: atol 1e-5
        assert_close(b, a, **({} if name == "x" else dict(atol=1e-5)), what=f"d{name}")


@pytest.mark.parametrize("outputs", ["spikes", "final", "trace"])
def test_written_out_backward_with_one_output_in_the_loss(outputs):
    """Gradients that reach only one of the outputs (the others' gradients are absent, not zeros)."""
    p = SF.NeuronParams("plif", v_reset=0.0, decay_input=True, surrogate="atan")
    x0 = torch.randn(5, 3, 7, generator=torch.Generator().manual_seed(2)) + 0.5
    grads = []
    for fn in (autograd_loop, "torch"):
        x, w = x0.clone().requires_grad_(), torch.tensor(0.2, requires_grad=True)
        v_init = torch.zeros(3, 7, requires_grad=True)
        if fn == "torch":
            o = SF.neuron_multistep(x, p, w, v_init, return_state=True, return_membrane=True, backend="torch")
            s, v, trace = o.spikes, o.v_final, o.v_seq
        else:
            s, v, trace = fn(x, p, w, v_init, True)
        {"spikes": s, "final": v, "trace": trace}[outputs].pow(2).sum().backward()
        grads.append((x.grad, w.grad, v_init.grad))
    for a, b in zip(*grads):
        assert_close(b, a)


def test_inference_keeps_no_graph_and_training_does():
    x = torch.randn(4, 2, 3) + 0.8
    with torch.no_grad():
        assert SF.lif(x.clone().requires_grad_(), backend="torch").grad_fn is None
    assert SF.lif(x, backend="torch").grad_fn is None  # nothing requires a gradient
    assert SF.lif(x.clone().requires_grad_(), backend="torch").grad_fn is not None


def test_dtype_preserved_and_state_fp32():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(3, 4, 5).to(dtype)
        out = SF.lif(x, backend="torch", return_state=True, return_membrane=True)
        assert out.spikes.dtype == dtype and out.spikes.shape == x.shape
        assert out.v_final.dtype == torch.float32 and out.v_seq.dtype == torch.float32


def test_modules_match_functional_and_return_state():
    x = torch.randn(4, 2, 3)
    lif = LIF(tau=3.0, v_reset=None, backend="torch", store_v_seq=True)
    s, v = lif(x, return_state=True)
    ref = SF.lif(x, tau=3.0, v_reset=None, backend="torch", return_state=True, return_membrane=True)
    assert torch.equal(s, ref.spikes) and torch.equal(v, ref.v_final)
    assert torch.equal(lif.v_seq, ref.v_seq)
    assert torch.equal(IF(backend="torch")(x), SF.if_(x, backend="torch"))


def test_set_backend_switches_every_neuron_and_keeps_state_dict():
    net = torch.nn.Sequential(LIF(backend="torch"), PLIF(backend="torch"))
    keys = set(net.state_dict())
    set_backend(net, "triton")
    assert [m.backend for m in net] == ["triton", "triton"]
    assert set(net.state_dict()) == keys == {"1.w"}
    with pytest.raises(ValueError, match="backend='cuda' is not valid"):
        set_backend(net, "cuda")


# ----------------------------------------------------------------------------- surrogates


@pytest.mark.parametrize("alpha", [None, 1.5])
def test_surrogate_gradients_match_formulas(alpha):
    xs = [-2.0, -0.7, -0.2, 0.0, 0.3, 1.1]
    formulas = {
        "sigmoid": lambda x, a: sigmoid_grad(x, a),
        "atan": lambda x, a: (a / 2) / (1 + (math.pi / 2 * a * x) ** 2),
        "piecewise_quadratic": lambda x, a: max(a - a * a * abs(x), 0.0),
    }
    assert set(formulas) == set(SURROGATES)
    for name, f in formulas.items():
        a = SURROGATES[name] if alpha is None else alpha
        x = torch.tensor(xs, dtype=torch.float64, requires_grad=True)
        y = spike(x, name, alpha)
        assert y.tolist() == [0, 0, 0, 1, 1, 1]  # heaviside with H(0) = 1
        y.sum().backward()
        assert x.grad.tolist() == pytest.approx([f(v, a) for v in xs], rel=1e-12, abs=1e-15)


def test_surrogate_defaults():
    assert SURROGATES == {"sigmoid": 4.0, "atan": 2.0, "piecewise_quadratic": 1.0}


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tau": 1.0}, "tau=1.0 must be > 1"),
        ({"tau": 0.5}, "tau=0.5 must be > 1"),
        ({"v_threshold": 0.0, "v_reset": 0.0}, "v_threshold=0.0 must be greater than v_reset=0.0"),
        ({"v_threshold": -1.0, "v_reset": None}, "greater than 0 \\(soft reset"),
        ({"surrogate": "relu"}, "surrogate='relu' is not valid; choose one of sigmoid, atan, piecewise_quadratic"),
        ({"alpha": -2.0}, "alpha=-2.0 must be a positive"),
        ({"tau": "2"}, "tau='2' must be a number"),
        ({"v_threshold": True}, "v_threshold=True must be a number"),
        ({"detach_reset": 1}, "detach_reset=1 must be true or false"),
        ({"backend": "cupy"}, "backend='cupy' is not valid; choose one of auto, torch, triton"),
    ],
)
def test_bad_parameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LIF(**kwargs)


def test_integers_from_yaml_are_floats():
    m = LIF(tau=2, v_threshold=1, v_reset=0)
    assert m.params.tau == 2.0 and isinstance(m.params.tau, float)
    assert isinstance(m.params.v_threshold, float) and isinstance(m.params.v_reset, float)
    assert PLIF(init_tau=3).tau == pytest.approx(3.0)
    with pytest.raises(ValueError, match="init_tau=1.0 must be > 1"):
        PLIF(init_tau=1)


def test_backend_is_checked_when_the_module_is_built_not_at_every_call(monkeypatch):
    """A module checks its backend when built; its forward asks only whether to run Triton. A name set on a
    built module by hand is still named (at the call) when it is not valid."""
    import snntrain.backend as B

    m = LIF(backend="torch")
    checked = []
    monkeypatch.setattr(B, "check_backend", lambda name: checked.append(name) or name)
    for backend in ("torch", "auto"):
        m.backend = backend
        m(torch.randn(3, 2))
        SF.lif(torch.randn(3, 2), backend=backend)
    assert checked == []
    monkeypatch.undo()
    m.backend = "cupy"
    with pytest.raises(ValueError, match="backend='cupy' is not valid; choose one of auto, torch, triton"):
        m(torch.randn(3, 2))


def test_input_rank_and_dtype_checked():
    with pytest.raises(ValueError, match=r"shape \(5,\): multi-step neurons need rank >= 2 with time first"):
        LIF(backend="torch")(torch.randn(5))
    with pytest.raises(TypeError, match="dtype torch.int64"):
        LIF(backend="torch")(torch.ones(2, 3, dtype=torch.long))


def test_build_neuron_from_config():
    m = build_neuron(type="PLIF", init_tau=2.5, surrogate="atan", backend="torch")
    assert isinstance(m, PLIF) and m.params.alpha == 2.0
    with pytest.raises(ValueError, match="neuron type='LIFF' is not valid; choose one of IF, LIF, PLIF"):
        build_neuron(type="LIFF")
    with pytest.raises(ValueError, match="bad parameter for neuron IF.*valid parameters: v_threshold"):
        build_neuron(type="IF", tau=2.0)
