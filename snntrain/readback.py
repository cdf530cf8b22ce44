"""Values read back from the device without waiting for it.

Reading a CUDA tensor on the host (``.item()``, ``.tolist()``) waits for every kernel queued before it: where
the host runs steps ahead of the GPU, the GPU then idles while the host prepares the next step. A
:class:`HostCopy` instead queues a copy into pinned host memory behind that work and records an event; the
values are read once the event says they have arrived (at a later step), or waited for where they are needed
at once. The step values the tasks log (:meth:`snntrain.tasks.base.SpikingTask.log_step_values`) and the SIGTERM
flag of a DDP run (:class:`snntrain.distributed._SigtermFlag`) are read this way.
"""

from __future__ import annotations

import torch


class HostCopy:
    """``values`` on its way to host memory: on CUDA a non-blocking copy into pinned memory (``out`` if given:
    a pinned tensor of the same shape and dtype, reused) with an event behind it; elsewhere the values at once.

    :attr:`arrived` tells without waiting whether the copy has landed; :meth:`get` returns the host tensor,
    waiting (only for the copy and the work queued before it) if needed."""

    def __init__(self, values: torch.Tensor, out: torch.Tensor | None = None) -> None:
        values = values.detach()
        self._event: torch.cuda.Event | None = None
        if values.device.type == "cuda":
            host = out if out is not None else torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        elif out is not None:
            host = out.copy_(values)
        else:
            host = values.to("cpu", copy=True)
        self._host = host

    @property
    def arrived(self) -> bool:
        return self._event is None or self._event.query()

    def get(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
        return self._host
