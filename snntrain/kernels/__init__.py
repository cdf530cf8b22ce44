"""Triton kernels, one file per op family, registered as ``torch.ops.snntrain.*``.

Nothing here imports from :mod:`snntrain.nn` or above.
"""
