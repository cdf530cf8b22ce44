"""The host plumbing every op family of :mod:`snntrain.kernels` shares.

Each family file (``lif.py``, ``bn_neuron.py``, ``ln_neuron.py``, ``layer_norm.py``, ``giou.py``) keeps its
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
from operator import itemgetter

import torch
from torch import Tensor

__all__ = ["INTERPRET", "INT32_MAX", "FLOAT_DTYPES", "sm_count", "cdiv", "next_pow2", "direct", "FastLaunch", "c_launcher", "Planned",
           "PlanCache", "op_wrap", "no_launch",
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
    """``ceil(a / b)`` for positive host integers (``triton.cdiv`` is a constexpr function: several microseconds
    a call on the host, a dozen calls per layer and step)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), on the host (``triton.next_power_of_2`` is slower there)."""
    return 1 << max(0, (int(n) - 1).bit_length())


class FastLaunch:
    """A ``@triton.jit`` kernel launched with less host work: ``FastLaunch(kernel)[grid](*args, **kwargs)``
    launches what ``kernel[grid](*args, **kwargs)`` would, but reuses the compiled kernel found for the same
    specialisation instead of having Triton bind and specialise every argument and hash the result on each
    call (tens of microseconds per launch, as much as a small kernel runs on the GPU), and calls the compiled
    kernel's launcher itself.

    The specialisation key is what Triton specialises on: each tensor's dtype and 16-byte alignment, each
    integer's being 1, its divisibility by 16 and its 32-bit range, every constexpr's value, the options
    (``num_warps``, ...), the device. A new key takes Triton's own launch, which compiles or finds the kernel;
    later calls with that key call the compiled kernel's launcher directly. Anything this version of Triton
    does not offer, launch hooks (profilers such as Proton set them) or the interpreter take Triton's path.
    """

    __slots__ = ("kernel", "_cache", "_names", "_defaults", "_const", "_known", "_ok")

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._cache: dict = {}
        self._ok = True
        try:
            import inspect

            params = list(inspect.signature(kernel.fn).parameters.values())
            self._names = tuple(p.name for p in params)
            self._defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
            constexpr = {p.name for p in kernel.params if p.is_constexpr}
            self._const = tuple(name in constexpr for name in self._names)  # per position
            self._known = frozenset(self._names)  # every argument name (those with defaults among them)
        except (AttributeError, TypeError, ValueError):
            self._ok = False

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def bind(self, grid, args: tuple, kwargs: dict, slots: tuple[int, ...] | None = None):
        """``self[grid](*args, **kwargs)`` for a call site whose grid, non-tensor arguments and options stay the
        same while its tensors change: the returned ``launch(*tensors)`` fills the positions ``slots`` of ``args``
        (by default those given as ``None``), in order; a slot may be filled with ``None`` (an absent optional
        pointer). Its key per call is only those tensors' dtypes and 16-byte alignment and the device
        (everything else was keyed once), and it hands the compiled kernel's C launcher the argument list built
        at binding with the tensors' addresses as integers (the launcher would otherwise ask each tensor for
        its address again and have the driver check it): microseconds less per launch than :meth:`launch`, for
        kernels launched once per layer call (the activity counter's, the eager norm-neuron plans')."""
        if slots is None:
            slots = [i for i, a in enumerate(args) if a is None]
        template = list(args)
        ok = self._ok
        for name in self._names[len(args):] if ok else ():
            if name not in kwargs and name not in self._defaults:
                ok = False  # a missing argument: Triton's launch says which
                break
            template.append(kwargs[name] if name in kwargs else self._defaults[name])
        # the launcher's copy: the tensors fixed at binding (kept alive by ``args``) as their addresses
        addresses = [a.data_ptr() if isinstance(a, Tensor) else a for a in template]
        n = len(grid)
        g0, g1, g2 = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        cache: dict = {}

        def filled(tensors) -> list:
            values = template.copy()
            for i, t in zip(slots, tensors):
                values[i] = t
            return values

        def launch(*tensors):
            if not ok or _launch_hooks():
                return self.kernel[grid](*filled(tensors)[: len(args)], **kwargs)
            device = _current_device()
            values = addresses.copy()
            key = [device]
            for i, t in zip(slots, tensors):
                if t is None:
                    values[i] = None
                    key.append(None)
                else:
                    values[i] = address = t.data_ptr()
                    key.append(t.dtype)
                    key.append(address % 16 == 0)
            key = tuple(key)
            entry = cache.get(key)
            if entry is None:  # a new specialisation: Triton's own launch, then its compiled kernel's launcher
                values = filled(tensors)
                compiled = self.launch(grid, tuple(values[: len(args)]), kwargs)
                entry = self._cache.get(self._key(values, kwargs, device))
                if entry is not None:
                    cache[key] = entry
                return compiled
            entry[1](g0, g1, g2, _raw_stream(device), values)
            return entry[0]

        return launch

    def _key(self, values: list, kwargs: dict, device: int) -> tuple:
        key: list = [device]
        append = key.append
        for const, a in zip(self._const, values):
            if const:
                append(a)
                continue
            t = type(a)
            if t is int:
                append((a == 1, a % 16 == 0, 0 if -2**31 <= a < 2**31 else _int_width(a)))
            elif t is Tensor or t is torch.nn.Parameter or isinstance(a, Tensor):
                append((a.dtype, a.data_ptr() % 16 == 0))
            elif t is float:
                append(float)
            elif t is bool or a is None:
                append(a)
            elif isinstance(a, int):  # an int subclass (not bool)
                append((a == 1, a % 16 == 0, _int_width(a)))
            else:
                append(a)
        known = self._known
        for k, v in kwargs.items():  # the options (num_warps, ...); a call site passes them in a fixed order
            if k not in known:
                append((k, v))
        return tuple(key)

    def launch(self, grid, args: tuple, kwargs: dict):
        if not self._ok or _launch_hooks():
            return self.kernel[grid](*args, **kwargs)
        try:
            values = list(args)
            if len(values) < len(self._names):
                defaults = self._defaults
                for name in self._names[len(args):]:
                    values.append(kwargs[name] if name in kwargs else defaults[name])
            device = _current_device()
            key = self._key(values, kwargs, device)
        except (KeyError, TypeError):
            return self.kernel[grid](*args, **kwargs)
        entry = self._cache.get(key)
        if entry is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if hasattr(compiled, "result"):
                compiled = compiled.result()
            if compiled is not None and all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
                # ``run`` first: reading it loads the binary, which sets ``function``
                self._cache[key] = (compiled, c_launcher(compiled.run, compiled.function, compiled.packed_metadata))
            return compiled
        n = len(grid)
        entry[1](grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _raw_stream(device), values)
        return entry[0]


#: The parameters of ``CudaLauncher.__call__`` in the Triton versions whose launcher :func:`c_launcher` calls
#: itself: 3.2-3.6 (the C launcher takes the kernel's arguments one by one) and 3.7-3.8 (as one tuple, with
#: the argument annotations and signature). Any other launcher is called as it is.
_LAUNCHER_CALLS = {
    ("self", "gridX", "gridY", "gridZ", "stream", "function", "args"): "unpacked",
    ("self", "gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata", "launch_metadata",
     "launch_enter_hook", "launch_exit_hook", "args"): "packed",
}


def _launcher_call(launcher) -> str | None:
    """Which of :data:`_LAUNCHER_CALLS` ``launcher`` (a compiled kernel's ``run``) is, or None."""
    import inspect

    cls = type(launcher)
    if cls.__name__ != "CudaLauncher" or not callable(getattr(launcher, "launch", None)):
        return None
    # what its __call__ adds beyond the C launch: scratch memory (none here) and sanitizer state
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1) \
            or getattr(launcher, "gsan_enabled", False):
        return None
    try:
        params = tuple(inspect.signature(cls.__call__).parameters)
    except (TypeError, ValueError):
        return None
    return _LAUNCHER_CALLS.get(params)


