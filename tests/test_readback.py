"""snntrain.readback.HostCopy: device values read back without waiting for the device."""

from __future__ import annotations

import pytest
import torch

from snntrain.readback import HostCopy


def test_host_copy_on_the_cpu_holds_the_values_at_once_and_fills_the_given_tensor():
    values = torch.tensor([1.5, -2.0, 3.25])
    copy = HostCopy(values)
    values.add_(1)  # the copy is its own
    assert copy.arrived
    assert copy.get().tolist() == [1.5, -2.0, 3.25]
    out = torch.zeros(3)
    assert HostCopy(values, out=out).get() is out and out.tolist() == [2.5, -1.0, 4.25]


@pytest.mark.gpu
def test_host_copy_on_the_gpu_queues_behind_the_work_and_never_synchronises_until_read():
    """The copy is made behind the kernels queued before it (a long matrix product here) without the host
    waiting: under ``set_sync_debug_mode("error")`` making it raises nothing; its value is the one those
    kernels left, read through ``get``; a pinned ``out`` is reused."""
    a = torch.randn(4096, 4096, device="cuda")
    out = torch.empty(1, pin_memory=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        b = a
        for _ in range(20):
            b = b @ a / 64
        total = b.abs().sum().reshape(1)
        copies = [HostCopy(total), HostCopy(total, out=out)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    expected = float(total)  # waits for the device
    for copy in copies:
        assert copy.get().tolist() == [expected] and copy.arrived
    assert copies[1].get() is out and copies[0].get().is_pinned()
