"""Neuron families written as :class:`~snntrain.nn.StepNeuron` steps.

Each runs on the generated Triton kernels (``backend`` ``triton``/``auto`` on CUDA) or as a PyTorch
loop (``torch``), and is registered for ``model.neuron.type=NAME`` and
:func:`snntrain.nn.build_neuron` under the name in brackets. Parameter names are SpikingJelly's, and
the dynamics are those of its node of the same name, operation for operation, so that both give the
same spikes, states and gradients:

====================  =============================================  ================================
family                SpikingJelly 2.0                                states
====================  =============================================  ================================
``KLIF``              ``KLIFNode`` (learnable scale ``k``)            v
``CLIF``              ``ComplementaryLIFNode``                        v, m
``CUBALIF``           ``CUBALIFNode``                                 v, c
``QIF``               ``QIFNode``                                     v
``EIF``               ``EIFNode``                                     v
``Izhikevich``        ``IzhikevichNode``                              v, w
``RAF``               ``RAFNode``                                     v, u
``ILIF``              ``ILIFNode`` (multi-level spike counts)         v
``ALIF``              (none: LIF with an adaptive threshold)          v, a
``ChannelwisePLIF``   ``ParametricLIFNode`` with one ``w`` per channel v
``LearnableThresholdLIF``  ``LIFNode`` with a learnable threshold     v
====================  =============================================  ================================

Surrogates are snntrain's (``surrogate`` and ``alpha``, :mod:`snntrain.nn.surrogate`); SpikingJelly's
``surrogate_function`` objects map to them by name (``Sigmoid`` -> ``sigmoid``, ``ATan`` -> ``atan``,
``PiecewiseQuadratic`` -> ``piecewise_quadratic``). CLIF and CUBALIF default to ``sigmoid`` here where
SpikingJelly's default is ``Rect``, which snntrain does not have. ``v_reset=None`` selects the soft reset
(subtract the threshold) where SpikingJelly offers it; the membrane starts at ``v_reset`` (0 for a soft
reset) as there.

ALIF (an adaptive threshold, as in Bellec et al. 2018's LSNN) charges like a LIF, fires when
``H >= v_threshold + beta * a`` and keeps a spike trace ``a <- a - a / tau_a + S``; the reset subtracts
the adapted threshold (soft) or sets ``v_reset`` (hard).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .functional import plif_w_from_tau
from .step_neuron import StepNeuron

__all__ = ["ALIF", "CLIF", "CUBALIF", "EIF", "FAMILIES", "ILIF", "KLIF", "QIF", "RAF", "ChannelwisePLIF",
           "Izhikevich", "LearnableThresholdLIF"]


def _tau(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value) > 1.0:
        raise ValueError(f"{name}={value!r} must be a number > 1 (a time constant, in steps)")
    return float(value)


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value) > 0.0:
        raise ValueError(f"{name}={value!r} must be a positive number")
    return float(value)


class _Resetting(StepNeuron):
    """What the families with SpikingJelly's ``voltage_reset`` share: the hard (``v_reset`` a number) or
    soft (None) reset, ``detach_reset``, and the membrane's start at ``v_reset`` (0 when soft)."""

    def _reset_options(self, v_reset: float | None, detach_reset: bool) -> float:
        self.hard_reset = v_reset is not None
        self.detach_reset = bool(detach_reset)
        return 0.0 if v_reset is None else float(v_reset)

    def reset(self, h, s, v_threshold, v_reset):
        """SpikingJelly's ``voltage_reset``: ``S v_reset + (1 - S) H`` or ``H - S v_threshold``."""
        r = s.detach() if self.detach_reset else s
        if self.hard_reset:
            return r * v_reset + (1.0 - r) * h
        return h - r * v_threshold

    def _hard_reset_for_nir(self) -> None:
        if not self.hard_reset:
            raise ValueError(f"{type(self).__name__} with a soft reset (v_reset=None, subtract the threshold) has no "
                             "NIR form: NIR's neurons reset to v_reset. Train with a hard reset to export to NIR")

    def _value(self, name: str) -> float | torch.Tensor:
        t = getattr(self, name).detach().float()
        return float(t) if t.dim() == 0 else t

    def _lif_charge(self, x, v, tau, v_reset):
        """SpikingJelly's LIF charge, dividing by ``tau`` (``v_reset`` is 0 for a soft reset)."""
        if self.decay_input:
            return v + (x - (v - v_reset)) / tau
        return v - (v - v_reset) / tau + x


