"""snntrain: training spiking neural networks for vision, with Triton kernels.

``snntrain.load_checkpoint(path)`` and ``snntrain.load_exported(folder)`` return a ready
classifier or detector without Hydra or Lightning (see :mod:`snntrain.export`);
``snntrain.load_nir(path)`` runs a NIR graph with snntrain layers (see :mod:`snntrain.nir`).
"""

from .version import __version__

__all__ = ["__version__", "load_checkpoint", "load_exported", "load_nir"]


def __getattr__(name: str):
    # loaded on first use: importing snntrain alone stays light
    if name in ("load_checkpoint", "load_exported"):
        from . import export

        return getattr(export, name)
    if name == "load_nir":
        from .nir import load_nir

        return load_nir
    raise AttributeError(f"module 'snntrain' has no attribute {name!r}")
