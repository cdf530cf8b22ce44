"""Modules users compose into spiking networks."""

from . import functional
from .layers import MultiStep, TemporalDropout
from .neurons import IF, LIF, PLIF, BaseNeuron, build_neuron, set_backend
from .norm import NORMS, LayerNorm, LayerNorm2d, build_norm2d
from .norm_neuron import NormNeuron
from .pool import SpikeMaxPool2d
from .psn import PSN, MaskedPSN, ParallelNeuron, SlidingPSN
from .surrogate import SURROGATES, spike

__all__ = [
    "IF", "LIF", "NORMS", "PLIF", "PSN", "BaseNeuron", "LayerNorm", "LayerNorm2d", "MaskedPSN", "MultiStep",
    "NormNeuron", "ParallelNeuron", "SURROGATES", "SlidingPSN", "SpikeMaxPool2d", "TemporalDropout", "build_neuron",
    "build_norm2d", "functional", "set_backend", "spike",
]
