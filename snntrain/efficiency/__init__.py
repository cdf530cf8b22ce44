"""Efficiency report of a spiking model: firing rates, activation sparsity, synaptic operations,
footprint and energy estimates, counted on the device during validation.

Counting (:class:`ActivityCounter`) uses forward hooks on the model's layers (a
:class:`~snntrain.nn.norm_neuron.NormNeuron` hands its spikes to the counter itself, and its fused
batch-norm kernel adds them up per channel as it fires them, without a second read):

* **Connection layers** (``Linear``, ``Conv1d/2d/3d``): each call's input is counted the way
  NeuroBench's ``SynapticOperations`` counts it. The effective operations of a call are the
  (nonzero input, nonzero weight) pairs that meet in some output, bias not included: the sum
  of the layer's output with the input and the weights binarised (``x != 0``, ``W != 0``);
  zero padding contributes nothing. They are accumulates (ACs) when every input value of the
  call is in ``{-1, 0, 1}``, multiply-accumulates (MACs) otherwise. Dense operations count
  every pair, zeros included (still without padding). Inputs arrive as the layer sees them:
  a SEW ``ADD`` sum (values 0, 1, 2) makes the next convolution's operations MACs, ``AND`` and
  ``IAND`` keep them ACs, the image into the stem is MACs.
* **Spiking layers** (:class:`~snntrain.nn.norm_neuron.NormNeuron`, the fused attention neuron
  :class:`~snntrain.nn.attention.QKVNeuron`, and neurons outside them): spikes per channel and
  neuron-steps, for firing rates and activation sparsity (the fraction of zero outputs, NeuroBench's
  ``ActivationSparsity``). The spiking transformers' projections are ``Linear`` layers over tokens
  ``[T, B, N, C]`` (the ANN equivalent reads every token once); the attention's products of two spike
  tensors (``Q K^T V``, ``K * V``) have no weights and are not synaptic operations in NeuroBench's sense:
  they are not counted (docs/transformers.md gives their operation counts).
* **The model**: how many samples (forward passes of one image) were counted, so that every
  count is reported per sample, like NeuroBench, and per time step (per sample / T).

Every count stays on the device (no host synchronisation per batch): a call writes its counts
into a fresh row of a small per-layer buffer (on CUDA one Triton launch per call, reading the map
once, :mod:`snntrain.kernels.synops`; the PyTorch reference elsewhere), and the rows are folded
into totals every few dozen calls and at the end. :meth:`ActivityCounter.totals` packs all
totals into one float64 tensor (exact below 2**53) so that processes can add theirs in one
collective; :func:`build_report` turns the reduced totals into the report.

Static metrics (:func:`static_metrics`) follow NeuroBench: ``ParameterCount``, ``Footprint``
(bytes of parameters and buffers) and ``ConnectionSparsity`` (zero weights of the connection
layers). Energy estimates (:data:`ENERGY_MODELS`) put the counts through two labelled models,
for the spiking network and for the same network as a non-spiking ANN (ReLU, one step):
a compute-only proxy (0.9 pJ per AC, 4.6 pJ per MAC) and one that also counts memory traffic.
docs/efficiency.md explains every number and where NeuroBench's rules and ours differ.

Modules: :mod:`~snntrain.efficiency.geometry` (fan-out maps, the reference count), :mod:`~snntrain.efficiency.counter`
(:class:`ActivityCounter`), :mod:`~snntrain.efficiency.report` (static metrics, energy, the report, markdown),
:mod:`~snntrain.efficiency.chart` (the per-layer chart); every public name is importable from here.
"""

from .chart import CHART_PALETTE, chart_indices, chart_png, layer_chart
from .counter import ROWS, SELF_COUNTING, ActivityCounter, NotSpiking, check_spiking, spiking_layers
from .geometry import CONNECTIONS, connection_layers, count_reference, fanout_block, fanout_map, geometry, weight_fanin
from .report import BASIS, ENERGY_MODELS, FORMAT, HOROWITZ, UNITS, EnergyModel, build_report, markdown, static_metrics

__all__ = [
    "BASIS", "CHART_PALETTE", "CONNECTIONS", "ENERGY_MODELS", "FORMAT", "HOROWITZ", "ROWS", "SELF_COUNTING", "UNITS",
    "ActivityCounter", "EnergyModel", "NotSpiking", "build_report", "chart_indices", "chart_png", "check_spiking",
    "connection_layers", "count_reference", "fanout_block", "fanout_map", "geometry", "layer_chart", "markdown",
    "spiking_layers", "static_metrics", "weight_fanin",
]
