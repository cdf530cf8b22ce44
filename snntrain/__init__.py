"""snntrain: training spiking neural networks for vision, with Triton kernels."""

__version__ = "0.1.0"
