"""Multi-step spiking neuron modules: :class:`IF`, :class:`LIF`, :class:`PLIF`.

Each module maps ``[T, ...]`` input currents to ``[T, ...]`` spikes in the input's
dtype (see :mod:`snntrain.nn.functional` for the dynamics). The state starts fresh
on every call unless ``v_init`` is passed, so a module holds no hidden state
between batches. The ``backend`` attribute can be changed at any time (for example
with :func:`set_backend`); it never changes the state-dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    #: the largest value the neuron fires: its spikes are 0 or 1 (:func:`spike_max`)
    spike_max = 1

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


#: The neuron types of :func:`build_neuron` (``model.neuron.type``): name -> class, or ``"module:attribute"`` for a
#: class imported when first built. :func:`register_neuron` adds to it.
NEURONS: dict[str, type[nn.Module] | str] = {"IF": IF, "LIF": LIF, "PLIF": PLIF}

def register_neuron(name: str, cls: type[nn.Module] | str, *, replace: bool = False) -> None:
    """Make ``cls`` (a module class taking ``[T, ...]`` input, or ``"package.module:Class"`` to import when first
    built) a neuron type of :func:`build_neuron` and ``model.neuron.type`` under ``name``. A name that exists
    is refused unless ``replace``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"neuron type name {name!r} must be a non-empty string")
    if name in NEURONS and not replace:
        raise ValueError(f"neuron type {name!r} is already registered; pass replace=True to replace it")
    if not (isinstance(cls, str) and ":" in cls) and not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"neuron type {name!r}: {cls!r} is neither an nn.Module class nor 'module:Class'")
    NEURONS[name] = cls


def is_neuron(module: object) -> bool:
    """Whether ``module`` is a spiking neuron: an IF/LIF/PLIF, a :class:`~snntrain.nn.StepNeuron` or an instance of
    any registered type (:data:`NEURONS`, those imported so far)."""
    return isinstance(module, tuple(c for c in NEURONS.values() if isinstance(c, type))
                      + (BaseNeuron, _StepNeuron, _ParallelNeuron))


def spike_max(neuron: nn.Module) -> int | None:
    """The largest value ``neuron`` fires where its outputs are the integers ``0..n`` by construction, whatever its
    input: 1 for binary spikes (IF, LIF, PLIF, the parallel spiking neurons, a :class:`~snntrain.nn.StepNeuron`
    whose step returns ``self.heaviside(...)``: every family but ILIF), ILIF's ``max_spike_count``; None where that is
    not known (a registered type that does not declare it). A neuron class declares it as its attribute
    ``spike_max`` (an int >= 1, or None); a subclass that fires other values sets it to None. The model families
    keep the inputs of convolutions that read such outputs packed in the fewest bits that hold them
    (:class:`~snntrain.nn.layers.SpikeConv2d`), and of projections in one byte, which is exact only for integers in
    [0, 255]."""
    n = getattr(neuron, "spike_max", None)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"{type(neuron).__name__}.spike_max={n!r} must be an int >= 1 (the largest value the neuron "
                         "fires) or None (its outputs are not known integers)")
    return n


def neuron_class(type: str) -> type[nn.Module]:
    """The class registered as ``type`` (importing it on first use)."""
    one_of("neuron type", type, NEURONS)
    cls = NEURONS[type]
    if isinstance(cls, str):
        import importlib

        module, _, attr = cls.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"neuron type {type!r} needs {cls}, which is not available: {err}") from None
        NEURONS[type] = cls
    return cls


