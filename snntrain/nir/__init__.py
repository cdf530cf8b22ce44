"""NIR (the Neuromorphic Intermediate Representation): export SEW-ResNets, import NIR graphs.

Three modules: :mod:`~snntrain.nir.export` (a model as a graph), :mod:`~snntrain.nir.targets` (the readers and
what each imports), :mod:`~snntrain.nir.load` (a graph as a model); every public name is importable from here.

:func:`to_nir` describes a trained SEW-ResNet classifier (or a detector's backbone) as a NIR graph
for one reader (``target``: :data:`NIR_TARGETS`); :func:`load_nir` builds a runnable model from a NIR
graph, ours or another library's, out of snntrain layers. docs/nir.md gives the mapping in full and
what each reader imports; in short:

* a convolution and the BatchNorm after it become one ``Conv2d`` with the norm folded
  into its weight and bias (:func:`fold_batchnorm` gives the same network as a PyTorch
  model); layer norm has no NIR node and is refused;
* neurons map to NIR's continuous-time definitions discretised by forward Euler with
  step ``dt`` (graph metadata ``dt``): LIF/PLIF ``tau dv/dt = (v_leak - v) + r I`` with
  ``tau = tau_steps * dt``, ``v_leak = v_reset`` and ``r = 1`` (``decay_input``) or
  ``r = tau_steps`` (not); IF ``dv/dt = r I`` with ``r = 1 / dt`` (for snnTorch, whose importer
  reads IF as a leaky neuron, the same neuron as a LIF without leak: ``tau = 2**60 dt``,
  ``r = 2**60``); hard reset to ``v_reset``. Soft reset (subtract the threshold) has no NIR form
  and is refused;
* a SEW ``ADD`` is NIR's own sum: the residual branch and the shortcut both have edges into the
  nodes that read the block's output (NIR adds the edges into a node); ``AND`` and ``IAND``
  multiply spikes, which NIR cannot express, and are refused;
* max pooling of spikes is a sum over each window followed by a threshold at 0.5 (the max of
  0/1 values is 1 exactly when their sum is at least 1): ``SumPool2d`` and ``Threshold`` for
  ``spec``; for the importers, which map neither ``Threshold`` nor a padded ``SumPool2d``, a
  ``Conv2d`` of ones (with the padding) and an IF neuron, whose membrane is back at 0 after every
  step (it fires on any count >= 1 and resets, and a count of 0 leaves it at 0); global average
  pooling is an ``AvgPool2d`` over the whole map (for Norse, which maps none, a ``SumPool2d`` with
  the ``1 / (H W)`` folded into the readout's weight), then ``Flatten`` and the readout ``Affine``;
* for Norse, whose executor runs the nodes depth first from the input, each downsampling block
  gets an edge of zeros (a ``Conv2d`` with zero weights, ``layer<i>.0.order``) from the end of the
  residual branch to the start of the shortcut, so that the shortcut runs after the branch and
  before the sum that reads both.

Before anything is written the graph is checked against its reader (:func:`target_problems`):
every node it cannot import as NIR defines it is named, with the reason. The graph runs one time
step per call of its nodes; a classifier's logits are the mean over T of its output (graph
metadata ``readout: mean_over_time``), which :func:`load_nir` applies.
"""

from .export import fold_batchnorm, fold_conv_bn, neuron_to_nir, save_nir, to_nir, write_nir
from .load import AvgPool2d, NIRNetwork, Scale, SumPool2d, Threshold, load_nir, neuron_from_nir, node_map
from .targets import (
    DEFAULT_DT,
    NIR_TARGETS,
    NO_LEAK_STEPS,
    READOUT_MEAN,
    NIRError,
    NIRTarget,
    check_target,
    depth_first_order,
    format_problems,
    target_problems,
)

__all__ = [
    "DEFAULT_DT", "NIR_TARGETS", "NO_LEAK_STEPS", "READOUT_MEAN", "AvgPool2d", "NIRError", "NIRNetwork", "NIRTarget",
    "Scale", "SumPool2d", "Threshold", "check_target", "depth_first_order", "fold_batchnorm", "fold_conv_bn",
    "format_problems", "load_nir", "neuron_from_nir", "neuron_to_nir", "node_map", "save_nir", "target_problems",
    "to_nir", "write_nir",
]
