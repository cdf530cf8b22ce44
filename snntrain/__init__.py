"""snntrain: training spiking neural networks for vision, with Triton kernels.

``snntrain.load_checkpoint(path)`` and ``snntrain.load_exported(folder)`` return a ready
classifier or detector without Hydra or Lightning (see :mod:`snntrain.export`).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load_checkpoint", "load_exported"]


def __getattr__(name: str):
    # loaded on first use: importing snntrain alone stays light
    if name in ("load_checkpoint", "load_exported"):
        from . import export

        return getattr(export, name)
    raise AttributeError(f"module 'snntrain' has no attribute {name!r}")