def c_launcher(launcher, function, metadata):
    """``call(g0, g1, g2, stream, values)``: what ``launcher(g0, g1, g2, stream, function, metadata, None, None,
    None, *values)`` does (a compiled kernel's runner, without launch hooks and so without launch metadata),
    calling Triton's C launcher itself where the launcher is a ``CudaLauncher`` of a known version
    (:data:`_LAUNCHER_CALLS`) that needs no scratch memory: that skips its Python (about a microsecond a
    launch). ``values`` are the kernel's arguments, constexprs included; pointers as tensors or addresses."""
    kind = _launcher_call(launcher)
    if kind is not None:
        launch, coop, pdl = launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl
    if kind == "unpacked":
        def call(g0, g1, g2, stream, values):
            launch(g0, g1, g2, stream, function, coop, pdl, None, None, metadata, None, None, None, *values)
    elif kind == "packed":
        annotations, signature = launcher.arg_annotations, launcher.kernel_signature

        def call(g0, g1, g2, stream, values):
            launch(g0, g1, g2, stream, function, coop, pdl, metadata, None, None, None, None, None, annotations,
                   signature, tuple(values))
    else:
        def call(g0, g1, g2, stream, values):
            launcher(g0, g1, g2, stream, function, metadata, None, None, None, *values)
    return call


