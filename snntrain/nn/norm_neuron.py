"""A channel norm followed by a spiking neuron, fused under the Triton backend.

In SEW-ResNet and the detector every convolution's output goes through a norm and then
a neuron (conv -> norm -> neuron). :class:`NormNeuron` holds that norm
(:class:`torch.nn.BatchNorm2d` or :class:`~snntrain.nn.norm.LayerNorm2d`) and neuron
(:class:`~snntrain.nn.neurons.IF`, ``LIF``, ``PLIF``, or any other neuron of :mod:`snntrain.nn`) as its submodules ``norm`` and
``neuron``, so its state dict is theirs (``norm.weight``, ``norm.bias``,
``norm.running_mean``, ``norm.running_var``, ``norm.num_batches_tracked``, and PLIF's
``neuron.w``) under every backend. With ``backend`` ``triton`` (or ``auto`` on CUDA) it
runs the fused kernels of :mod:`snntrain.kernels.bn_neuron` and :mod:`~snntrain.kernels.ln_neuron`, which read the activation
once per pass instead of three times; with ``torch`` it runs the norm and then the neuron,
the reference. Batch norm keeps the semantics of :class:`torch.nn.BatchNorm2d` in both:
training-mode batch statistics, running statistics updated with ``momentum`` (or the
cumulative average when ``momentum`` is None) and ``num_batches_tracked``, eval mode
with the running statistics.

:func:`norm_neuron_max_pool` runs a ``NormNeuron`` and the max-pool of its spikes after it (the ResNets' ImageNet
stem) as one op under Triton (:mod:`snntrain.kernels.bn_neuron_pool`), and :func:`norm_neuron_add` a ``NormNeuron``
and the addition of a residual to its spikes (SEW-ResNet's ``ADD``) in the fused kernel, and
:func:`norm_add_neuron` a batch norm, a residual added to its output and the neuron after them (Spiking ResNet) as
the fused kernel, each holding nothing itself: the modules, their names and state dicts stay as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from ..backend import FallbackWarning, check_backend, use_triton
from .layers import MultiStep, check_connect, sew_connect
from .neurons import BaseNeuron, is_neuron
from .norm import LayerNorm2d
from .step_neuron import StepNeuron

_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=256)  # NeuronParams is frozen and hashable; read by every fused call
def _neuron_options(p) -> dict:
    """The fused kernels' neuron options of a :class:`~snntrain.nn.functional.NeuronParams` (without PLIF's ``w``)."""
    return dict(kind=p.kind, tau=p.tau, v_threshold=p.v_threshold, v_reset=p.v_reset, decay_input=p.decay_input,
                detach_reset=p.detach_reset, surrogate=p.surrogate, alpha=p.alpha)


def _bn_bookkeeping(norm: nn.BatchNorm2d) -> tuple[float | torch.Tensor, torch.Tensor | None, bool]:
    """The bookkeeping of :meth:`torch.nn.BatchNorm2d.forward`, without reading ``num_batches_tracked`` on the host:
    ``(momentum, counter, use_running)``, the factor the running statistics are folded in with (the cumulative
    average's ``1 / num_batches_tracked`` when ``momentum`` is None, counted here first), the counter the fused
    call counts the batch in (None where it is counted already or not at all) and whether the running statistics
    are used (updated in training, read in eval)."""
    momentum, training, count = norm.momentum, norm.training, norm._buffers["num_batches_tracked"]
    factor: float | torch.Tensor = 0.0 if momentum is None else momentum
    nbt = None
    if training and norm.track_running_stats and count is not None:
        if momentum is None:  # the cumulative average: the count first, then its reciprocal
            count.add_(1)
            factor = 1.0 / count
        else:  # counted with the running statistics' update
            nbt = count
    return factor, nbt, not training or norm.track_running_stats


class NormNeuron(nn.Module):
    """``neuron(norm(x))`` over multi-step feature maps.

    Args:
        norm: a :class:`torch.nn.BatchNorm2d` or :class:`~snntrain.nn.norm.LayerNorm2d` over ``C`` channels
            (:class:`torch.nn.Identity` where the batch norm was folded into the preceding convolution).
        neuron: the spiking neuron that follows it.
        backend: ``auto``, ``torch`` or ``triton`` (switchable at any time, e.g. with
            :func:`snntrain.nn.set_backend`; never changes the state dict).

    ``forward(x)`` takes ``[T, B, C, H, W]``; ``forward(x, T=T)`` takes ``[B, C, H, W]``
    repeated over ``T`` steps (direct encoding of a static image): the norm sees each
    element once, as when the stem's output is normalised before it is repeated.
    Returns spikes ``[T, B, C, H, W]`` in ``x``'s dtype (and memory format under Triton).
    A parallel spiking neuron (:mod:`snntrain.nn.psn`) follows the norm unfused, each with its own kernels.
    A :class:`torch.nn.SyncBatchNorm` (``trainer.sync_batchnorm=true`` converts the batch norm in
    place) runs unfused too: its statistics come from every process, which the fused kernels do not
    gather. The neuron's ``store_v_seq`` monitoring runs the unfused path, and so does ``fused = False``
    (a plain attribute: the norm's and the neuron's own kernels, one after the other). A
    :class:`~snntrain.nn.StepNeuron` (the families among them) after a batch norm or a layer norm runs fused in
    its own generated kernels (eager calls; the norm's statistics kernel first, then the generated kernels
    normalise as they read, and one pass finishes dL/dx through the statistics: elementwise for the batch norm's
    per-channel ones, the layer norm's backward kernel for its per-position ones); under ``torch.compile`` and
    for other neuron types (PSN) the norm runs first, then the neuron.
    """

    #: While an :class:`snntrain.efficiency.ActivityCounter` is attached: the counter's sink for this layer's
    #: spikes. The layer hands it every call's spikes; the fused batch-norm kernel, in inference, adds them up
    #: per channel as it fires them (``sink.row``), so that the counter does not read them again.
    activity = None

    def __init__(self, norm: nn.Module, neuron: nn.Module, backend: str = "auto") -> None:
        super().__init__()
        if not isinstance(norm, (nn.BatchNorm2d, nn.SyncBatchNorm, LayerNorm2d, nn.Identity)):
            raise TypeError(f"norm is a {type(norm).__name__}; NormNeuron takes torch.nn.BatchNorm2d, SyncBatchNorm "
                            "or LayerNorm2d (or nn.Identity for a batch norm already folded into the convolution)")
        if not is_neuron(neuron):
            raise TypeError(f"neuron is a {type(neuron).__name__}; NormNeuron takes a spiking neuron of snntrain.nn "
                            "(IF, LIF, PLIF, PSN, MaskedPSN, SlidingPSN, a StepNeuron or any registered type)")
        self.norm = norm
        self.neuron = neuron
        self.backend = check_backend(backend)
        self.fused = True

    def forward(self, x: torch.Tensor, T: int | None = None) -> torch.Tensor:
        self._check_steps(x, T)
        # never read under torch.compile: a compiled training step neither counts nor guards on the counter
        sink = None if torch.compiler.is_compiling() else self.activity
        counted = False  # by the fused kernel, into the sink's row
        # the submodules, parameters and buffers from their dicts: what nn.Module.__getattr__ returns, without a
        # failed attribute lookup first for each of them (host time on every call of every layer)
        modules = self._modules
        norm, neuron = modules["norm"], modules["neuron"]
        if isinstance(norm, nn.Identity):  # folded into the convolution before it (NIR, deployment)
            y = x if T is None else x.unsqueeze(0).expand(T, *x.shape)
            spikes = neuron(y)
        else:
            self._check_channels(x, norm)
            if self._fuses(x, norm, neuron):
                spikes, counted = self._fused(x, T, norm, neuron, sink)
            elif (self.fused and isinstance(neuron, StepNeuron) and isinstance(norm, (nn.BatchNorm2d, LayerNorm2d))
                  and not isinstance(norm, nn.SyncBatchNorm) and use_triton(self.backend, x) and neuron.fusable(x)):
                spikes = self._fused_step(x, T, norm, neuron)
            elif T is not None:
                y = norm(x)
                spikes = neuron(y.unsqueeze(0).expand(T, *y.shape))
            else:
                spikes = neuron(norm(x.flatten(0, 1)).unflatten(0, x.shape[:2]))
        if sink is not None:
            sink(spikes, counted)
        return spikes

    def _fuses(self, x: torch.Tensor, norm: nn.Module, neuron: nn.Module) -> bool:
        """Whether the forward runs the fused kernels of the norm and a built-in neuron (:meth:`_fused`)."""
        return (self.fused and isinstance(neuron, BaseNeuron) and use_triton(self.backend, x)
                and x.dtype in _FUSED_DTYPES and not neuron.store_v_seq and not isinstance(norm, nn.SyncBatchNorm))

    @staticmethod
    def _check_steps(x: torch.Tensor, T: int | None) -> None:
        """The one check of x's rank and T: the fused kernels take them as given."""
        if T is None and x.dim() != 5:
            raise ValueError(f"NormNeuron expects [T, B, C, H, W] input (or [B, C, H, W] with T), got shape "
                             f"{tuple(x.shape)}")
        if T is not None and (x.dim() != 4 or isinstance(T, bool) or not isinstance(T, int) or T < 1):
            raise ValueError(f"NormNeuron with T={T!r} expects [B, C, H, W] input and T a positive int, got shape "
                             f"{tuple(x.shape)}")

    @staticmethod
    def _check_channels(x: torch.Tensor, norm: nn.Module) -> None:
        channels = norm.num_channels if isinstance(norm, LayerNorm2d) else norm.num_features
        if x.shape[-3] != channels:
            raise ValueError(f"input has {x.shape[-3]} channels (dim -3 of shape {tuple(x.shape)}) but the norm "
                             f"was built for {channels}")

    @staticmethod
    def _fused_step(x: torch.Tensor, T: int | None, norm: nn.BatchNorm2d | LayerNorm2d,
                    neuron: StepNeuron) -> torch.Tensor:
        """A batch norm or a layer norm folded into a :class:`~snntrain.nn.StepNeuron`'s generated kernels. Batch norm:
        the statistics (one pass of the statistics kernel, which reads ``x`` as the norm sees it: once per element
        with ``T``; it also updates the running statistics as :class:`torch.nn.BatchNorm2d` does), then the neuron's
        kernels normalise as they read (:func:`snntrain.kernels.step_neuron.bn_step_neuron`). Layer norm: the
        neuron's tile kernels compute each position's statistics themselves, one kernel per direction
        (:func:`~snntrain.kernels.step_neuron.ln_step_neuron`)."""
        from ..kernels import bn_neuron
        from ..kernels.norm_neuron_base import _map

        params = norm._parameters
        if isinstance(norm, LayerNorm2d):
            return neuron.ln_forward(x, params.get("weight"), params.get("bias"), norm.eps, T)
        x = _map(x, T)[0]  # H and W as one run (odd layouts copied once, differentiably)
        factor, nbt, use_running = _bn_bookkeeping(norm)
        buffers = norm._buffers
        mean, rstd, batch_stats = bn_neuron.bn_stats(
            x, buffers["running_mean"] if use_running else None, buffers["running_var"] if use_running else None,
            training=norm.training, momentum=factor, eps=norm.eps, T=T, num_batches_tracked=nbt)
        return neuron.bn_forward(x, params.get("weight"), params.get("bias"), mean, rstd, batch_stats, T)

    @staticmethod
    def _fused(x: torch.Tensor, T: int | None, norm: nn.Module, neuron: BaseNeuron,
               sink=None, residual: torch.Tensor | None = None, connect: str = "ADD") -> tuple[torch.Tensor, bool]:
        """The fused kernels' spikes, and whether they were counted into ``sink``'s row (batch norm in inference);
        with ``residual`` (batch norm, no ``sink``), the spikes' SEW ``connect`` with ``residual``
        (:func:`norm_neuron_add`)."""
        from ..kernels import bn_neuron, ln_neuron

        options = _neuron_options(neuron.params)
        w = neuron._w()
        params = norm._parameters
        if isinstance(norm, LayerNorm2d):
            return ln_neuron.ln_neuron(x, params["weight"], params["bias"], eps=norm.eps, T=T, w=w, **options), False
        factor, nbt, use_running = _bn_bookkeeping(norm)
        buffers, training = norm._buffers, norm.training
        # in inference (validation, task=report) the kernel counts the spikes for an attached counter
        row = sink.row(x, T) if sink is not None and not torch.is_grad_enabled() else None
        spikes = bn_neuron.bn_neuron(
            x, params["weight"], params["bias"], buffers["running_mean"] if use_running else None,
            buffers["running_var"] if use_running else None, training=training, momentum=factor, eps=norm.eps,
            T=T, count=row, num_batches_tracked=nbt, w=w, residual=residual, connect=connect, **options,
        )
        return spikes, row is not None

    def extra_repr(self) -> str:
        return f"backend={self.backend}"


#: The configurations :func:`norm_neuron_max_pool` cannot fuse: one warning per reason and process.
_pool_fallback = FallbackWarning("norm_neuron_max_pool: the fused batch norm -> neuron -> max-pool op does not take "
                                 "{reason}; running the norm-neuron and the max-pool one after the other")


def _watched(*modules: nn.Module) -> bool:
    """Whether a forward or backward hook is registered on one of ``modules`` or on every module: the fused op
    would skip the calls such a hook watches."""
    from torch.nn.modules import module as M

    if (M._global_forward_hooks or M._global_forward_pre_hooks or M._global_backward_hooks
            or M._global_backward_pre_hooks):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
               for m in modules)


def _pool_fusion(sn: NormNeuron, pool: nn.Module, x: torch.Tensor) -> str | None:
    """None where :func:`norm_neuron_max_pool` runs the fused op; otherwise why not: ``""`` where the modules are
    to run one after the other as they are (the PyTorch backend, ``fused = False``, monitoring), else the
    configuration the fused op does not take (said once)."""
    from ..kernels.bn_neuron_pool import POOL_PARAMS
    from .pool import SpikeMaxPool2d

    if torch.compiler.is_compiling():
        # torch.compile and torch.export trace the two modules, whose operators compile on the GPU; the fused
        # operator's training graph failed under inductor on CUDA (AOT autograd: "a leaf Variable that requires grad
        # is being used in an in-place operation"), which the CPU's compilers do not reproduce
        return ""
    inner = pool[0] if isinstance(pool, MultiStep) and len(pool) == 1 else pool
    if not use_triton(sn.backend, x) or (isinstance(inner, SpikeMaxPool2d) and not use_triton(inner.backend, x)):
        return ""
    norm, neuron = sn._modules["norm"], sn._modules["neuron"]
    if not sn.fused or getattr(neuron, "store_v_seq", False) or _watched(sn, norm, neuron, pool, inner) \
            or sn.activity is not None:
        return ""  # the modules' own calls: asked for, or watched (hooks, an activity counter, the membrane)
    if not isinstance(inner, SpikeMaxPool2d):
        return f"{type(inner).__name__} as the pool (it takes SpikeMaxPool2d)"
    if tuple(inner._pool_params) != POOL_PARAMS:
        return (f"max-pooling with kernel_size={inner.kernel_size}, stride={inner.stride}, padding={inner.padding}, "
                f"dilation={inner.dilation}, ceil_mode={inner.ceil_mode} (it pools 3x3 with stride 2 and padding 1)")
    if not isinstance(norm, nn.BatchNorm2d):
        return f"{type(norm).__name__} as the norm (it takes torch.nn.BatchNorm2d)"
    if not isinstance(neuron, BaseNeuron):
        return f"{type(neuron).__name__} as the neuron (it takes IF, LIF and PLIF)"
    if x.dtype not in _FUSED_DTYPES:
        return f"{x.dtype} input (it takes float32, float16 and bfloat16)"
    return None


def norm_neuron_max_pool(sn: NormNeuron, pool: nn.Module, x: torch.Tensor, T: int | None = None) -> torch.Tensor:
    """``pool(sn(x, T=T))``: the spikes of a :class:`NormNeuron` max-pooled (the ImageNet stem of the ResNets:
    convolution, batch norm, neuron, 3x3 stride-2 max-pool), as one op where it can be.

    ``pool``: a :class:`~snntrain.nn.SpikeMaxPool2d` over ``[N, C, H, W]`` wrapped in a
    :class:`~snntrain.nn.MultiStep` (as :meth:`snntrain.models.common.LayerFactory.max_pool` makes it), or another
    module over ``[T, B, C, H, W]``. Under the Triton backend, with a :class:`torch.nn.BatchNorm2d`, an IF, LIF or
    PLIF neuron and a 3x3, stride-2, padding-1 pool, the norm, the neuron and the pool run as
    :func:`snntrain.kernels.bn_neuron_pool.bn_neuron_pool`: the same pooled spikes, gradients and running
    statistics as the two modules one after the other, without the full-resolution spikes and their gradient in
    memory. Otherwise the two modules run one after the other: silently under the PyTorch backend, with
    ``sn.fused = False``, while a hook or an activity counter watches either module or the neuron keeps its
    membrane (``store_v_seq``), and in a compiled graph (``torch.compile``, ``torch.export``: the fused op runs in
    eager calls and in CUDA graphs captured from them, as ``trainer.cuda_graph`` does); for any other
    configuration a warning names it, once per configuration. The modules' state dicts, parameters and
    buffers are used as they are: the function holds nothing."""
    reason = _pool_fusion(sn, pool, x)
    if reason is None:
        from ..kernels.bn_neuron_pool import bn_neuron_pool

        sn._check_steps(x, T)
        norm, neuron = sn._modules["norm"], sn._modules["neuron"]
        sn._check_channels(x, norm)
        factor, nbt, use_running = _bn_bookkeeping(norm)
        buffers, params = norm._buffers, norm._parameters
        return bn_neuron_pool(
            x, params["weight"], params["bias"], buffers["running_mean"] if use_running else None,
            buffers["running_var"] if use_running else None, training=norm.training, momentum=factor, eps=norm.eps,
            T=T, num_batches_tracked=nbt, w=neuron._w(), **_neuron_options(neuron.params),
        )
    if reason:
        _pool_fallback(reason, stacklevel=3)
    return pool(sn(x, T=T))


def _value(residual: torch.Tensor | Callable[[], torch.Tensor]) -> torch.Tensor:
    """A residual given as a tensor, or as the function that computes it (called now)."""
    return residual() if callable(residual) else residual


def norm_neuron_add(sn: NormNeuron, x: torch.Tensor, residual: torch.Tensor | Callable[[], torch.Tensor],
                    T: int | None = None, connect: str = "ADD") -> torch.Tensor:
    """``sn(x, T=T) + residual``: the spikes of a :class:`NormNeuron` plus a tensor of their shape (SEW-ResNet's
    ``ADD`` connection of a block's last spikes and its shortcut), the addition folded into the fused kernel where
    it can be. ``connect``: SEW-ResNet's connection, ``"ADD"``, ``"AND"`` (``spikes * residual``) or ``"IAND"``
    (``(1 - spikes) * residual``), as :func:`snntrain.nn.layers.sew_connect` forms it; AND and IAND are folded alike
    (the backward's scan then forms the spikes' gradient and ``residual``'s).

    ``residual``: the tensor, or a function without arguments that returns it (the shortcut's layers, run after
    ``sn`` where the addition is not folded and before it where it is, so that layers watched by hooks run in the
    order of the unfolded block).

    Under the Triton backend, with a :class:`torch.nn.BatchNorm2d` and an IF, LIF or PLIF neuron in an eager call
    (and CUDA graphs captured from one), the forward kernel adds ``residual`` to the spikes as it stores them
    (:func:`snntrain.kernels.bn_neuron.bn_neuron`'s ``residual``, where ``residual`` is laid out as the spikes): one
    read of ``residual`` instead of an addition's two reads and one write, and the sum is what the kernel writes,
    the spikes never are. The result and every gradient are those of the module followed by the addition, bit for
    bit. Otherwise the module runs and the addition follows: under the PyTorch backend, with ``sn.fused = False``,
    for other norms and neurons, while a hook or an activity counter watches the module, its norm or its neuron
    (they see the spikes, as without this function) and where the neuron keeps its membrane (``store_v_seq``). The
    module's state dict, parameters and buffers are used as they are: the function holds nothing."""
    connect = check_connect(connect)
    if isinstance(sn, NormNeuron):
        norm, neuron = sn._modules["norm"], sn._modules["neuron"]
        if (isinstance(norm, nn.BatchNorm2d) and sn.activity is None and sn._fuses(x, norm, neuron)
                and not _watched(sn, norm, neuron)):
            sn._check_steps(x, T)
            sn._check_channels(x, norm)
            r = _value(residual)
            return sn._fused(x, T, norm, neuron, residual=r, connect=connect)[0]
    out = sn(x) if T is None else sn(x, T=T)  # a module put in sn's place may not take T
    return sew_connect(out, _value(residual), connect)


def norm_add_neuron(norm: nn.Module, neuron: nn.Module, x: torch.Tensor,
                    residual: torch.Tensor | Callable[[], torch.Tensor]) -> torch.Tensor:
    """``neuron(norm(x) + residual)``: a block's last norm, its shortcut added, and the neuron after them (Spiking
    ResNet's blocks), as one fused batch-norm neuron where it can be.

    ``norm``: a :class:`~snntrain.nn.MultiStep` holding one :class:`torch.nn.BatchNorm2d` (the norm over
    ``[T, B, C, H, W]`` as the models build it); ``neuron``: its neuron; ``x``: ``[T, B, C, H, W]``; ``residual``:
    a tensor of that shape, or a function without arguments that returns it (the shortcut's layers, run after the
    norm where nothing is fused and before the fused op where it is, as :func:`norm_neuron_add`'s).

    Under the Triton backend, with an IF, LIF or PLIF neuron in an eager call (and CUDA graphs captured from one),
    the batch norm, the addition and the neuron run as :func:`snntrain.kernels.bn_neuron.bn_neuron` with
    ``residual_to="input"``: the residual is added to the normalised input in float32 inside the kernel, so neither
    the norm's output nor the sum is written, and the backward forms the residual's gradient in the same scan. The
    spikes and gradients are those of the three steps in float32 arithmetic (PyTorch's path rounds the norm's
    output and the sum to the input's dtype first), the running statistics the norm's. Otherwise the modules run
    one after the other: under the PyTorch backend, for other norms and neurons, in compiled graphs, while a hook
    or an activity counter watches the norm or the neuron, and where the neuron keeps its membrane
    (``store_v_seq``). The modules' state dicts, parameters and buffers are used as they are."""
    bn = norm[0] if isinstance(norm, MultiStep) and len(norm) == 1 else None
    if (type(bn) is nn.BatchNorm2d and isinstance(neuron, BaseNeuron) and not neuron.store_v_seq and x.dim() == 5
            and x.dtype in _FUSED_DTYPES and not torch.compiler.is_compiling() and use_triton(neuron.backend, x)
            and not _watched(norm, bn, neuron)):
        from ..kernels.bn_neuron import bn_neuron, residual_fits

        NormNeuron._check_channels(x, bn)
        r = _value(residual)
        if residual_fits(x, None, r):
            factor, nbt, use_running = _bn_bookkeeping(bn)
            buffers, params = bn._buffers, bn._parameters
            return bn_neuron(
                x, params["weight"], params["bias"], buffers["running_mean"] if use_running else None,
                buffers["running_var"] if use_running else None, training=bn.training, momentum=factor, eps=bn.eps,
                num_batches_tracked=nbt, w=neuron._w(), residual=r, residual_to="input",
                **_neuron_options(neuron.params))
        return neuron(norm(x) + r)
    out = norm(x)
    return neuron(out + _value(residual))
