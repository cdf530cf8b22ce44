"""Neurons defined by one time step written in Python: :class:`StepNeuron`.

A subclass names its states (with their initial values) and parameters (with their defaults) and
writes ``step``, one time step for every neuron at once::

    class ALIF(StepNeuron):
        states = {"v": 0.0, "a": 0.0}                      # initial values (a number or a parameter's name)
        defaults = {"tau": 2.0, "tau_a": 20.0, "beta": 0.5, "v_threshold": 1.0}

        def step(self, x, v, a, tau, tau_a, beta, v_threshold):
            h = v + (x - v) / tau                          # charge
            s = self.heaviside(h - (v_threshold + beta * a))   # fire, with the surrogate gradient
            return s, h * (1.0 - s), a + (s - a) / tau_a   # output, then the new states in order

``step(x, *states, **params)`` returns the output (spikes) and the new states. It may use Python
arithmetic, comparisons, ``torch.exp/log/sigmoid/tanh/sqrt/abs/relu/clamp/minimum/maximum/where/round/floor``,
``.detach()`` and :meth:`heaviside` (or :func:`snntrain.nn.spike` with a chosen surrogate); Python
control flow may depend on the module's own options (``if self.decay_input:``) but not on the values.

The module runs ``[T, ...]`` input. With ``backend`` ``triton`` (or ``auto`` on CUDA) the step is traced
into a graph, differentiated on the graph and generated into Triton forward and backward time loops
(:mod:`snntrain.kernels.step_neuron`): gradients for the input, the initial states and every learnable
parameter, without a backward written per neuron. With ``torch`` the same ``step`` runs as a PyTorch
loop on tensors (the reference; also what ``torch.export``/ONNX record). The step is traced when the
module is built, so an operation that cannot be generated is refused then, naming it.

Parameters. Keyword arguments of the constructor override ``defaults``: a number (fixed), a tensor of
one element (fixed) or of ``[C]`` values, one per channel (dim 1 of a step ``[B, C, ...]``), or an
:class:`torch.nn.Parameter` (learnable). ``learnable=("tau", ...)`` makes those parameters learnable
from their values and ``per_channel=(...)`` with ``channels=C`` repeats them over ``C`` channels. A
learnable parameter is the module's ``nn.Parameter`` of that name (in the state dict); fixed ones are
buffers outside it. Subclasses with Python options that ``step`` reads set them before calling
``super().__init__`` (the step is traced at its end).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from ..backend import check_backend, use_triton
from ..kernels.neuron_graph import UnsupportedOp, trace
from .surrogate import check_surrogate, spike

__all__ = ["StepNeuron", "UnsupportedOp"]

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class StepNeuron(nn.Module):
    """A multi-step neuron from its one-step dynamics (see the module docstring).

    Args:
        surrogate: the surrogate gradient of :meth:`heaviside` (``sigmoid``, ``atan``, ``piecewise_quadratic``).
        alpha: its sharpness (None: the surrogate's default).
        backend: ``auto``, ``torch`` or ``triton``.
        channels: the channel count C of ``per_channel`` parameters.
        learnable: names of parameters to learn (from their given or default values).
        per_channel: names of parameters to repeat over ``channels``.
        store_v_seq: keep the first state's trace of the last call in ``self.v_seq`` (detached; runs the
            PyTorch loop).
        unsupported: ``"error"`` (default) refuses a step with an operation that cannot be generated;
            ``"torch"`` runs such a step on the PyTorch loop under every backend, with one warning.
        **values: parameter values (see the module docstring).
    """

    #: state name -> initial value (a number, or the name of a parameter whose value it starts at)
    states: Mapping[str, float | str] = {}
    #: parameter name -> default value
    defaults: Mapping[str, float] = {}

    def __init__(
        self,
        *,
        surrogate: str = "sigmoid",
        alpha: float | None = None,
        backend: str = "auto",
        channels: int | None = None,
        learnable: Iterable[str] = (),
        per_channel: Iterable[str] = (),
        store_v_seq: bool = False,
        unsupported: str = "error",
        **values,
    ) -> None:
        super().__init__()
        cls = type(self)
        self.surrogate, self.alpha = check_surrogate(surrogate, alpha)
        self.backend = check_backend(backend)
        self.store_v_seq = bool(store_v_seq)
        self.v_seq: torch.Tensor | None = None
        if unsupported not in ("error", "torch"):
            raise ValueError(f"unsupported={unsupported!r} is not valid; choose one of error, torch")
        if not self.states:
            raise ValueError(f"{cls.__name__} has no states: a StepNeuron declares at least one, e.g. "
                             "states = {'v': 0.0}")
        self.state_names: tuple[str, ...] = tuple(self.states)
        self.param_names: tuple[str, ...] = tuple(cls.defaults)
        valid = ", ".join(self.param_names) or "(none)"
        unknown = [n for n in values if n not in cls.defaults]
        if unknown:
            raise ValueError(f"{cls.__name__} has no parameter {', '.join(map(repr, unknown))}; valid parameters: "
                             f"{valid} (and surrogate, alpha, backend, channels, learnable, per_channel, store_v_seq)")
        learnable, per_channel = tuple(learnable), tuple(per_channel)
        for what, names in (("learnable", learnable), ("per_channel", per_channel)):
            bad = [n for n in names if n not in cls.defaults]
            if bad:
                raise ValueError(f"{what} names {', '.join(map(repr, bad))}, not parameters of {cls.__name__}; "
                                 f"valid parameters: {valid}")
        if per_channel and (channels is None or isinstance(channels, bool) or not isinstance(channels, int)
                            or channels < 1):
            raise ValueError(f"per_channel={per_channel!r} needs channels, a positive int (got {channels!r})")
        for name, init in self.states.items():
            if isinstance(init, str) and init not in cls.defaults:
                raise ValueError(f"state {name!r} starts at {init!r}, which is not a parameter; valid: {valid}")
        self.channels = channels
        for name in self.param_names:
            value = values.get(name, cls.defaults[name])
            self._set_param(name, value, name in learnable, channels if name in per_channel else None)
        self._compiled: dict = {}
        self._fallback = False
        try:
            self._graph = trace(self._traced_step, len(self.state_names), list(self.state_names),
                                list(self.param_names))
        except UnsupportedOp as err:
            if unsupported == "error":
                raise UnsupportedOp(f"{cls.__name__}.step cannot be generated into Triton kernels: {err}. "
                                    "Pass unsupported='torch' to run it as a PyTorch loop instead") from None
            warnings.warn(f"{cls.__name__}.step runs as a PyTorch loop under every backend: {err}", stacklevel=2)
            self._graph, self._fallback = None, True

    # -- parameters ---------------------------------------------------------------------------------

    def _set_param(self, name: str, value, learn: bool, channels: int | None) -> None:
        if hasattr(nn.Module, name) or name in ("states", "defaults", "step", "heaviside"):
            raise ValueError(f"parameter name {name!r} clashes with a module attribute; rename it")
        if isinstance(value, nn.Parameter):
            t, learn = value, True
        elif isinstance(value, torch.Tensor):
            t = value.detach().to(torch.float32)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ValueError(f"{name}={value!r} must be a finite number")
            t = torch.tensor(float(value), dtype=torch.float32)
        else:
            raise ValueError(f"{name}={value!r} must be a number, a tensor (one value or [C] per channel) or an "
                             "nn.Parameter")
        if t.numel() == 1:
            t = t.reshape(())
        elif t.dim() != 1:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; a parameter is one value or [C], one per channel "
                             "(dim 1 of a step [B, C, ...])")
        if channels is not None:
            if t.dim() == 0:
                t = t.expand(channels).clone()
            elif t.shape[0] != channels:
                raise ValueError(f"{name} has {t.shape[0]} values but channels={channels}")
        if learn:
            param = value if isinstance(value, nn.Parameter) and value.shape == t.shape else nn.Parameter(t.clone())
            self.register_parameter(name, param)
        else:
            self.register_buffer(name, t.clone(), persistent=False)

    def _param_tensors(self) -> list[torch.Tensor]:
        # the registered tensors themselves (what getattr finds, without nn.Module.__getattr__ per name)
        params, buffers = self._parameters, self._buffers
        return [params[n] if n in params else buffers[n] for n in self.param_names]

    def _params_on(self, device: torch.device) -> list[torch.Tensor]:
        """The parameters on ``device``, contiguous (as the kernels read them): a neuron built on the CPU and run on
        CUDA input (its constants are numbers to the user) reads copies there; the copies are differentiable, so
        learnable ones still get gradients. Tensors already there are used as they are (no operation per call)."""
        out = []
        for p in self._param_tensors():
            if p.device != device:
                p = p.to(device)
            out.append(p if p.is_contiguous() else p.contiguous())
        return out

    # -- the step -----------------------------------------------------------------------------------

    @property
    def spike_max(self) -> int | None:
        """1 where the step's output is :meth:`heaviside` of something (0 or 1 whatever the input), else None: not
        known to be integers (:func:`snntrain.nn.neurons.spike_max`). A subclass that fires other integers says so
        (ILIF: its ``max_spike_count``)."""
        graph = self._graph
        if graph is None or not graph.outputs:
            return None
        return 1 if graph.nodes[graph.outputs[0]].op == "spike" else None

    def step(self, x, *states_and_params, **params):  # pragma: no cover - every subclass writes it
        raise NotImplementedError(f"{type(self).__name__} must define step(self, x, *states, **params)")

    def _traced_step(self, x, *states, **params):
        return self.step(x, *states, **params)

    def heaviside(self, u):
        """The spike ``u >= 0`` (1.0 or 0.0) with the module's surrogate gradient."""
        return spike(u, self.surrogate, self.alpha)

    # -- running ------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, init: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | None = None,
                return_state: bool = False):
        """Outputs ``[T, ...]`` (``x``'s dtype) for ``x`` ``[T, ...]``; ``init`` gives initial states (by name,
        or in order; the others start at their initial values). With ``return_state`` also the final states,
        a dict of fp32 (fp64 for fp64 input) tensors of one step's shape."""
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
            what = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be a floating-point tensor [T, ...] with time first, got {what}")
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        step_shape = tuple(x.shape[1:])
        params = self._params_on(x.device)
        self._check_params(params, step_shape)
        inits = self._initial(init, step_shape)
        # torch.export records the PyTorch loop: a program must not depend on kernels generated in this process
        if (not torch.compiler.is_exporting() and use_triton(self.backend, x) and not self._fallback
                and not self.store_v_seq and x.dtype in _KERNEL_DTYPES):
            y, finals = self._triton(x, inits, params, ct, return_state)
        else:
            y, finals = self._torch(x, inits, params, ct, step_shape)
        if return_state:
            return y, dict(zip(self.state_names, finals))
        return y

    def _check_params(self, params: list[torch.Tensor], step_shape: tuple[int, ...]) -> None:
        for name, p in zip(self.param_names, params):
            if p.dim() == 1:
                C = step_shape[1] if len(step_shape) > 1 else None
                if C != p.shape[0]:
                    raise ValueError(f"parameter {name} has {p.shape[0]} values, one per channel, but a step of the "
                                     f"input has shape {step_shape} (channels are dim 1 of a step [B, C, ...]: "
                                     f"{C if C is not None else 'none'})")

    def _initial(self, init, step_shape) -> list[torch.Tensor | None]:
        """The given initial states in the state order (None: the declared initial value)."""
        out: list[torch.Tensor | None] = [None] * len(self.state_names)
        if init is None:
            return out
        if isinstance(init, Mapping):
            bad = [k for k in init if k not in self.state_names]
            if bad:
                raise ValueError(f"init names {', '.join(map(repr, bad))}, not states of {type(self).__name__}; "
                                 f"valid states: {', '.join(self.state_names)}")
            items = [(self.state_names.index(k), v) for k, v in init.items()]
        else:
            init = list(init)
            if len(init) > len(self.state_names):
                raise ValueError(f"init has {len(init)} tensors; {type(self).__name__} has states "
                                 f"{', '.join(self.state_names)}")
            items = list(enumerate(init))
        for i, v in items:
            if v is None:
                continue
            if not isinstance(v, torch.Tensor) or tuple(v.shape) != step_shape:
                shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                raise ValueError(f"initial state {self.state_names[i]} has shape {shape}; it must have the shape of "
                                 f"one step, {step_shape}")
            out[i] = v
        return out

    def _torch_param(self, p: torch.Tensor, ct, step_shape) -> torch.Tensor:
        p = p.to(ct)
        if p.dim() == 1:  # [C] over dim 1 of [B, C, ...]
            return p.reshape(p.shape[0], *([1] * (len(step_shape) - 2)))
        return p

    def _torch(self, x, inits, params, ct, step_shape):
        """The reference: ``step`` as a PyTorch loop (autograd through every operation)."""
        ps = {n: self._torch_param(p, ct, step_shape) for n, p in zip(self.param_names, params)}
        states = []
        for name, given in zip(self.state_names, inits):
            if given is not None:
                states.append(given.to(ct))
                continue
            init = self.states[name]
            base = torch.zeros(step_shape, dtype=ct, device=x.device)
            states.append(base + (ps[init] if isinstance(init, str) else float(init)))
        outs, trace_ = [], []
        for t in range(x.shape[0]):
            result = self.step(x[t].to(ct), *states, **ps)
            out, states = result[0], list(result[1:])
            if not isinstance(out, torch.Tensor):
                out = torch.full(step_shape, float(out), dtype=ct, device=x.device)
            outs.append(out.to(x.dtype).expand(step_shape))
            if self.store_v_seq:
                trace_.append(torch.broadcast_to(states[0], step_shape).detach().to(torch.float32))
        if self.store_v_seq:
            self.v_seq = torch.stack(trace_)
        finals = [torch.broadcast_to(torch.as_tensor(s, dtype=ct, device=x.device), step_shape) for s in states]
        return torch.stack(outs), finals

    def _spec(self, params, fp64: bool, affine: str = ""):
        from ..kernels.neuron_codegen import KernelSpec

        return KernelSpec(
            states=self.state_names, params=self.param_names,
            per_channel=tuple(p.dim() == 1 for p in params),
            learnable=tuple(p.requires_grad for p in params),
            inits=tuple(self.states[n] if isinstance(self.states[n], str)
                        else float(self.states[n]) for n in self.state_names),
            fp64=fp64, affine=affine,
        )

    def kernel_key(self, x_dtype: torch.dtype = torch.float32) -> str:
        """The key of this neuron's generated kernels for input of ``x_dtype`` (generating them if needed)."""
        return _kernel_key(self, x_dtype == torch.float64)

    def fusable(self, x: torch.Tensor) -> bool:
        """Whether a norm in front of this neuron can be folded into its kernels for input ``x`` (the generated
        kernels run it: see :class:`~snntrain.nn.NormNeuron`)."""
        return (use_triton(self.backend, x) and not self._fallback and not self.store_v_seq
                and x.dtype in _KERNEL_DTYPES and not torch.compiler.is_compiling()
                and not torch.compiler.is_exporting())

    def bn_forward(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, mean: torch.Tensor,
                   rstd: torch.Tensor, batch_stats: bool, T: int | None = None) -> torch.Tensor:
        """The outputs for the batch norm ``(x - mean) * rstd * weight + bias`` of ``x`` ``[T, B, C, ...]`` (or
        ``[B, C, H, W]`` repeated over ``T`` steps), computed inside this neuron's generated kernels (``mean``,
        ``rstd``: [C] fp32, fp64 for fp64 input, from :func:`snntrain.kernels.bn_neuron.bn_stats`;
        ``batch_stats``: they are the batch's, and the gradient flows through them)."""
        from ..kernels.step_neuron import bn_step_neuron

        params = self._params_on(x.device)
        self._check_params(params, tuple(x.shape[1:]) if T is None else tuple(x.shape))
        key = _kernel_key(self, x.dtype == torch.float64, "bn")
        return bn_step_neuron(x, weight, bias, mean, rstd, batch_stats, params, key, T)

    def ln_forward(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                   T: int | None = None) -> torch.Tensor:
        """The outputs for the layer norm over channels (:class:`~snntrain.nn.LayerNorm2d`: ``eps`` added to the
        variance, ``weight``, ``bias`` [C] or None) of ``x`` ``[T, B, C, H, W]`` (or ``[B, C, H, W]`` repeated over
        ``T`` steps), computed inside this neuron's generated kernels
        (:func:`snntrain.kernels.step_neuron.ln_step_neuron`; the gradient flows through the statistics)."""
        from ..kernels.step_neuron import ln_step_neuron

        params = self._params_on(x.device)
        self._check_params(params, tuple(x.shape[1:]) if T is None else tuple(x.shape))
        key = _kernel_key(self, x.dtype == torch.float64, "ln")
        return ln_step_neuron(x, weight, bias, eps, params, key, T)

    def _triton(self, x, inits, params, ct, return_state):
        from ..kernels.step_neuron import step_neuron

        key = _kernel_key(self, ct == torch.float64)
        init = None
        if any(i is not None for i in inits):
            step_shape = tuple(x.shape[1:])
            rows = []
            for name, given in zip(self.state_names, inits):
                if given is not None:
                    rows.append(given.to(device=x.device, dtype=ct))
                    continue
                value = self.states[name]
                p = (self._torch_param(getattr(self, value).to(x.device), ct, step_shape) if isinstance(value, str)
                     else float(value))
                rows.append(torch.zeros(step_shape, dtype=ct, device=x.device) + p)
            init = torch.stack(rows).contiguous()
        y, final = step_neuron(x, init, params, key, return_state)
        return y, (list(final.unbind(0)) if final is not None else None)

    #: why the dynamics have no NIR node (the end of :meth:`nir_form`'s refusal); families say what they do
    nir_reason = "its step is not one of the linear leaky integrations that NIR defines"

    def nir_form(self) -> tuple[str, dict[str, float | torch.Tensor]]:
        """``(node, values)`` of the NIR neuron these dynamics are (``"LIF"``: ``tau_steps``, ``r``, ``v_threshold``,
        ``v_reset``; ``"CubaLIF"``: ``c_decay``, ``v_decay``, ``v_threshold``, ``v_reset``; each a number or one
        value per channel), for :mod:`snntrain.nir_graph`. Raises ValueError with the reason where NIR has no node
        for them (the default: a StepNeuron's step is arbitrary)."""
        raise ValueError(f"{type(self).__name__} has no NIR form: NIR's neurons are IF, LIF and CubaLIF (linear "
                         f"leaky integration with a hard reset), and {self.nir_reason}")

    def extra_repr(self) -> str:
        parts = []
        for n, p in zip(self.param_names, self._param_tensors()):
            kind = "learnable " if p.requires_grad else ""
            parts.append(f"{n}={kind}[{p.shape[0]}]" if p.dim() else f"{n}={kind}{float(p.detach()):.4g}")
        parts += [f"surrogate={self.surrogate}(alpha={self.alpha})", f"backend={self.backend}"]
        return ", ".join(parts)


@torch.compiler.assume_constant_result
def _kernel_key(neuron: StepNeuron, fp64: bool, affine: str = "") -> str:
    """The key of ``neuron``'s kernels for its current parameters (learnable or not, one value or per channel):
    generated and compiled on first use, then from the neuron's own table. A constant for ``torch.compile``,
    which calls it while tracing instead of tracing through it. ``affine``: the norm folded into the kernels
    (:attr:`~snntrain.kernels.neuron_codegen.KernelSpec.affine`)."""
    params = neuron._param_tensors()
    # what the spec depends on per call (the rest is fixed when the module is built): a cheaper lookup than the spec
    kinds = (fp64, affine, *((p.dim(), p.requires_grad) for p in params))
    key = neuron._compiled.get(kinds)
    if key is None:
        from ..kernels.neuron_jit import compile_neuron

        key = neuron._compiled[kinds] = compile_neuron(neuron._graph, neuron._spec(params, fp64, affine)).key
    return key
