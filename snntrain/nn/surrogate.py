"""Surrogate gradients for the Heaviside spike function.

The forward pass of a spike is always ``S = heaviside(x) = (x >= 0)`` with
``x = H - v_threshold``; the backward pass replaces the Dirac delta with the
derivative of a smooth function of sharpness ``alpha``:

====================  ==============  ===============================================
name                  default alpha   dS/dx
====================  ==============  ===============================================
sigmoid               4.0             alpha * sg * (1 - sg),  sg = sigmoid(alpha * x)
atan                  2.0             (alpha / 2) / (1 + (pi / 2 * alpha * x) ** 2)
piecewise_quadratic   1.0             max(alpha - alpha ** 2 * |x|, 0)
====================  ==============  ===============================================

The formulas follow SpikingJelly's ``surrogate.Sigmoid``, ``surrogate.ATan`` and
``surrogate.PiecewiseQuadratic``. The Triton kernels implement the same table.
"""

from __future__ import annotations

import math

import torch

from ..kernels.neuron_graph import Proxy, spike_node
from ..validation import one_of

SURROGATES: dict[str, float] = {
    "sigmoid": 4.0,
    "atan": 2.0,
    "piecewise_quadratic": 1.0,
}


def check_surrogate(name: object, alpha: object = None) -> tuple[str, float]:
    """Validate a surrogate name and sharpness; return ``(name, alpha)`` with the default filled in."""
    one_of("surrogate", name, SURROGATES)
    if alpha is None:
        return name, SURROGATES[name]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"alpha={alpha!r} must be a positive number")
    alpha = float(alpha)
    if not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha={alpha!r} must be a positive, finite number")
    return name, alpha


def surrogate_grad(x: torch.Tensor, name: str, alpha: float) -> torch.Tensor:
    """dS/dx of the surrogate ``name`` at ``x`` (same dtype as ``x``; a new tensor, ``x`` is not changed)."""
    # each formula works in place on its first temporary: one pass per operation, no further tensors
    if name == "sigmoid":
        # alpha * sg * (1 - sg) written as alpha * e / (1 + e)^2 with e = exp(-alpha |x|): the same
        # function (it is even in x), without the cancellation of 1 - sg where sg is close to 1
        e = x.abs().mul_(-alpha).exp_()
        return e.mul(alpha).div_(e.add_(1.0).square_())
    if name == "atan":
        return x.mul(math.pi / 2.0 * alpha).square_().add_(1.0).reciprocal_().mul_(alpha / 2.0)
    if name == "piecewise_quadratic":
        return x.abs().mul_(-alpha * alpha).add_(alpha).clamp_(min=0.0)
    raise ValueError(f"surrogate={name!r} is not valid; choose one of {', '.join(SURROGATES)}")


class SpikeFunction(torch.autograd.Function):
    """Heaviside forward, surrogate backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, name: str, alpha: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.name = name
        ctx.alpha = alpha
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        return grad_out * surrogate_grad(x, ctx.name, ctx.alpha), None, None


def spike(x: torch.Tensor, name: str = "sigmoid", alpha: float | None = None) -> torch.Tensor:
    """Heaviside step of ``x`` with the surrogate gradient ``name`` (also inside a
    :class:`~snntrain.nn.StepNeuron`'s step, where ``x`` is a traced value)."""
    name, alpha = check_surrogate(name, alpha)
    if isinstance(x, Proxy):
        return spike_node(x, name, alpha)
    return SpikeFunction.apply(x, name, alpha)
