"""Parallel spiking neurons: :class:`PSN`, :class:`MaskedPSN`, :class:`SlidingPSN`.

A parallel spiking neuron (Fang et al., "Parallel Spiking Neurons with High Efficiency and Ability to
Learn Long-term Dependencies", NeurIPS 2023) has no reset and no state carried from step to step: its
charge at every step is a learned weighted sum of the inputs of all steps, so a whole sequence is one
product over time,

    H = W X + b,  S = heaviside(H)      (X, H, S: [T, N]; W: [T, T]; b: [T])

with a surrogate gradient for the Heaviside step. The three modules differ in ``W``:

* :class:`PSN`: a full learnable ``[T, T]`` matrix and a learnable threshold per step (``b = -threshold``);
* :class:`MaskedPSN`: ``W`` times a band mask of order ``k`` (step t sees steps ``t - k + 1 .. t``),
  faded in by ``lambda_``: ``W * (lambda_ * M_k + (1 - lambda_) * J)`` (``J`` all ones), so training can
  start from the full matrix and end causal (``lambda_ = 1``);
* :class:`SlidingPSN`: one learnable row of ``k`` weights slid along time (step t sees steps
  ``t - k + 1 .. t`` with the same weights) and one learnable threshold: any T.

Each maps ``[T, N, ...]`` input to spikes of the same shape and dtype (multi-step only). Parameters,
buffers and their names follow SpikingJelly 2.0.0's ``neuron.PSN``, ``MaskedPSN`` and ``SlidingPSN``,
so their state dicts load into each other. ``backend="triton"`` runs the fused kernels of
:mod:`snntrain.kernels.psn` (one pass over the input per direction; the modules hand over their
parameters and buffers as they are, the kernels form the ``[T, T]`` weight (mask and ``lambda_``, or
the slid row) and return the gradients of ``weight`` and ``bias`` themselves, so a call runs no
PyTorch op besides the kernels);
``backend="torch"`` is the reference, ``torch.addmm`` then the surrogate spike, as SpikingJelly
computes it. The surrogate is named (``atan`` by default, as SpikingJelly's ATan), with its
sharpness ``alpha`` (None: the surrogate's default), instead of SpikingJelly's surrogate object.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..backend import check_backend, use_triton
from ..validation import flag, number, positive_int
from .surrogate import SpikeFunction, check_surrogate

__all__ = ["ParallelNeuron", "PSN", "MaskedPSN", "SlidingPSN"]

#: Why a network with a parallel spiking neuron has no NIR graph.
NIR_REFUSAL = ("a parallel spiking neuron (PSN, MaskedPSN, SlidingPSN) charges each step with a learned weighted "
               "sum of the inputs of every step, a product over time that no NIR primitive expresses (NIR's "
               "neurons integrate one step at a time: IF, LIF, CubaLIF)")


class ParallelNeuron(nn.Module):
    """What the parallel spiking neurons share: the surrogate, the backend, input checks and the forward.

    Subclasses define :meth:`temporal_weight`, ``(W [T, T], bias)`` for a sequence of ``T`` steps, with
    ``bias`` of a shape that ``torch.addmm`` broadcasts over ``[T, N]`` (``[T, 1]`` or a scalar): the torch
    backend's product; and :meth:`kernel_args`, the same weight in the form the Triton kernels build it from."""

    #: read by the NIR export (:mod:`snntrain.nir_graph`), which refuses these neurons with this reason
    nir_refusal = NIR_REFUSAL
    #: the largest value the neuron fires: its spikes are 0 or 1 (:func:`snntrain.nn.neurons.spike_max`)
    spike_max = 1

    def __init__(self, surrogate: str = "atan", alpha: float | None = None, step_mode: str = "m",
                 backend: str = "triton") -> None:
        super().__init__()
        self.surrogate, self.alpha = check_surrogate(surrogate, alpha)
        if step_mode != "m":
            raise ValueError(f"step_mode={step_mode!r} is not valid; choose 'm': snntrain's parallel spiking neurons "
                             "run multi-step only (input [T, N, ...])")
        self.step_mode = step_mode
        self.backend = check_backend(backend)

    def temporal_weight(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """``(weight, bias, keywords)`` of :func:`snntrain.kernels.psn.psn_multistep`: the parameters as they are
        (``weight`` ``[T, T]`` or a row ``[K]`` slid along time; ``bias`` with T elements or one) and the
        masked form's ``mask0``, ``mask1``, ``lambda_``."""
        raise NotImplementedError

    def _check_steps(self, T: int) -> None:
        """Refuse a sequence length the module cannot take."""

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        """Spikes ``[T, N, ...]`` (``x_seq``'s dtype) for the input currents ``x_seq`` ``[T, N, ...]``."""
        if not isinstance(x_seq, torch.Tensor):
            raise TypeError(f"{type(self).__name__} takes a tensor [T, N, ...], not {type(x_seq).__name__}")
        if x_seq.dim() < 2:
            raise ValueError(f"{type(self).__name__} takes input [T, N, ...] (at least 2 dimensions); got shape "
                             f"{tuple(x_seq.shape)}")
        if not x_seq.is_floating_point():
            raise TypeError(f"{type(self).__name__} takes floating-point input; got {x_seq.dtype}")
        T = x_seq.shape[0]
        self._check_steps(T)
        if use_triton(self.backend, x_seq):
            from ..kernels import psn as psn_kernels

            weight, bias, masks = self.kernel_args()
            return psn_kernels.psn_multistep(x_seq, weight, bias, self.surrogate, self.alpha, **masks)
        weight, bias = self.temporal_weight(T)
        dt = torch.promote_types(x_seq.dtype, weight.dtype)
        h = torch.addmm(bias.to(dt), weight.to(dt), x_seq.flatten(1).to(dt))
        return SpikeFunction.apply(h, self.surrogate, self.alpha).to(x_seq.dtype).view(x_seq.shape)

    def extra_repr(self) -> str:
        return f"surrogate={self.surrogate}(alpha={self.alpha}), backend={self.backend}"


def _init_square(T: int) -> tuple[nn.Parameter, nn.Parameter]:
    """SpikingJelly's initialisation of a PSN's ``[T, T]`` weight (Kaiming uniform, a = sqrt(5)) and ``[T, 1]``
    bias (-1: threshold 1)."""
    weight = torch.zeros(T, T)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    return nn.Parameter(weight), nn.Parameter(torch.full((T, 1), -1.0))


class PSN(ParallelNeuron):
    """Parallel spiking neuron: ``S = heaviside(W X + b)`` with a learnable ``weight`` ``[T, T]`` and ``bias``
    ``[T, 1]`` (minus the threshold of each step).

    Args:
        T: time steps; the input must have exactly ``T`` (the weight is ``[T, T]``).
        surrogate: surrogate gradient name (``atan``, ``sigmoid``, ``piecewise_quadratic``).
        alpha: surrogate sharpness (None: the surrogate's default).
        backend: ``triton`` (the fused kernels), ``torch`` (the reference) or ``auto``.
    """

    def __init__(self, T: int, surrogate: str = "atan", alpha: float | None = None, backend: str = "triton") -> None:
        super().__init__(surrogate, alpha, "m", backend)
        self.T = positive_int("T", T)
        self.weight, self.bias = _init_square(self.T)

    def _check_steps(self, T: int) -> None:
        if T != self.T:
            raise ValueError(f"{type(self).__name__}(T={self.T}) got input with {T} time steps (shape [T, N, ...]); "
                             f"it takes exactly {self.T}")

    def temporal_weight(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.weight, self.bias

    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        return self.weight, self.bias, {}

    def extra_repr(self) -> str:
        return f"T={self.T}, " + super().extra_repr()


class MaskedPSN(PSN):
    """Masked parallel spiking neuron of order ``k``: ``W`` times ``lambda_ * M_k + (1 - lambda_) * J`` where
    ``M_k[i, j] = 1`` for ``j <= i <= j + k - 1`` (the last ``k`` steps) and ``J`` is all ones.

    ``lambda_`` (a buffer, set during training with ``module.lambda_ = value``) starts at ``lambda_init``;
    from 1 on the weight is ``W * M_k`` (SpikingJelly's progressive masking).

    Args:
        k: order (steps each step sees), a positive integer.
        T: time steps; the input must have exactly ``T``.
        lambda_init: initial ``lambda_``.
        surrogate, alpha, backend: as :class:`PSN`.
        step_mode: ``m`` only (multi-step); SpikingJelly's name, accepted for its configs.
    """

    def __init__(self, k: int, T: int, lambda_init: float = 0.0, surrogate: str = "atan", alpha: float | None = None,
                 step_mode: str = "m", backend: str = "triton") -> None:
        ParallelNeuron.__init__(self, surrogate, alpha, step_mode, backend)
        self.k = positive_int("k", k)
        self.T = positive_int("T", T)
        self.register_buffer("_lambda_", torch.as_tensor(number("lambda_init", lambda_init)))
        self.weight, self.bias = _init_square(self.T)
        ones = torch.ones(self.T, self.T)
        self.register_buffer("mask0", torch.tril(ones) * torch.triu(ones, -(self.k - 1)))
        self.register_buffer("mask1", ones)

    @property
    def lambda_(self) -> torch.Tensor:
        return self._lambda_

    @lambda_.setter
    def lambda_(self, value: float) -> None:
        self._lambda_.fill_(number("lambda_", float(value) if isinstance(value, torch.Tensor) else value))

    def masked_weight(self) -> torch.Tensor:
        """``W * (lambda_ * M_k + (1 - lambda_) * J)``, with ``lambda_`` taken as 1 from 1 on (no host
        synchronisation: the clamp replaces SpikingJelly's comparison on the host, with the same values)."""
        lam = self._lambda_.clamp(max=1.0).to(self.weight.dtype)
        return (lam * self.mask0 + (1.0 - lam) * self.mask1) * self.weight

    def temporal_weight(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.masked_weight(), self.bias

    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        return self.weight, self.bias, {"mask0": self.mask0, "mask1": self.mask1, "lambda_": self._lambda_}

    def extra_repr(self) -> str:
        return f"k={self.k}, lambda_={float(self._lambda_):g}, " + super().extra_repr()


class SlidingPSN(ParallelNeuron):
    """Sliding parallel spiking neuron of order ``k``: ``H[t] = sum_i weight[i] X[t - k + 1 + i] + bias`` (steps
    before 0 count as absent), one learnable row ``weight`` ``[k]`` and threshold ``-bias`` shared by every
    step, so the module takes any number of steps.

    Args:
        k: order (steps each step sees), a positive integer.
        exp_init: initialise ``weight`` as ``(..., 1/4, 1/2, 1)`` (True) or Kaiming uniform (False).
        T: optional: the number of steps the input must have (None: any).
        surrogate, alpha, backend: as :class:`PSN`.
        step_mode: ``m`` only (multi-step); SpikingJelly's name, accepted for its configs.
    """

    def __init__(self, k: int, exp_init: bool = True, surrogate: str = "atan", alpha: float | None = None,
                 step_mode: str = "m", backend: str = "triton", T: int | None = None) -> None:
        super().__init__(surrogate, alpha, step_mode, backend)
        self.k = positive_int("k", k)
        self.T = None if T is None else positive_int("T", T)
        if flag("exp_init", exp_init):
            weight = 0.5 ** torch.arange(self.k - 1, -1, -1, dtype=torch.float32)
        else:
            weight = torch.ones(1, self.k)
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            weight = weight[0]
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.as_tensor(-1.0))

    def _check_steps(self, T: int) -> None:
        if self.T is not None and T != self.T:
            raise ValueError(f"SlidingPSN(T={self.T}) got input with {T} time steps (shape [T, N, ...]); it takes "
                             f"exactly {self.T} (T=None takes any)")

    def gen_gemm_weight(self, T: int) -> torch.Tensor:
        """The ``[T, T]`` matrix of the slid row: ``W[t, j] = weight[k - 1 - (t - j)]`` for ``0 <= t - j < k``,
        else 0 (differentiable in ``weight``)."""
        steps = torch.arange(T, device=self.weight.device)
        lag = steps[:, None] - steps[None, :]
        inside = (lag >= 0) & (lag < self.k)
        rows = self.weight[(self.k - 1 - lag).clamp(0, self.k - 1)]
        return torch.where(inside, rows, torch.zeros((), dtype=self.weight.dtype, device=self.weight.device))

    def temporal_weight(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gen_gemm_weight(T), self.bias

    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        return self.weight, self.bias, {}

    def extra_repr(self) -> str:
        return f"order={self.k}, " + super().extra_repr()