#: The current CUDA device's index: ``torch.cuda.current_device`` without its lazy-initialisation check (a launch
#: has CUDA tensors, so CUDA is initialised).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
#: The current stream of a CUDA device, as the launcher takes it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
    (lambda device: torch.cuda.current_stream(device).cuda_stream)


_KNOBS = None


def _launch_hooks() -> bool:
    """Whether Triton's launch hooks are set (a profiler such as Proton adds them): launches then take Triton's
    own path, which calls them. ``triton.knobs`` is imported once (an import statement per launch costs a
    lookup); the hooks are HookChains (empty unless something added hooks) or functions."""
    global _KNOBS
    if _KNOBS is None:
        from triton import knobs

        _KNOBS = knobs
    runtime = _KNOBS.runtime
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (exit_ is not None and getattr(exit_, "calls", True)))


def _int_width(a: int) -> int:
    """The integer types Triton tells apart by value: 32-bit, unsigned 32-bit, 64-bit, unsigned 64-bit."""
    if -2**31 <= a < 2**31:
        return 0
    if 0 <= a < 2**32:
        return 1
    return 2 if -2**63 <= a < 2**63 else 3


_FAST: dict = {}


def direct(kernel):
    """Launch a kernel as it is (eager calls outside any tracing), through :class:`FastLaunch` where the
    kernels are compiled (a plain ``@triton.jit`` function, not under the interpreter)."""
    if INTERPRET or not isinstance(kernel, _jit_function_type()):
        return kernel
    fast = _FAST.get(kernel)
    if fast is None:
        fast = _FAST[kernel] = FastLaunch(kernel)
    return fast


def _jit_function_type():
    from triton.runtime.jit import JITFunction

    return JITFunction


class Planned:
    """One launch of a host function's plan, ``kernel[grid](*args, **kwargs)``, whose entries of ``args`` that are
    strings name the tensors of each call (everything else depends only on shapes, strides and options, so a plan
    can be cached per layout). ``planned(wrap, tensors)`` launches it with ``tensors`` (a dict of those names):
    eager calls (:func:`direct`) through :meth:`FastLaunch.bind`, bound once; any other ``wrap`` (``op_wrap``
    under tracing, :func:`no_launch`) as ``wrap(kernel)[grid](...)``."""

    __slots__ = ("kernel", "grid", "args", "kwargs", "slots", "names", "_pick", "_bound")

    def __init__(self, kernel, grid: tuple, args: tuple, kwargs: dict) -> None:
        self.kernel, self.grid, self.args, self.kwargs = kernel, grid, args, kwargs
        self.slots = tuple(i for i, a in enumerate(args) if type(a) is str)
        self.names = tuple(args[i] for i in self.slots)
        # the call's tensors in slot order, as a tuple (itemgetter of one name returns the item alone)
        names = self.names
        self._pick = itemgetter(*names) if len(names) > 1 else lambda d: tuple(d[n] for n in names)
        self._bound = None

    def __call__(self, wrap, tensors: dict) -> None:
        if wrap is direct:
            bound = self._bound
            if bound is None:
                kernel = direct(self.kernel)
                bound = self._bound = (kernel.bind(self.grid, self.args, self.kwargs, self.slots)
                                       if isinstance(kernel, FastLaunch) else self._plain(kernel))
            bound(*self._pick(tensors))
            return
        self._plain(wrap(self.kernel))(*self._pick(tensors))

    def _plain(self, kernel):
        launch = kernel[self.grid]

        def run(*tensors):
            values = list(self.args)
            for i, t in zip(self.slots, tensors):
                values[i] = t
            return launch(*values, **self.kwargs)

        return run


class PlanCache(dict):
    """Eager plans by key (shapes, strides, options), at most ``limit`` of them (emptied when full: a model has
    a few dozen layouts)."""

    def __init__(self, limit: int = 512) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key, plan):
        if len(self) >= self.limit:
            self.clear()
        self[key] = plan
        return plan


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
        # outputs without a gradient (statistics, checkpoints, unused states) reach the backward as None, not as
        # zero tensors made for each of them: the backwards take None for any of their gradients
        ctx.set_materialize_grads(False)
        return output

    cls_name = "Eager_" + name.split("::")[-1]
    doc = f"``{name}`` and its backward, launched without the operator machinery (eager calls)."
    return type(cls_name, (torch.autograd.Function,),
                {"forward": staticmethod(run_forward), "backward": staticmethod(backward), "__doc__": doc})
