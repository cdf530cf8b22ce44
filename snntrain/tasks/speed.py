"""Training-step speed settings applied by the task: memory layout and ``torch.compile``.

Neither changes what is computed (up to floating-point summation order) nor what is
saved: checkpoints keep the model's own state-dict keys and row-major tensors.

* ``channels_last``: ``auto`` (on with CUDA), ``true`` or ``false``. Convolution weights
  are stored NHWC, so convolutions, batch norms, pooling and the neuron kernels all read
  and write NHWC maps in place and cuDNN never transposes.
* ``compile``: ``null`` (eager), ``default``, ``reduce-overhead`` (CUDA graphs) or
  ``max-autotune``, the ``mode`` of ``torch.compile`` for the training forward (and, through
  AOTAutograd, its backward). Shapes are static: the task skips a last partial batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: ``compile`` modes; None (``null`` in YAML) runs eagerly.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CHANNELS_LAST = ("auto", True, False)


def check_compile(value: Any) -> str | None:
    """The compile mode, or None for eager; anything else is refused by name."""
    if value is None or value is False:
        return None
    if not isinstance(value, str) or value not in COMPILE_MODES:
        raise ValueError(f"compile={value!r} is not valid; choose null (eager) or one of {', '.join(COMPILE_MODES)}")
    return value


def check_channels_last(value: Any) -> str | bool:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError(f"channels_last={value!r} is not valid; choose auto (on with CUDA), true or false")


def use_channels_last(value: Any, device: torch.device | str) -> bool:
    """Whether to run channels-last on ``device``: ``auto`` means on CUDA, where it is faster."""
    value = check_channels_last(value)
    if value == "auto":
        return torch.device(device).type == "cuda"
    return value


def _row_major_state(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    for key, value in state_dict.items():
        if key.startswith(prefix) and isinstance(value, torch.Tensor) and not value.is_contiguous():
            state_dict[key] = value.contiguous()


def to_channels_last(model: nn.Module) -> nn.Module:
    """Store ``model``'s 4-d weights NHWC, in place; its state-dict stays row-major."""
    model.to(memory_format=torch.channels_last)
    if not getattr(model, "_snntrain_row_major_state", False):
        model._register_state_dict_hook(_row_major_state)
        model._snntrain_row_major_state = True
    return model


def compile_model(model: nn.Module, mode: str | None, backend: str = "inductor") -> nn.Module:
    """``model`` compiled with ``torch.compile`` in ``mode`` with static shapes (the model itself
    when ``mode`` is None). The result shares the model's parameters; keep saving the model."""
    mode = check_compile(mode)
    if mode is None:
        return model
    if backend != "inductor":  # modes are inductor's; other backends (tests: aot_eager) take none
        return torch.compile(model, dynamic=False, backend=backend)
    return torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)
