"""The host plumbing every op family of :mod:`snntrain.kernels` shares.

Each family file (``lif.py``, ``norm_neuron.py``, ``layer_norm.py``, ``giou.py``) keeps its
kernels, its host launch functions and its registration; this module holds what they have
in common, so that there is one way to do each of these things:

* the interpreter switch :data:`INTERPRET`, the 32-bit index limit :data:`INT32_MAX`, the
  floating dtypes the kernels take (:data:`FLOAT_DTYPES`) and the SM count (:func:`sm_count`);
* how a host launch function launches: it applies a ``wrap`` to each kernel before indexing
  it with the grid. :func:`direct` (the eager path) launches the kernel as it is;
  :data:`op_wrap` (inside a registered operator) is ``torch.library.wrap_triton``, so that
  ``torch.compile`` and ``torch.export`` see the kernels; :func:`no_launch` (a shape-only
  fake implementation) launches nothing;
* operator registration (:func:`register_op`): a ``torch.library.triton_op``; under
  ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, used by the tests without a GPU) an
  opaque ``torch.library.custom_op`` with a fake implementation instead, because an
  interpreted kernel cannot be traced into a graph;
* the dispatch rule and the eager path. An entry point calls its registered operator when
  :func:`traced` (``torch.compile``, ``torch.export``), otherwise an ``autograd.Function``
  that runs the same host functions and kernels without the operator machinery, which costs
  more host time per call than small kernels take on the GPU (:func:`eager_function` builds
  it from the operator's forward, ``setup_context`` and backward). While a profiler records,
  the eager path runs under the operators' names (:func:`profiled`), so traces look the same.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

__all__ = ["INTERPRET", "INT32_MAX", "FLOAT_DTYPES", "sm_count", "cdiv", "direct", "op_wrap", "no_launch",
           "register_op", "profiled", "traced", "eager_function"]

#: Triton's CPU interpreter is on (``TRITON_INTERPRET=1``, set by the tests on a machine without CUDA).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
#: The largest index the kernels form in 32-bit arithmetic.
INT32_MAX = 2**31 - 1
#: The input dtypes of the neuron, norm-neuron and layer-norm kernels.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device, cpu: int = 4) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (cached); ``cpu`` for any other device (the
    interpreter: the caller says how many programs per SM-sized group it wants there)."""
    if device.type != "cuda":
        return cpu
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SM_COUNT.get(idx)
    if n is None:
        n = _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive host integers."""
    return -(-a // b)


def direct(kernel):
    """Launch a kernel as it is (eager calls outside any tracing)."""
    return kernel


class _NoLaunch:
    """Stands in for a kernel in fake (shape-only) runs: indexing by a grid gives a no-op launcher."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


_NO_LAUNCH = _NoLaunch()


def no_launch(kernel):
    """Launch nothing (a fake implementation only allocates the outputs)."""
    return _NO_LAUNCH


if INTERPRET:
    # An interpreted kernel runs as Python and cannot be recorded into a graph.
    op_wrap = direct
else:
    from torch.library import wrap_triton as op_wrap


def register_op(name: str, impl, fake):
    """``impl`` as the operator ``name`` (``"snntrain::..."``, no mutated arguments): a ``triton_op``
    (``torch.compile`` sees and optimises the kernels ``impl`` launches through :data:`op_wrap`).
    Under the interpreter an opaque ``custom_op`` with ``fake`` (shape-only) as its fake implementation."""
    if INTERPRET:
        op = torch.library.custom_op(name, impl, mutates_args=())
        op.register_fake(fake)
        return op
    return torch.library.triton_op(name, impl, mutates_args=())


class _NullContext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NULL = _NullContext()


def profiled(name: str):
    """A profiler range named ``name`` while a profiler is recording, else nothing (no host cost)."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(name)
    return _NULL


def traced(*tensors) -> bool:
    """True inside ``torch.compile`` / ``torch.export`` tracing, where the registered operators must be used
    (the tensors are then fake or functional tensors, not plain ones)."""
    if torch.compiler.is_compiling():
        return True
    return any(t is not None and type(t) is not Tensor and not isinstance(t, torch.nn.Parameter) for t in tensors)


def eager_function(name: str, forward, setup_context, backward) -> type[torch.autograd.Function]:
    """The eager twin of the registered operator ``name``: an ``autograd.Function`` whose forward runs
    ``forward(*inputs)`` (the operator's host function, launching its kernels :func:`direct`) under the
    operator's profiler name and then ``setup_context(ctx, inputs, output)``, the operator's own; its
    backward is ``backward(ctx, *grads)``, the operator's autograd backward with the backward host
    function called directly (under its own profiler name) instead of the backward operator."""

    # forward(ctx, ...) rather than a separate setup_context staticmethod: the latter binds the
    # arguments through inspect.signature on every call, which costs tens of microseconds.
    def run_forward(ctx, *inputs):
        with profiled(name):
            output = forward(*inputs)
        setup_context(ctx, inputs, output)
        return output

    cls_name = "Eager_" + name.split("::")[-1]
    doc = f"``{name}`` and its backward, launched without the operator machinery (eager calls)."
    return type(cls_name, (torch.autograd.Function,),
                {"forward": staticmethod(run_forward), "backward": staticmethod(backward), "__doc__": doc})