def neuron_parameters(type: str) -> tuple[list[str], bool]:
    """``(names, takes_any)``: the parameters :func:`build_neuron` accepts for ``type`` (its constructor's, for a
    :class:`~snntrain.nn.StepNeuron` also its dynamics' and StepNeuron's options), and whether the constructor
    takes any keyword besides (the config's ``tau`` is also taken where there is an ``init_tau``)."""
    import inspect

    cls = neuron_class(type)
    params = inspect.signature(cls.__init__).parameters
    named = [n for n, p in params.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    from .step_neuron import StepNeuron

    if issubclass(cls, StepNeuron):  # a step neuron's parameters: its own, its defaults' names, StepNeuron's options
        base = inspect.signature(StepNeuron.__init__).parameters
        named += [n for n in [*cls.defaults, *base] if n not in named and n != "self"
                  and (n not in base or base[n].kind is not inspect.Parameter.VAR_KEYWORD)]
        takes_any = False
    return named, takes_any


def build_neuron(type: str = "LIF", *, channels: int | None = None, T: int | None = None, **kwargs) -> nn.Module:
    """Build a neuron from config values: ``type`` is a name of :data:`NEURONS` (``IF``, ``LIF``, ``PLIF``, the
    families of :mod:`snntrain.nn.families`, ``PSN``, ``MaskedPSN``, ``SlidingPSN`` and any type added with
    :func:`register_neuron`); the other keys are its parameters. ``channels`` (the channel count at the layer,
    dim 1 of a step), ``T`` (the time steps) and ``backend`` are passed to a type whose constructor names them.
    The config's ``tau`` is taken as ``init_tau`` by a type with an initial time constant (PLIF,
    ChannelwisePLIF), as the model config's ``neuron.tau`` documents."""
    cls = neuron_class(type)
    named, takes_any = neuron_parameters(type)
    kwargs = dict(kwargs)
    if type == "PLIF" and "tau" in kwargs:  # the config's tau is PLIF's initial time constant
        if "init_tau" in kwargs:
            raise ValueError("neuron PLIF got both tau and init_tau; give one (its initial time constant)")
        kwargs["init_tau"] = kwargs.pop("tau")
    if "tau" in kwargs and "tau" not in named and "init_tau" in named and "init_tau" not in kwargs:
        kwargs["init_tau"] = kwargs.pop("tau")  # the same reading for every type with an initial time constant
    backend = kwargs.pop("backend", None)
    for name, value in (("channels", channels), ("T", T), ("backend", backend)):
        if value is not None and name in named:
            kwargs[name] = value
    valid = ", ".join(named)
    if not takes_any:
        for key in kwargs:
            if key not in named:
                raise ValueError(f"bad parameter for neuron {type}: {key!r}; valid parameters: {valid}")
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ValueError(f"bad parameter for neuron {type}: {err}; valid parameters: {valid}") from None


def config_neuron(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A model config's neuron section (``type`` and parameters) as :func:`build_neuron`'s arguments. The section
    lists the parameters of the model's default neuron (LIF: ``tau``, ``v_reset``, ``decay_input``, ...), so a key
    that the chosen type does not take, but another registered type does, is left out with one warning naming it
    (``model.neuron.type=IF`` needs no ``~model.neuron.tau``); a key that no type takes stays, for
    :func:`build_neuron` to refuse with the type's parameters."""
    settings = dict(settings)
    type = settings.get("type", "LIF")
    named, takes_any = neuron_parameters(type)
    if takes_any:
        return settings
    accepted = {*named, *(("tau",) if "init_tau" in named else ())}
    # the types imported so far (as is_neuron reads them): building a model imports no other registered type
    known = {n for name, cls in list(NEURONS.items()) if not isinstance(cls, str) for n in neuron_parameters(name)[0]}
    dropped = [k for k in settings if k != "type" and k not in accepted and k in known]
    if dropped:
        import warnings

        warnings.warn(f"neuron {type} has no parameter {', '.join(dropped)}: the model config's "
                      f"{'value' if len(dropped) == 1 else 'values'} for its default neuron "
                      f"{'is' if len(dropped) == 1 else 'are'} not used (valid parameters: {', '.join(named)})",
                      stacklevel=2)
    return {k: v for k, v in settings.items() if k not in dropped}


def set_backend(module: nn.Module, backend: str) -> nn.Module:
    """Switch every backend-aware layer inside ``module`` to ``backend``; returns ``module``."""
    check_backend(backend)
    for m in module.modules():
        if hasattr(m, "backend") and isinstance(getattr(m, "backend"), str):
            m.backend = backend
    return module


# the families (StepNeurons) and the parallel spiking neurons (which take T) are defined in modules of their own
from .families import FAMILIES  # noqa: E402
from .psn import PSN, MaskedPSN, SlidingPSN  # noqa: E402
from .psn import ParallelNeuron as _ParallelNeuron  # noqa: E402
from .step_neuron import StepNeuron as _StepNeuron  # noqa: E402

for _name, _cls in {**FAMILIES, "PSN": PSN, "MaskedPSN": MaskedPSN, "SlidingPSN": SlidingPSN}.items():
    register_neuron(_name, _cls)