class KLIF(_Resetting):
    """K-based LIF (SpikingJelly ``KLIFNode``): the charged membrane scaled by a learnable ``k`` through a ReLU."""

    nir_reason = "KLIF scales the charged membrane by a learned k through a ReLU"

    defaults = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0, "k": 1.0}

    def __init__(self, scale_reset: bool = False, tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, detach_reset: bool = False, surrogate: str = "sigmoid",
                 alpha: float | None = None, backend: str = "auto", **options) -> None:
        self.scale_reset, self.decay_input = bool(scale_reset), bool(decay_input)
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0}
        options.setdefault("learnable", ("k",))
        super().__init__(tau=_tau("tau", tau), v_threshold=v_threshold, v_reset=v_reset, surrogate=surrogate,
                         alpha=alpha, backend=backend, **options)

    def step(self, x, v, tau, v_threshold, v_reset, k):
        h = torch.relu(k * self._lif_charge(x, v, tau, v_reset))
        s = self.heaviside(h - v_threshold)
        if self.scale_reset:
            return s, self.reset(h / k, s, v_threshold / k, v_reset)
        return s, self.reset(h, s, v_threshold, v_reset)


class CLIF(StepNeuron):
    """Complementary LIF (SpikingJelly ``ComplementaryLIFNode``): a second state ``m`` that raises the soft
    reset by ``sigmoid(m)``."""

    nir_reason = "CLIF's reset depends on a second state through a sigmoid"

    states = {"v": 0.0, "m": 0.0}
    defaults = {"tau": 2.0, "v_threshold": 1.0}

    def __init__(self, tau: float = 2.0, v_threshold: float = 1.0, surrogate: str = "sigmoid",
                 alpha: float | None = None, backend: str = "auto", **options) -> None:
        super().__init__(tau=_tau("tau", tau), v_threshold=v_threshold, surrogate=surrogate, alpha=alpha,
                         backend=backend, **options)

    def step(self, x, v, m, tau, v_threshold):
        h = v - (v - 0.0) / tau + x
        decayed = m * torch.sigmoid(h / tau)
        s = self.heaviside(h - v_threshold)
        m = decayed + s
        return s, h - s * (v_threshold + torch.sigmoid(m)), m


class CUBALIF(_Resetting):
    """Current-based LIF (SpikingJelly ``CUBALIFNode``): a synaptic current ``c`` decaying by ``c_decay``
    feeds the membrane, which decays by ``v_decay``."""

    defaults = {"c_decay": 0.5, "v_decay": 0.75, "v_threshold": 0.5, "v_reset": 0.0}

    def __init__(self, c_decay: float = 0.5, v_decay: float = 0.75, v_threshold: float = 0.5,
                 v_reset: float | None = 0.0, detach_reset: bool = False, surrogate: str = "sigmoid",
                 alpha: float | None = None, backend: str = "auto", **options) -> None:
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0, "c": 0.0}
        super().__init__(c_decay=c_decay, v_decay=v_decay, v_threshold=v_threshold, v_reset=v_reset,
                         surrogate=surrogate, alpha=alpha, backend=backend, **options)

    def nir_form(self):
        """NIR's ``CubaLIF`` with the synaptic current of the same step (as :func:`snntrain.nir_graph` writes it)."""
        self._hard_reset_for_nir()
        return "CubaLIF", {n: self._value(n) for n in ("c_decay", "v_decay", "v_threshold", "v_reset")}

    def step(self, x, v, c, c_decay, v_decay, v_threshold, v_reset):
        c = c * c_decay + x
        h = v * v_decay + c
        s = self.heaviside(h - v_threshold)
        return s, self.reset(h, s, v_threshold, v_reset), c


