"""Triton kernels, one file per op family, registered as ``torch.ops.snntrain.*``.

Nothing here imports from :mod:`snntrain.nn` or above. Importing this package registers
every operator (needed, for example, to load a ``torch.export`` program that uses them).
"""

from . import giou, layer_norm, lif

__all__ = ["giou", "layer_norm", "lif"]
