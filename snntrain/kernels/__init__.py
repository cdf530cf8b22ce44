"""Triton kernels, one file per op family, registered as ``torch.ops.snntrain.*``.

The families (``lif``, ``psn``, ``bn_neuron``, ``ln_neuron``, ``bn_neuron_pool`` (a batch-norm neuron with the
3x3/2 max-pool of its spikes, the ResNets' stem), ``layer_norm``, ``giou``, ``spike_attention``, ``spike_pool``, ``spike_pack`` (spikes packed into bits for a convolution's backward),
``step_neuron``: neurons generated from a step function by ``neuron_graph``, ``neuron_codegen`` and
``neuron_jit``) share the host plumbing of :mod:`~snntrain.kernels.op_utils` and, for the neurons, the step and the
scans of :mod:`~snntrain.kernels.neuron_step` (the fused norm-neuron families also
:mod:`~snntrain.kernels.norm_neuron_base`); the launch sizes of ``giou``, ``layer_norm``, the norm-neuron families,
``psn`` and ``spike_pool`` are in their ``*_tuning`` modules (``lif``'s are a few constants in ``lif.py``).
Nothing here imports from :mod:`snntrain.nn` or above. Importing this package registers
every operator any snntrain model or exported program can contain (``neuron_*``,
``psn_*``, ``bn_neuron_*``, ``bn_neuron_pool_*``, ``ln_neuron_*``, ``layer_norm_*``, ``giou_loss*``, ``spike_kv``,
``ssa_neuron_*``, ``max_pool_*``, ``spike_pack``, ``spike_unpack``, ``step_neuron_*``), on any machine: a ``torch.export`` program that calls them
loads only once they are registered.
"""

from . import (
    bn_neuron,
    bn_neuron_pool,
    giou,
    layer_norm,
    lif,
    ln_neuron,
    psn,
    spike_attention,
    spike_pack,
    spike_pool,
    step_neuron,
)

__all__ = ["bn_neuron", "bn_neuron_pool", "giou", "layer_norm", "lif", "ln_neuron", "psn", "registered_ops",
           "spike_attention", "spike_pack", "spike_pool", "step_neuron"]


def registered_ops() -> list[str]:
    """The names of the ``snntrain::`` operators this package registers (``bn_neuron_fwd``, ...)."""
    import torch

    return sorted(name for name in dir(torch.ops.snntrain) if not name.startswith("_") and name != "name")