class QIF(_Resetting):
    """Quadratic integrate-and-fire (SpikingJelly ``QIFNode``)."""

    nir_reason = "QIF integrates a quadratic function of the membrane"

    defaults = {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_threshold": 1.0, "v_rest": 0.0, "v_reset": -0.1}

    def __init__(self, tau: float = 2.0, v_c: float = 0.8, a0: float = 1.0, v_threshold: float = 1.0,
                 v_rest: float = 0.0, v_reset: float | None = -0.1, detach_reset: bool = False,
                 surrogate: str = "sigmoid", alpha: float | None = None, backend: str = "auto", **options) -> None:
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0}
        super().__init__(tau=_tau("tau", tau), v_c=v_c, a0=_positive("a0", a0), v_threshold=v_threshold,
                         v_rest=v_rest, v_reset=v_reset, surrogate=surrogate, alpha=alpha, backend=backend,
                         **options)

    def step(self, x, v, tau, v_c, a0, v_threshold, v_rest, v_reset):
        h = v + (x + a0 * (v - v_rest) * (v - v_c)) / tau
        s = self.heaviside(h - v_threshold)
        return s, self.reset(h, s, v_threshold, v_reset)


class EIF(_Resetting):
    """Exponential integrate-and-fire (SpikingJelly ``EIFNode``)."""

    nir_reason = "EIF integrates an exponential function of the membrane"

    defaults = {"tau": 2.0, "delta_T": 1.0, "theta_rh": 0.8, "v_threshold": 1.0, "v_rest": 0.0, "v_reset": -0.1}

    def __init__(self, tau: float = 2.0, delta_T: float = 1.0, theta_rh: float = 0.8, v_threshold: float = 1.0,
                 v_rest: float = 0.0, v_reset: float | None = -0.1, detach_reset: bool = False,
                 surrogate: str = "sigmoid", alpha: float | None = None, backend: str = "auto", **options) -> None:
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0}
        super().__init__(tau=_tau("tau", tau), delta_T=_positive("delta_T", delta_T), theta_rh=theta_rh,
                         v_threshold=v_threshold, v_rest=v_rest, v_reset=v_reset, surrogate=surrogate, alpha=alpha,
                         backend=backend, **options)

    def step(self, x, v, tau, delta_T, theta_rh, v_threshold, v_rest, v_reset):
        h = v + (x + v_rest - v + delta_T * torch.exp((v - theta_rh) / delta_T)) / tau
        s = self.heaviside(h - v_threshold)
        return s, self.reset(h, s, v_threshold, v_reset)


class Izhikevich(_Resetting):
    """Izhikevich-style adaptive QIF (SpikingJelly ``IzhikevichNode``): a recovery state ``w``."""

    nir_reason = "Izhikevich integrates a quadratic function of the membrane and a recovery state"

    defaults = {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_threshold": 1.0, "v_reset": 0.0, "v_rest": -0.1,
                "w_rest": 0.0, "tau_w": 2.0, "a": 0.0, "b": 0.0}

    def __init__(self, tau: float = 2.0, v_c: float = 0.8, a0: float = 1.0, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, v_rest: float = -0.1, w_rest: float = 0.0, tau_w: float = 2.0,
                 a: float = 0.0, b: float = 0.0, detach_reset: bool = False, surrogate: str = "sigmoid",
                 alpha: float | None = None, backend: str = "auto", **options) -> None:
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0, "w": "w_rest"}
        super().__init__(tau=_tau("tau", tau), v_c=v_c, a0=_positive("a0", a0), v_threshold=v_threshold,
                         v_reset=v_reset, v_rest=v_rest, w_rest=w_rest, tau_w=tau_w, a=a, b=b, surrogate=surrogate,
                         alpha=alpha, backend=backend, **options)

    def step(self, x, v, w, tau, v_c, a0, v_threshold, v_reset, v_rest, w_rest, tau_w, a, b):
        h = v + (x + a0 * (v - v_rest) * (v - v_c) - w) / tau
        s = self.heaviside(h - v_threshold)
        w = w + (a * (h - v_rest) - w) / tau_w + b * s
        return s, self.reset(h, s, v_threshold, v_reset), w


