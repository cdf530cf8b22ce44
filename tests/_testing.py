"""What the kernel tests share: one device, one tolerance table, one comparison, one CUDA-graph capture.

``DEVICE`` is where kernel tests put their tensors: CUDA when present, else the CPU, where the
kernels run in Triton's interpreter (``conftest.py`` sets ``TRITON_INTERPRET`` before any kernel
is imported).

``TOLERANCES`` gives ``(rtol, atol)`` per dtype for a result that the kernels compute in fp32
(fp64 for fp64 input) and round to that dtype, compared with a reference that does the same
operations in another order: two units in the last place of fp16 and bf16, a margin for
reordered fp32 arithmetic, and the precise fp64 path. :func:`assert_close` takes the row of
the compared dtype. :data:`SUMMED` is the one shared exception: fp32 results of long
reductions (a sum over every element, reduced in blocks) or of the GPU's fast divisions. A
test that expects more (exact operations) or allows more for another reason passes ``rtol``
/ ``atol`` itself and says why where it does; no override is looser than the tolerance the
test had before this table.
"""

from __future__ import annotations

import contextlib

import torch

#: where kernel tests run: CUDA when present, else the CPU (Triton's interpreter)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

#: (rtol, atol) per dtype of the compared result.
TOLERANCES = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (2e-3, 1e-5),  # 2 units in the last place of fp16
    torch.bfloat16: (1.6e-2, 1e-4),  # 2 units in the last place of bf16
}
#: fp32 results of long reductions or of fast (non-IEEE) divisions: ten times the fp32 row.
SUMMED = dict(rtol=1e-4, atol=1e-5)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, *,
                 rtol: float | None = None, atol: float | None = None, what: str = "") -> None:
    """``|actual - expected| <= atol + rtol * |expected|`` elementwise, shapes equal.

    The dtypes are equal, or ``expected`` is a reference in a wider dtype (an fp32 or fp64
    oracle); both are compared in float64 on the CPU. ``rtol`` and ``atol`` default to
    ``TOLERANCES[dtype]`` (0 for integer dtypes), ``dtype`` to ``actual``'s; ``what`` names the
    compared quantity in the failure message.
    """
    if actual.dtype != expected.dtype and expected.dtype.itemsize <= actual.dtype.itemsize:
        raise AssertionError(f"{what or 'result'}: {actual.dtype} compared with a reference in {expected.dtype}")
    row = TOLERANCES.get(actual.dtype if dtype is None else dtype, (0.0, 0.0))  # integers: exact
    rtol = row[0] if rtol is None else rtol
    atol = row[1] if atol is None else atol
    torch.testing.assert_close(actual.detach().double().cpu(), expected.detach().double().cpu(), rtol=rtol,
                               atol=atol, msg=(lambda m: f"{what}: {m}") if what else None)


def capture_cuda_graph(step, warmup: int = 2):
    """``(graph, outputs)``: ``step()`` run ``warmup`` times on a side stream (kernels compile and
    launch configurations are tuned outside the capture), then one call captured in a CUDA graph.

    ``graph.replay()`` runs the captured call again on the same memory: copy new data into the
    tensors ``step`` reads, replay, and read the captured outputs (and gradients) afresh. A step
    that sets ``.grad`` to None before its backward makes the graph own its gradients.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def count_plans(monkeypatch, module, makers: tuple[str, ...], caches: tuple[str, ...]) -> list[str]:
    """Empty ``module``'s plan caches (attribute names ``caches``) for the test and record the name of each of its plan
    makers (``makers``) as it is called, in order: the list returned."""
    from snntrain.kernels.op_utils import PlanCache

    made: list[str] = []
    for name in makers:
        make = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, _make=make, _name=name, **kwargs:
                            made.append(_name) or _make(*args, **kwargs))
    for name in caches:
        monkeypatch.setattr(module, name, PlanCache())
    return made


@contextlib.contextmanager
def one_cpu_thread():
    """Run the block with one intra-op thread on the CPU (no effect on CUDA work).

    PyTorch's CPU convolution computes the weight gradient of a channels-last 1x1 stride-2 convolution
    with 4 input channels (the test models' downsampling shortcut at width 4) wrongly when it runs on
    several threads: the values change from call to call, by up to the gradient's own size, and the heap
    can be corrupted. With one thread that gradient is the float64 reference's within rounding. Tests that
    compare the weight gradients of two runs of a channels-last test model on the CPU run them in here.
    (Not every such model is safe on one thread: QKFormer's stem at width 16, channels-last, aborts in its
    backward. Tests that need no channels-last weights keep CPU models row-major.)
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
