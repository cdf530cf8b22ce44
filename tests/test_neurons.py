"""PyTorch-backend neurons against hand-computed cases, surrogate formulas and validation."""

from __future__ import annotations

import math

import pytest
import torch

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