class RAF(_Resetting):
    """Resonate-and-fire (SpikingJelly ``RAFNode``): the membrane ``v`` and current ``u`` rotate by
    ``omega * dt`` and decay by ``exp(b * dt)`` each step (those three factors are computed once, in
    double precision, as there)."""

    nir_reason = "RAF rotates a pair of states (a resonator)"

    states = {"v": 0.0, "u": 0.0}
    defaults = {"decay": math.exp(-0.2), "cos_theta": math.cos(1.0), "sin_theta": math.sin(1.0), "v_threshold": 1.0,
                "v_reset": 0.0}

    def __init__(self, b: float = -0.2, omega: float = 1.0, dt: float = 1.0, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, detach_reset: bool = False, surrogate: str = "sigmoid",
                 alpha: float | None = None, backend: str = "auto", **options) -> None:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not b < 0.0:
            raise ValueError(f"b={b!r} must be a negative number (the decay rate)")
        omega, dt = _positive("omega", omega), _positive("dt", dt)
        self.b, self.omega, self.dt = float(b), omega, dt
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0, "u": 0.0}
        super().__init__(decay=math.exp(b * dt), cos_theta=math.cos(omega * dt), sin_theta=math.sin(omega * dt),
                         v_threshold=v_threshold, v_reset=v_reset, surrogate=surrogate, alpha=alpha, backend=backend,
                         **options)

    def step(self, x, v, u, decay, cos_theta, sin_theta, v_threshold, v_reset):
        u_charged = decay * (u * cos_theta - v * sin_theta) + x
        v_charged = decay * (u * sin_theta + v * cos_theta)
        s = self.heaviside(v_charged - v_threshold)
        return s, self.reset(v_charged, s, v_threshold, v_reset), u_charged


class ILIF(StepNeuron):
    """Integer LIF (SpikingJelly ``ILIFNode`` with ``MultiLevelSpikeCount(max_spike_count)``): emits spike
    counts ``round(clamp(H / v_threshold, 0, max_spike_count))`` with a straight-through gradient on
    ``[grad_window]`` (default ``[0, max_spike_count]``), a soft reset by the count times the threshold,
    no input decay (``H = (1 - 1/tau) V + X``)."""

    nir_reason = "ILIF fires multi-level spike counts, not spikes"

    states = {"v": 0.0}
    defaults = {"decay": 0.25, "v_threshold": 1.0}

    def __init__(self, tau: float = 4.0 / 3.0, v_threshold: float = 1.0, max_spike_count: int = 4,
                 grad_window: tuple[float, float] | None = None, detach_reset: bool = False,
                 backend: str = "auto", **options) -> None:
        if isinstance(max_spike_count, bool) or not isinstance(max_spike_count, int) or max_spike_count < 1:
            raise ValueError(f"max_spike_count={max_spike_count!r} must be an int >= 1")
        lo, hi = (0.0, float(max_spike_count)) if grad_window is None else map(float, grad_window)
        if lo > hi:
            raise ValueError(f"grad_window={grad_window!r} must satisfy grad_min <= grad_max")
        self.max_spike_count, self.grad_window, self.detach_reset = max_spike_count, (lo, hi), bool(detach_reset)
        _positive("v_threshold", v_threshold)
        self.tau = _tau("tau", tau)
        super().__init__(decay=1.0 - 1.0 / self.tau, v_threshold=v_threshold, backend=backend, **options)

    def step(self, x, v, decay, v_threshold):
        h = decay * v + x
        scaled = h / v_threshold
        lo, hi = self.grad_window
        window = (scaled >= lo) & (scaled <= hi)
        counts = torch.round(torch.clamp(scaled, 0.0, float(self.max_spike_count)))
        s = counts + window * (scaled - scaled.detach())
        r = s.detach() if self.detach_reset else s
        return s, h - r * v_threshold

    @property
    def spike_max(self) -> int:
        """The counts are the integers ``0..max_spike_count``."""
        return self.max_spike_count


class ALIF(_Resetting):
    """LIF with an adaptive threshold ``v_threshold + beta * a``; ``a`` decays with ``tau_a`` and grows by one
    per spike."""

    nir_reason = "ALIF's threshold adapts with a second state"

    defaults = {"tau": 2.0, "tau_a": 20.0, "beta": 0.2, "v_threshold": 1.0, "v_reset": 0.0}

    def __init__(self, tau: float = 2.0, tau_a: float = 20.0, beta: float = 0.2, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, decay_input: bool = True, detach_reset: bool = False,
                 surrogate: str = "sigmoid", alpha: float | None = None, backend: str = "auto", **options) -> None:
        self.decay_input = bool(decay_input)
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0, "a": 0.0}
        super().__init__(tau=_tau("tau", tau), tau_a=_tau("tau_a", tau_a), beta=beta, v_threshold=v_threshold,
                         v_reset=v_reset, surrogate=surrogate, alpha=alpha, backend=backend, **options)

    def step(self, x, v, a, tau, tau_a, beta, v_threshold, v_reset):
        h = self._lif_charge(x, v, tau, v_reset)
        theta = v_threshold + beta * a
        s = self.heaviside(h - theta)
        return s, self.reset(h, s, theta, v_reset), a - a / tau_a + s


