"""Modules users compose into spiking networks."""

from . import functional
from .families import (
    ALIF,
    CLIF,
    CUBALIF,
    EIF,
    ILIF,
    KLIF,
    QIF,
    RAF,
    ChannelwisePLIF,
    Izhikevich,
    LearnableThresholdLIF,
)
from .layers import MultiStep, TemporalDropout
from .neurons import IF, LIF, NEURONS, PLIF, BaseNeuron, build_neuron, register_neuron, set_backend
from .norm import NORMS, LayerNorm, LayerNorm2d, build_norm2d
from .norm_neuron import NormNeuron
from .step_neuron import StepNeuron, UnsupportedOp
from .surrogate import SURROGATES, spike

__all__ = [
    "ALIF", "CLIF", "CUBALIF", "EIF", "IF", "ILIF", "KLIF", "LIF", "NEURONS", "NORMS", "PLIF", "QIF", "RAF",
    "BaseNeuron", "ChannelwisePLIF", "Izhikevich", "LayerNorm", "LayerNorm2d", "LearnableThresholdLIF", "MultiStep",
    "NormNeuron", "SURROGATES", "StepNeuron", "TemporalDropout", "UnsupportedOp", "build_neuron", "build_norm2d",
    "functional", "register_neuron", "set_backend", "spike",
]
