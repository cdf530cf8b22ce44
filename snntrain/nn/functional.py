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

from ..backend import check_backend, use_triton
from ..validation import flag, number
from .surrogate import SpikeFunction, check_surrogate

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


def _heaviside(u: torch.Tensor) -> torch.Tensor:
    return (u >= 0).to(u.dtype)


def _reference(
    x: torch.Tensor,
    p: NeuronParams,
    w: torch.Tensor | None,
    v_init: torch.Tensor | None,
    return_membrane: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Pure-PyTorch multi-step loop; autograd provides the backward."""
    v_r = p.v_reset if p.hard_reset else 0.0
    if v_init is None:
        v = torch.full(x.shape[1:], v_r, dtype=torch.float32, device=x.device)
    else:
        v = v_init.to(torch.float32)
    if p.kind == "plif":
        k = torch.sigmoid(w.to(torch.float32))
    elif p.kind == "lif":
        k = 1.0 / p.tau
    # the surrogate only matters when a gradient is recorded; inference (and export) uses a plain step
    fire = (lambda u: SpikeFunction.apply(u, p.surrogate, p.alpha)) if torch.is_grad_enabled() else _heaviside
    spikes, trace = [], []
    for t in range(x.shape[0]):
        xt = x[t].to(torch.float32)
        if p.kind == "if":
            h = v + xt
        elif p.decay_input:
            h = v + (xt - (v - v_r)) * k
        else:
            h = v - (v - v_r) * k + xt
        s = fire(h - p.v_threshold)
        s_reset = s.detach() if p.detach_reset else s
        if p.hard_reset:
            v = h * (1.0 - s_reset) + p.v_reset * s_reset
        else:
            v = h - p.v_threshold * s_reset
        spikes.append(s.to(x.dtype))
        if return_membrane:
            trace.append(v)
    v_seq = torch.stack(trace) if return_membrane else None
    return torch.stack(spikes), v, v_seq


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
    check_backend(backend)
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
        spikes, v_final, v_seq = _reference(x, params, w, v_init, return_membrane)
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