class ChannelwisePLIF(_Resetting):
    """Parametric LIF with one learnable time constant per channel: ``1 / tau_c = sigmoid(w_c)``, each ``w_c``
    initialised from ``init_tau`` (SpikingJelly ``ParametricLIFNode`` has one ``w`` per layer)."""

    defaults = {"w": 0.0, "v_threshold": 1.0, "v_reset": 0.0}

    def __init__(self, channels: int, init_tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, detach_reset: bool = False, surrogate: str = "sigmoid",
                 alpha: float | None = None, backend: str = "auto", **options) -> None:
        self.decay_input = bool(decay_input)
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0}
        super().__init__(w=plif_w_from_tau(init_tau), v_threshold=v_threshold, v_reset=v_reset, channels=channels,
                         learnable=("w",), per_channel=("w",), surrogate=surrogate, alpha=alpha, backend=backend,
                         **options)

    def step(self, x, v, w, v_threshold, v_reset):
        q = torch.sigmoid(w)
        if self.decay_input:
            h = v + (x - (v - v_reset)) * q
        else:
            h = v - (v - v_reset) * q + x
        s = self.heaviside(h - v_threshold)
        return s, self.reset(h, s, v_threshold, v_reset)

    def nir_form(self):
        self._hard_reset_for_nir()
        tau = 1.0 / torch.sigmoid(self.w.detach().float())  # the time constants the step uses
        return "LIF", {"tau_steps": tau, "r": 1.0 if self.decay_input else tau,
                       "v_threshold": self._value("v_threshold"), "v_reset": self._value("v_reset")}

    @property
    def tau(self) -> torch.Tensor:
        """The time constants ``1 / sigmoid(w)``, one per channel."""
        return 1.0 / torch.sigmoid(self.w.detach())


class LearnableThresholdLIF(_Resetting):
    """LIF (SpikingJelly ``LIFNode``'s dynamics) whose ``v_threshold`` is learned: one value, or one per channel
    with ``channelwise=True`` (then ``channels`` is needed)."""

    defaults = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}

    def __init__(self, tau: float = 2.0, v_threshold: float = 1.0, v_reset: float | None = 0.0,
                 decay_input: bool = True, detach_reset: bool = False, channelwise: bool = False,
                 channels: int | None = None, surrogate: str = "sigmoid", alpha: float | None = None,
                 backend: str = "auto", **options) -> None:
        self.decay_input = bool(decay_input)
        v_reset = self._reset_options(v_reset, detach_reset)
        self.states = {"v": "v_reset" if self.hard_reset else 0.0}
        if channelwise and channels is None:
            raise ValueError("LearnableThresholdLIF(channelwise=True) needs channels, the channel count")
        super().__init__(tau=_tau("tau", tau), v_threshold=v_threshold, v_reset=v_reset,
                         channels=channels if channelwise else None, learnable=("v_threshold",),
                         per_channel=("v_threshold",) if channelwise else (), surrogate=surrogate, alpha=alpha,
                         backend=backend, **options)

    def nir_form(self):
        self._hard_reset_for_nir()
        tau = self._value("tau")
        return "LIF", {"tau_steps": tau, "r": 1.0 if self.decay_input else tau,
                       "v_threshold": self._value("v_threshold"), "v_reset": self._value("v_reset")}

    def step(self, x, v, tau, v_threshold, v_reset):
        h = self._lif_charge(x, v, tau, v_reset)
        s = self.heaviside(h - v_threshold)
        return s, self.reset(h, s, v_threshold, v_reset)


#: registry name -> class (registered in :data:`snntrain.nn.neurons.NEURONS`)
FAMILIES: dict[str, type[nn.Module]] = {
    "KLIF": KLIF, "CLIF": CLIF, "CUBALIF": CUBALIF, "QIF": QIF, "EIF": EIF, "Izhikevich": Izhikevich, "RAF": RAF,
    "ILIF": ILIF, "ALIF": ALIF, "ChannelwisePLIF": ChannelwisePLIF, "LearnableThresholdLIF": LearnableThresholdLIF,
}
