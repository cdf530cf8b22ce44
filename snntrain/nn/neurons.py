"""Multi-step spiking neuron modules: :class:`IF`, :class:`LIF`, :class:`PLIF`.

Each module maps ``[T, ...]`` input currents to ``[T, ...]`` spikes in the input's
dtype (see :mod:`snntrain.nn.functional` for the dynamics). The state starts fresh
on every call unless ``v_init`` is passed, so a module holds no hidden state
between batches. The ``backend`` attribute can be changed at any time (for example
with :func:`set_backend`); it never changes the state-dict.
"""

from __future__ import annotations

import torch
from torch import nn

from ..backend import check_backend
from ..validation import one_of
from . import functional as F


class BaseNeuron(nn.Module):
    """Common parts of the neuron modules.

    Args:
        v_threshold: firing threshold.
        v_reset: reset potential (hard reset), or ``None`` for soft reset (subtract threshold).
        detach_reset: stop the gradient through the spike in the reset.
        surrogate: surrogate gradient name (``sigmoid``, ``atan``, ``piecewise_quadratic``).
        alpha: surrogate sharpness (None: the surrogate's default).
        backend: ``auto``, ``torch`` or ``triton``.
        store_v_seq: keep the membrane trace of the last call in ``self.v_seq`` (detached,
            float32, for monitoring).
    """

    kind = ""

    def __init__(
        self,
        *,
        tau: float = 2.0,
        v_threshold: float = 1.0,
        v_reset: float | None = 0.0,
        decay_input: bool = True,
        detach_reset: bool = False,
        surrogate: str = "sigmoid",
        alpha: float | None = None,
        backend: str = "auto",
        store_v_seq: bool = False,
    ) -> None:
        super().__init__()
        self.params = F.NeuronParams(
            self.kind, tau=tau, v_threshold=v_threshold, v_reset=v_reset, decay_input=decay_input,
            detach_reset=detach_reset, surrogate=surrogate, alpha=alpha,
        )
        self.backend = check_backend(backend)
        self.store_v_seq = bool(store_v_seq)
        self.v_seq: torch.Tensor | None = None

    def _w(self) -> torch.Tensor | None:
        return None

    def forward(
        self, x: torch.Tensor, v_init: torch.Tensor | None = None, return_state: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Spikes for ``x`` ``[T, ...]``; with ``return_state`` also the final membrane (float32)."""
        out = F.neuron_multistep(
            x, self.params, self._w(), v_init, return_state=return_state, return_membrane=self.store_v_seq,
            backend=self.backend,
        )
        if not isinstance(out, tuple):
            return out
        if self.store_v_seq:
            self.v_seq = out.v_seq.detach()
        if return_state:
            return out.spikes, out.v_final
        return out.spikes

    def extra_repr(self) -> str:
        p = self.params
        parts = []
        if p.kind == "lif":
            parts.append(f"tau={p.tau}")
        parts += [f"v_threshold={p.v_threshold}", f"v_reset={p.v_reset}"]
        if p.kind != "if":
            parts.append(f"decay_input={p.decay_input}")
        parts += [f"detach_reset={p.detach_reset}", f"surrogate={p.surrogate}(alpha={p.alpha})",
                  f"backend={self.backend}"]
        return ", ".join(parts)


class IF(BaseNeuron):
    """Integrate-and-fire: ``H = V + X``."""

    kind = "if"

    def __init__(
        self,
        v_threshold: float = 1.0,
        v_reset: float | None = 0.0,
        detach_reset: bool = False,
        surrogate: str = "sigmoid",
        alpha: float | None = None,
        backend: str = "auto",
        store_v_seq: bool = False,
    ) -> None:
        super().__init__(v_threshold=v_threshold, v_reset=v_reset, detach_reset=detach_reset,
                         surrogate=surrogate, alpha=alpha, backend=backend, store_v_seq=store_v_seq)


class LIF(BaseNeuron):
    """Leaky integrate-and-fire with a fixed time constant ``tau`` (> 1)."""

    kind = "lif"

    def __init__(
        self,
        tau: float = 2.0,
        v_threshold: float = 1.0,
        v_reset: float | None = 0.0,
        decay_input: bool = True,
        detach_reset: bool = False,
        surrogate: str = "sigmoid",
        alpha: float | None = None,
        backend: str = "auto",
        store_v_seq: bool = False,
    ) -> None:
        super().__init__(tau=tau, v_threshold=v_threshold, v_reset=v_reset, decay_input=decay_input,
                         detach_reset=detach_reset, surrogate=surrogate, alpha=alpha, backend=backend,
                         store_v_seq=store_v_seq)


class PLIF(BaseNeuron):
    """Parametric LIF: ``1 / tau = sigmoid(w)`` with ``w`` learned, initialised from ``init_tau``."""

    kind = "plif"

    def __init__(
        self,
        init_tau: float = 2.0,
        v_threshold: float = 1.0,
        v_reset: float | None = 0.0,
        decay_input: bool = True,
        detach_reset: bool = False,
        surrogate: str = "sigmoid",
        alpha: float | None = None,
        backend: str = "auto",
        store_v_seq: bool = False,
    ) -> None:
        super().__init__(v_threshold=v_threshold, v_reset=v_reset, decay_input=decay_input,
                         detach_reset=detach_reset, surrogate=surrogate, alpha=alpha, backend=backend,
                         store_v_seq=store_v_seq)
        self.w = nn.Parameter(torch.tensor(F.plif_w_from_tau(init_tau), dtype=torch.float32))

    def _w(self) -> torch.Tensor:
        return self.w

    @property
    def tau(self) -> float:
        """The current time constant ``1 / sigmoid(w)``."""
        return float(1.0 / torch.sigmoid(self.w.detach()))

    def extra_repr(self) -> str:
        return f"tau={self.tau:.4g}, " + super().extra_repr()


NEURONS: dict[str, type[BaseNeuron]] = {"IF": IF, "LIF": LIF, "PLIF": PLIF}


def build_neuron(type: str = "LIF", **kwargs) -> BaseNeuron:
    """Build a neuron from config values: ``type`` is ``IF``, ``LIF`` or ``PLIF`` (for which ``tau`` is
    taken as ``init_tau``, as the model config's ``neuron.tau`` documents)."""
    one_of("neuron type", type, NEURONS)
    cls = NEURONS[type]
    if type == "PLIF" and "tau" in kwargs:  # the config's tau is PLIF's initial time constant
        if "init_tau" in kwargs:
            raise ValueError("neuron PLIF got both tau and init_tau; give one (its initial time constant)")
        kwargs = dict(kwargs)
        kwargs["init_tau"] = kwargs.pop("tau")
    try:
        return cls(**kwargs)
    except TypeError as err:
        import inspect

        valid = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
        raise ValueError(f"bad parameter for neuron {type}: {err}; valid parameters: {', '.join(valid)}") from None


def set_backend(module: nn.Module, backend: str) -> nn.Module:
    """Switch every backend-aware layer inside ``module`` to ``backend``; returns ``module``."""
    check_backend(backend)
    for m in module.modules():
        if hasattr(m, "backend") and isinstance(getattr(m, "backend"), str):
            m.backend = backend
    return module
