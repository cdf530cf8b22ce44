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
from .layers import MultiStep, SpikeConv2d, TemporalDropout, set_spike_fp8
from .neurons import IF, LIF, NEURONS, PLIF, BaseNeuron, build_neuron, register_neuron, set_backend
from .norm import NORMS, LayerNorm, LayerNorm2d, build_norm2d
from .norm_neuron import NormNeuron, norm_add_neuron, norm_neuron_add, norm_neuron_max_pool
from .pool import SpikeMaxPool2d
from .psn import PSN, MaskedPSN, ParallelNeuron, SlidingPSN
from .step_neuron import StepNeuron, UnsupportedOp
from .surrogate import SURROGATES, spike

__all__ = [
    "ALIF", "CLIF", "CUBALIF", "EIF", "IF", "ILIF", "KLIF", "LIF", "NEURONS", "NORMS", "PLIF", "PSN", "QIF", "RAF",
    "BaseNeuron", "ChannelwisePLIF", "Izhikevich", "LayerNorm", "LayerNorm2d", "LearnableThresholdLIF", "MaskedPSN",
    "MultiStep", "NormNeuron", "ParallelNeuron", "SURROGATES", "SlidingPSN", "SpikeConv2d", "SpikeMaxPool2d",
    "StepNeuron", "TemporalDropout", "UnsupportedOp", "build_neuron", "build_norm2d", "functional",
    "norm_add_neuron", "norm_neuron_add", "norm_neuron_max_pool", "register_neuron", "set_backend", "set_spike_fp8", "spike",
]
