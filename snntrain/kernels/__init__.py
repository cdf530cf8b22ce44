"""Triton kernels, one file per op family, registered as ``torch.ops.snntrain.*``.

Nothing here imports from :mod:`snntrain.nn` or above. Importing this package registers
every operator any snntrain model or exported program can contain (``neuron_*``,
``bn_neuron_*``, ``ln_neuron_*``, ``layer_norm_*``, ``giou_loss*``), on any machine: a
``torch.export`` program that calls them loads only once they are registered.
"""

from . import giou, layer_norm, lif, norm_neuron

__all__ = ["giou", "layer_norm", "lif", "norm_neuron", "registered_ops"]


def registered_ops() -> list[str]:
    """The names of the ``snntrain::`` operators this package registers (``bn_neuron_fwd``, ...)."""
    import torch

    return sorted(name for name in dir(torch.ops.snntrain) if not name.startswith("_") and name != "name")
