"""Multi-step spiking neurons, functional form.

All functions take ``x`` of shape ``[T, ...]`` (time first) and return spikes of the
same shape and dtype. The membrane potential is always kept in float32.

Dynamics (SpikingJelly-compatible), for every step ``t``::

    charge   IF                      H = V + X
             LIF/PLIF, decay_input   H = V + (X - (V - v_r)) / tau
             LIF/PLIF, not decay     H = V - (V - v_r) / tau + X
    fire     S = heaviside(H - v_threshold)           (surrogate gradient backward)
    reset    hard (v_reset a float)  V = H * (1 - S) + v_reset * S
             soft (v_reset None)     V = H - v_threshold * S

``v_r`` is ``v_reset`` for hard reset and 0 for soft reset. PLIF learns ``w`` with
``1 / tau = sigmoid(w)``. With ``detach_reset`` the reset does not propagate
gradient through ``S``. The state starts at ``v_reset`` (0 for soft reset) unless
``v_init`` is given.

``backend`` picks the implementation: ``"torch"`` (this file, the reference),
``"triton"`` (:mod:`snntrain.kernels.lif`) or ``"auto"`` (Triton for CUDA tensors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..backend import use_triton
from ..validation import flag, number
from .surrogate import SpikeFunction, check_surrogate, surrogate_grad

__all__ = ["NeuronOutput", "NeuronParams", "if_", "lif", "plif", "plif_w_from_tau", "neuron_multistep"]


class NeuronOutput(NamedTuple):
    """Returned when ``return_state`` or ``return_membrane`` is set.

    ``v_final`` is the state after the last step (``x.shape[1:]``, float32) or None;
    ``v_seq`` the membrane after each step's reset (``x.shape``, float32) or None.
    """

    spikes: torch.Tensor
    v_final: torch.Tensor | None
    v_seq: torch.Tensor | None


@dataclass(frozen=True)
class NeuronParams:
    """Validated, hashable neuron hyper-parameters shared by both backends.

    ``kind`` is ``"if"``, ``"lif"`` or ``"plif"``; ``tau`` is used by LIF only
    (PLIF's time constant is the learnable ``w``).
    """

    kind: str
    tau: float = 2.0
    v_threshold: float = 1.0
    v_reset: float | None = 0.0
    decay_input: bool = True
    detach_reset: bool = False
    surrogate: str = "sigmoid"
    alpha: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("if", "lif", "plif"):
            raise ValueError(f"neuron kind={self.kind!r} is not valid; choose one of if, lif, plif")
        tau = number("tau", self.tau)
        if self.kind == "lif" and not tau > 1.0:
            raise ValueError(f"tau={self.tau!r} must be > 1 (the membrane time constant, in steps)")
        v_th = number("v_threshold", self.v_threshold)
        v_reset = None if self.v_reset is None else number("v_reset", self.v_reset)
        floor = 0.0 if v_reset is None else v_reset
        if not v_th > floor:
            what = f"v_reset={v_reset!r}" if v_reset is not None else "0 (soft reset, v_reset=None)"
            raise ValueError(f"v_threshold={self.v_threshold!r} must be greater than {what}")
        surrogate, alpha = check_surrogate(self.surrogate, self.alpha)
        object.__setattr__(self, "tau", tau)
        object.__setattr__(self, "v_threshold", v_th)
        object.__setattr__(self, "v_reset", v_reset)
        object.__setattr__(self, "decay_input", flag("decay_input", self.decay_input))
        object.__setattr__(self, "detach_reset", flag("detach_reset", self.detach_reset))
        object.__setattr__(self, "surrogate", surrogate)
        object.__setattr__(self, "alpha", alpha)

    @property
    def hard_reset(self) -> bool:
        return self.v_reset is not None


def plif_w_from_tau(init_tau: float) -> float:
    """The PLIF parameter ``w`` with ``1 / sigmoid(w) == init_tau``."""
    init_tau = number("init_tau", init_tau)
    if not init_tau > 1.0:
        raise ValueError(f"init_tau={init_tau!r} must be > 1 (the initial membrane time constant, in steps)")
    return -math.log(init_tau - 1.0)


def _check_input(x: object, v_init: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape [T, ...], got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(
            f"x has shape {tuple(x.shape)}: multi-step neurons need rank >= 2 with time first, [T, ...]"
        )
    if not x.is_floating_point():
        raise TypeError(f"x has dtype {x.dtype}; spiking neurons take float16, bfloat16 or float32 input")
    if v_init is not None:
        if not isinstance(v_init, torch.Tensor) or tuple(v_init.shape) != tuple(x.shape[1:]):
            shape = tuple(v_init.shape) if isinstance(v_init, torch.Tensor) else type(v_init).__name__
            raise ValueError(f"v_init has shape {shape}; it must have the shape of one step, {tuple(x.shape[1:])}")


def _leak(p: NeuronParams, w: torch.Tensor | None) -> float | torch.Tensor | None:
    """``k = 1 / tau``: a float for LIF, PLIF's ``sigmoid(w)`` (fp32, 0-d), None for IF."""
    if p.kind == "plif":
        return torch.sigmoid(w.to(torch.float32)).reshape(())
    return 1.0 / p.tau if p.kind == "lif" else None


def _scan(
    x: torch.Tensor, p: NeuronParams, k: float | torch.Tensor | None, v_init: torch.Tensor | None,
    return_membrane: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The forward loop, no autograd graph: spikes (``x.dtype``), the final state, the membrane
    trace (or None) and the charged membrane H of every step, all fp32 but the spikes.

    Each operation is rounded on its own, in the order of the module docstring's equations (the
    Triton kernels compute the same), and the loop holds only what depends on the previous step;
    the spikes are converted to ``x.dtype`` in one operation after it."""
    v_r = p.v_reset if p.hard_reset else 0.0
    if v_init is None:
        v = torch.full(x.shape[1:], v_r, dtype=torch.float32, device=x.device)
    else:
        v = v_init.detach().to(torch.float32)
    h_seq = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    fired = torch.empty(x.shape, dtype=torch.float32, device=x.device)  # spikes as 0.0 / 1.0
    v_seq = torch.empty(x.shape, dtype=torch.float32, device=x.device) if return_membrane else None
    for t in range(x.shape[0]):
        xt, h, s = x[t].to(torch.float32), h_seq[t], fired[t]
        rel = v if v_r == 0.0 else v - v_r  # V - v_r (exact without the subtraction when v_r = 0)
        if p.kind == "if":
            torch.add(v, xt, out=h)
        elif p.decay_input:  # V + (X - (V - v_r)) * k
            torch.sub(xt, rel, out=h).mul_(k).add_(v)
        else:  # V - (V - v_r) * k + X
            torch.mul(rel, k, out=h)
            torch.sub(v, h, out=h).add_(xt)
        # H >= v_threshold is H - v_threshold >= 0 in IEEE arithmetic. Float arithmetic throughout (a
        # comparison into a float tensor, the reset as products with S): boolean masks are several times
        # slower on the CPU. With S in {0, 1} each reset below is exact: H or v_reset, H or H - v_threshold.
        torch.ge(h, p.v_threshold, out=s)
        if p.hard_reset:  # H (1 - S) + v_reset S, as H - H S + v_reset S
            v = torch.addcmul(h, h, s, value=-1.0)
            if p.v_reset != 0.0:
                v.add_(s, alpha=p.v_reset)
        else:  # H - v_threshold S
            v = torch.add(h, s, alpha=-p.v_threshold)
        if v_seq is not None:
            v_seq[t] = v
    spikes = fired.to(x.dtype)
    return spikes, v, v_seq, h_seq


class _MultiStep(torch.autograd.Function):
    """The torch backend with a gradient: the forward loop of :func:`_scan` (no graph per step) and
    the backward recurrence written out (the derivatives of the module docstring's equations,
    with the surrogate's dS/dH)::

        dV/dH    hard reset  1 - S + (v_reset - H) dS/dH     (no second term with detach_reset)
                 soft reset  1 - v_threshold dS/dH            (1 with detach_reset)
        dL/dH_t  = dL/dS_t dS/dH + dL/dV_t dV/dH,   dL/dV_t including dL/dV_{t} from step t + 1
        dL/dX_t  = dL/dH_t * k with decay_input, else dL/dH_t;   dL/dV_{t-1} = dL/dH_t * (1 - k)
        dL/dk    = sum_t dL/dH_t * (X_t - (V_{t-1} - v_r) with decay_input, else -(V_{t-1} - v_r))

    (IF: k = 0 and dL/dX_t = dL/dH_t.) PLIF's ``dL/dw = dL/dk * k (1 - k)``. Only
    ``dL/dH_t = a_t + b_t * dL/dV_t`` runs step by step; the surrogate, ``a_t`` and ``b_t`` and the
    input gradient are whole-sequence operations, where autograd through the loop would record a
    dozen nodes per step.
    """

    @staticmethod
    def forward(ctx, x, w, v_init, p, return_membrane):
        ctx.set_materialize_grads(False)  # an output left out of the loss costs nothing backwards
        k = _leak(p, w)
        spikes, v_final, v_seq, h_seq = _scan(x, p, k, v_init, return_membrane)
        plif = p.kind == "plif"
        ctx.save_for_backward(h_seq, spikes, x if plif and p.decay_input else None,
                              v_init if plif else None, k if plif else None)
        ctx.p, ctx.k, ctx.x_dtype = p, k, x.dtype
        ctx.v_init_dtype = None if v_init is None else v_init.dtype
        return spikes, v_final, v_seq

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_spikes, g_final, g_seq):
        h_seq, spikes, x, v_init, k_plif = ctx.saved_tensors
        p = ctx.p
        k = k_plif if p.kind == "plif" else ctx.k
        v_r = p.v_reset if p.hard_reset else 0.0
        sg = surrogate_grad(h_seq - p.v_threshold, p.surrogate, p.alpha)  # dS/dH of every step
        fired = spikes.to(torch.float32)
        if p.hard_reset:  # dV/dH
            dv_dh = 1.0 - fired if p.detach_reset else (1.0 - fired) + (p.v_reset - h_seq) * sg
        else:
            dv_dh = None if p.detach_reset else 1.0 - p.v_threshold * sg
        direct = None if g_spikes is None else g_spikes.to(torch.float32) * sg  # a_t = dL/dS_t dS/dH
        g_h = torch.empty_like(h_seq)
        g_v = None if g_final is None else g_final.to(torch.float32)
        for t in range(h_seq.shape[0] - 1, -1, -1):
            if g_seq is not None:
                g_v = g_seq[t] if g_v is None else g_v + g_seq[t]
            gh = g_h[t]
            if g_v is None:
                gh.zero_()
            elif dv_dh is None:
                gh.copy_(g_v)
            else:
                torch.mul(g_v, dv_dh[t], out=gh)
            if direct is not None:
                gh.add_(direct[t])
            g_v = gh if p.kind == "if" else gh * (1.0 - k)
        g_x = g_h * k if p.kind != "if" and p.decay_input else g_h
        g_w = None
        if p.kind == "plif" and ctx.needs_input_grad[1]:
            first = (torch.full_like(h_seq[0], v_r) if v_init is None else v_init.to(torch.float32))[None]
            if p.hard_reset:  # V_t after the reset, as in the forward
                after = torch.addcmul(h_seq, h_seq, fired, value=-1.0).add_(fired, alpha=p.v_reset)
            else:
                after = torch.add(h_seq, fired, alpha=-p.v_threshold)
            v_prev = torch.cat([first, after[:-1]])  # V_{t-1} of every step
            dh_dk = x.to(torch.float32) - (v_prev - v_r) if p.decay_input else -(v_prev - v_r)
            g_w = ((g_h * dh_dk).sum() * k * (1.0 - k)).reshape(())
        g_v_init = None
        if ctx.needs_input_grad[2]:
            g_v_init = (torch.zeros_like(h_seq[0]) if g_v is None else g_v).to(ctx.v_init_dtype)
        return g_x.to(ctx.x_dtype), g_w, g_v_init, None, None


def _differentiable_loop(
    x: torch.Tensor, p: NeuronParams, w: torch.Tensor | None, v_init: torch.Tensor | None, return_membrane: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The equations step by step with autograd through every operation (the spike through
    :class:`~snntrain.nn.surrogate.SpikeFunction`): what ``torch.compile`` traces, differentiates and
    fuses itself. The same operations as :func:`_scan`, so the same spikes and membranes."""
    v_r = p.v_reset if p.hard_reset else 0.0
    v = torch.full(x.shape[1:], v_r, dtype=torch.float32, device=x.device) if v_init is None else \
        v_init.to(torch.float32)
    k = _leak(p, w)
    spikes, trace = [], []
    for t in range(x.shape[0]):
        xt = x[t].to(torch.float32)
        if p.kind == "if":
            h = v + xt
        elif p.decay_input:
            h = v + (xt - (v - v_r)) * k
        else:
            h = v - (v - v_r) * k + xt
        s = SpikeFunction.apply(h - p.v_threshold, p.surrogate, p.alpha)
        r = s.detach() if p.detach_reset else s
        v = h - h * r + p.v_reset * r if p.hard_reset else h - p.v_threshold * r
        spikes.append(s.to(x.dtype))
        if return_membrane:
            trace.append(v)
    return torch.stack(spikes), v, torch.stack(trace) if return_membrane else None


def _torch_backend(
    x: torch.Tensor,
    p: NeuronParams,
    w: torch.Tensor | None,
    v_init: torch.Tensor | None,
    return_membrane: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The pure-PyTorch backend: :class:`_MultiStep` while gradients are recorded, else the plain loop
    (inference and export); under ``torch.compile``, :func:`_differentiable_loop`, which the compiler
    differentiates and fuses (it does not trace the written-out backward faithfully on every torch
    release)."""
    if torch.is_grad_enabled():  # outputs without a graph when no input requires a gradient
        if torch.compiler.is_compiling():
            return _differentiable_loop(x, p, w, v_init, return_membrane)
        return _MultiStep.apply(x, w, v_init, p, return_membrane)
    spikes, v_final, v_seq, _ = _scan(x, p, _leak(p, w), v_init, return_membrane)
    return spikes, v_final, v_seq


def neuron_multistep(
    x: torch.Tensor,
    params: NeuronParams,
    w: torch.Tensor | None = None,
    v_init: torch.Tensor | None = None,
    return_state: bool = False,
    return_membrane: bool = False,
    backend: str = "auto",
) -> torch.Tensor | NeuronOutput:
    """Run the neuron ``params`` over ``x`` ``[T, ...]``; the one entry point of both backends."""
    _check_input(x, v_init)
    if params.kind == "plif":
        if not isinstance(w, torch.Tensor) or w.numel() != 1:
            raise ValueError("PLIF needs w, a one-element tensor with 1/tau = sigmoid(w)")
    if use_triton(backend, x):
        from ..kernels import lif as lif_kernels

        p = params
        spikes, v_final, v_seq = lif_kernels.neuron_multistep(
            x, p.kind, tau=p.tau, w=w, v_threshold=p.v_threshold, v_reset=p.v_reset, decay_input=p.decay_input,
            detach_reset=p.detach_reset, surrogate=p.surrogate, alpha=p.alpha, v_init=v_init,
            return_state=return_state, return_membrane=return_membrane,
        )
    else:
        spikes, v_final, v_seq = _torch_backend(x, params, w, v_init, return_membrane)
    if return_state or return_membrane:
        return NeuronOutput(spikes, v_final if return_state else None, v_seq)
    return spikes


def if_(
    x: torch.Tensor,
    v_threshold: float = 1.0,
    v_reset: float | None = 0.0,
    detach_reset: bool = False,
    surrogate: str = "sigmoid",
    alpha: float | None = None,
    v_init: torch.Tensor | None = None,
    return_state: bool = False,
    return_membrane: bool = False,
    backend: str = "auto",
) -> torch.Tensor | NeuronOutput:
    """Integrate-and-fire neuron over ``x`` ``[T, ...]``."""
    p = NeuronParams("if", v_threshold=v_threshold, v_reset=v_reset, detach_reset=detach_reset,
                     surrogate=surrogate, alpha=alpha)
    return neuron_multistep(x, p, None, v_init, return_state, return_membrane, backend)


def lif(
    x: torch.Tensor,
    tau: float = 2.0,
    v_threshold: float = 1.0,
    v_reset: float | None = 0.0,
    decay_input: bool = True,
    detach_reset: bool = False,
    surrogate: str = "sigmoid",
    alpha: float | None = None,
    v_init: torch.Tensor | None = None,
    return_state: bool = False,
    return_membrane: bool = False,
    backend: str = "auto",
) -> torch.Tensor | NeuronOutput:
    """Leaky integrate-and-fire neuron over ``x`` ``[T, ...]``."""
    p = NeuronParams("lif", tau=tau, v_threshold=v_threshold, v_reset=v_reset, decay_input=decay_input,
                     detach_reset=detach_reset, surrogate=surrogate, alpha=alpha)
    return neuron_multistep(x, p, None, v_init, return_state, return_membrane, backend)


def plif(
    x: torch.Tensor,
    w: torch.Tensor,
    v_threshold: float = 1.0,
    v_reset: float | None = 0.0,
    decay_input: bool = True,
    detach_reset: bool = False,
    surrogate: str = "sigmoid",
    alpha: float | None = None,
    v_init: torch.Tensor | None = None,
    return_state: bool = False,
    return_membrane: bool = False,
    backend: str = "auto",
) -> torch.Tensor | NeuronOutput:
    """Parametric LIF over ``x`` ``[T, ...]`` with learnable ``w`` (``1 / tau = sigmoid(w)``)."""
    p = NeuronParams("plif", v_threshold=v_threshold, v_reset=v_reset, decay_input=decay_input,
                     detach_reset=detach_reset, surrogate=surrogate, alpha=alpha)
    return neuron_multistep(x, p, w, v_init, return_state, return_membrane, backend)
