"""Modules users compose into spiking networks."""

from . import functional
from .neurons import IF, LIF, PLIF, BaseNeuron, build_neuron, set_backend
from .surrogate import SURROGATES, spike

__all__ = ["IF", "LIF", "PLIF", "BaseNeuron", "SURROGATES", "build_neuron", "functional", "set_backend", "spike"]
