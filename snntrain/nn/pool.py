"""Max pooling of spike maps with the Triton kernels of :mod:`snntrain.kernels.spike_pool`.

:class:`SpikeMaxPool2d` is :class:`torch.nn.MaxPool2d` (a subclass: same arguments, no parameters, the
same state dict, recognised wherever a ``MaxPool2d`` is) that runs one Triton kernel for the forward and
one for the backward under the Triton backend. Values and gradients equal PyTorch's CUDA results bit for
bit, ties included (the first maximum of a window in row-major order takes the gradient); the forward keeps
one byte per output element for the backward instead of the input and an int64 index. The models use it
where the pooled map is spikes; nothing in it depends on the values being 0 or 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..backend import FallbackWarning, check_backend, use_triton

__all__ = ["SpikeMaxPool2d"]

#: Where the fused path falls back to PyTorch's pooling: one warning per reason and process.
_fallback = FallbackWarning("SpikeMaxPool2d: the Triton max-pool kernels do not take {reason}; using "
                            "torch.nn.functional.max_pool2d for it")


class SpikeMaxPool2d(nn.MaxPool2d):
    """``torch.nn.MaxPool2d(kernel_size, stride, padding, dilation, ceil_mode=ceil_mode)`` with a ``backend``.

    Args:
        kernel_size, stride, padding, dilation, ceil_mode: as :class:`torch.nn.MaxPool2d` (``stride`` None: the
            kernel size); checked when the module is made.
        backend: ``auto``, ``torch`` or ``triton`` (switchable at any time, e.g. with
            :func:`snntrain.nn.set_backend`). ``torch`` runs :func:`torch.nn.functional.max_pool2d`, the reference.

    Takes ``[N, C, H, W]`` or ``[C, H, W]`` (wrap it in :class:`~snntrain.nn.MultiStep` for ``[T, B, C, H, W]``).
    Under Triton the output and the input's gradient keep the input's memory format, as PyTorch's do. What the
    kernels do not take (windows of more than :data:`snntrain.kernels.spike_pool.MAX_WINDOW` elements, integer
    dtypes, other ranks) runs PyTorch's pooling instead, with a warning naming it, once per process.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
                 backend: str = "auto") -> None:
        super().__init__(kernel_size, stride, padding, dilation, return_indices=False, ceil_mode=ceil_mode)
        from ..kernels.spike_pool import pool_params

        self._pool_params = pool_params(kernel_size, stride, padding, dilation, ceil_mode)
        self.backend = check_backend(backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not use_triton(self.backend, x):
            return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, ceil_mode=self.ceil_mode)
        from ..kernels import spike_pool as K

        batched = x.unsqueeze(0) if x.dim() == 3 else x
        reason = K.unsupported(batched, self._pool_params)
        if reason is not None:
            _fallback(reason, stacklevel=3)
            return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, ceil_mode=self.ceil_mode)
        y = K.max_pool2d(batched, self._pool_params)
        return y.squeeze(0) if x.dim() == 3 else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend}"
