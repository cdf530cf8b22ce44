"""Which arguments PyTorch's compile-time analysis (``identify_accessed_tensors``, what inductor uses to functionalize a
Triton kernel's launch) takes each of our Triton kernels to write, for the kernels the registered operators launch,
and whether any of them is an input of the operator.

Run by ``tests/test_kernel_writes.py`` in a fresh interpreter without ``TRITON_INTERPRET`` (the kernels must be
``@triton.jit`` functions). The operators run on CPU tensors as ``torch.compile`` calls them (the registered
operators, not the eager paths), with their kernels' launches captured instead of run (a CUDA target stands in for
the GPU where there is none). The last line printed is the report as JSON: per ``"operator kernel"``, the written
arguments and those that are tensors the operator was given.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from torch._library.custom_ops import CustomOpDef  # noqa: E402

if not torch.cuda.is_available():
    from triton.backends.compiler import GPUTarget

    class _Target:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    triton.runtime.driver.set_active(_Target())

import snntrain.backend  # noqa: E402
import snntrain.kernels  # noqa: E402

snntrain.backend.triton_interpret = lambda: True  # CPU tensors may take the Triton paths
RUNNING: list[tuple[str, list[torch.Tensor]]] = []  # the operators being called: (name, the tensors they were given)
LAUNCHES: list[tuple[str | None, object, dict, list[torch.Tensor]]] = []  # (operator, kernel, arguments, its inputs)


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += _tensors(v)
    return out


def _called(name: str, op):
    def call(*args, **kwargs):
        RUNNING.append((name, _tensors((*args, *kwargs.values()))))
        try:
            return op(*args, **kwargs)
        finally:
            RUNNING.pop()

    return call


class _Capture:
    """``op_wrap``'s stand-in: ``_Capture(kernel)[grid](*args, **kwargs)`` records the launch."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            names = self.kernel.arg_names
            bound = dict(zip(names, args))
            bound.update({k: v for k, v in kwargs.items() if k in names})
            name, inputs = RUNNING[-1] if RUNNING else (None, [])
            LAUNCHES.append((name, self.kernel, bound, inputs))

        return run


def _patch() -> None:
    """Every kernel module launches through ``_Capture`` and calls its operators through :func:`_called`; every call
    is traced (the registered operators), as under ``torch.compile``."""
    from snntrain.kernels import op_utils

    op_utils.traced = lambda *a: True
    torch.compiler.is_compiling = lambda: True
    for info in pkgutil.iter_modules(snntrain.kernels.__path__):
        mod = importlib.import_module(f"snntrain.kernels.{info.name}")
        for attr, value in list(vars(mod).items()):
            if isinstance(value, CustomOpDef):
                setattr(mod, attr, _called(value._qualname, value))
        if hasattr(mod, "op_wrap"):
            mod.op_wrap = _Capture
        if hasattr(mod, "traced"):
            mod.traced = lambda *a: True


def _workloads() -> None:
    """Training steps of small networks and layers that call every registered operator, forward and backward."""
    from snntrain.kernels import spike_conv
    from snntrain.kernels.bn_neuron_pool import bn_neuron_pool
    from snntrain.kernels.giou import giou_loss_op
    from snntrain.kernels.layer_norm import layer_norm
    from snntrain.models import build_model
    from snntrain.models.sew_resnet import SEWResNet
    from snntrain.nn import PSN, MaskedPSN, SlidingPSN

    def step(model, x):
        model(x).float().sum().backward()

    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    for neuron in ("LIF", "PLIF", "ALIF"):  # batch norm with the hand-written neurons and a generated one
        step(SEWResNet(depth=18, num_classes=3, T=2, stem="imagenet", width=2, neuron={"type": neuron},
                       backend="triton", spike_bytes=neuron == "LIF"), x)  # LIF's: convolutions of packed spikes
    step(SEWResNet(depth=18, num_classes=3, T=2, stem="cifar", width=2, norm="layernorm", backend="triton"), x)
    for spec in ({"name": "spikformer", "variant": "spikformer_cifar10", "embed_dim": 16, "depth": 1, "heads": 2,
                  "patch_size": 4},
                 {"name": "spike_driven_transformer", "variant": "sdt_2_512", "embed_dim": 16, "depth": 1,
                  "pooling": "0011"},
                 {"name": "qkformer", "variant": "qkformer_4_384", "embed_dim": 16, "heads": [2, 2, 2],
                  "depths": [1, 1, 1]}):
        step(build_model({**spec, "num_classes": 3, "in_channels": 3, "T": 2}, backend="triton"), x)
    stem = torch.randn(2, 3, 4, 9, 9, requires_grad=True)
    for kind, extra in (("lif", {}), ("plif", {"w": torch.zeros((), requires_grad=True)})):
        bn_neuron_pool(stem, torch.ones(4, requires_grad=True), torch.zeros(4, requires_grad=True), torch.zeros(4),
                       torch.ones(4), training=True, momentum=0.1, eps=1e-5, kind=kind, tau=2.0, v_threshold=1.0,
                       v_reset=0.0, decay_input=True, detach_reset=False, surrogate="atan", alpha=2.0,
                       **extra).sum().backward()
    for dim, shape in ((-1, (3, 5, 8)), (-3, (2, 8, 3, 3))):
        layer_norm(torch.randn(shape, requires_grad=True), torch.ones(8, requires_grad=True),
                   torch.zeros(8, requires_grad=True), dim=dim).sum().backward()
    for psn in (PSN(T=4), MaskedPSN(T=4, k=2), SlidingPSN(k=2)):
        psn(torch.randn(4, 2, 6, requires_grad=True)).sum().backward()
    # the FP8 convolution's two operators (a model calls them only on a GPU with FP8 or in the interpreter)
    q, scale = spike_conv.quantize_weight(torch.randn(8, 32, 3, 3))
    spikes = (torch.rand(2, 32, 5, 5) < 0.5).float().contiguous(memory_format=torch.channels_last)
    spike_conv.conv2d(spikes, q, scale, torch.zeros(8), (3, 3), (1, 1), (1, 1), (1, 1), torch.bfloat16)
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 4.0]], requires_grad=True)
    target = torch.tensor([[0.5, 0.0, 2.0, 3.0], [1.0, 2.0, 3.0, 3.0]])
    RUNNING.append(("snntrain::giou_loss", [boxes, target]))  # it calls torch.ops.snntrain.giou_loss by name
    try:
        giou_loss_op(boxes, target, grad_mode="separate", use_op=True).backward()
    finally:
        RUNNING.pop()


def main() -> None:
    import torch._higher_order_ops.triton_kernel_wrap as kernel_wrap

    _patch()
    _workloads()
    report: dict[str, dict[str, list[str]]] = {}
    for op, kernel, bound, inputs in LAUNCHES:
        accesses = kernel_wrap.identify_accessed_tensors(kernel, bound, {})
        writes = [dep.name for dep in accesses.read_writes.writes]
        given = {t.untyped_storage().data_ptr() for t in inputs}
        written_inputs = [n for n in writes if isinstance(bound.get(n), torch.Tensor)
                          and bound[n].untyped_storage().data_ptr() in given]
        entry = report.setdefault(f"{op} {kernel.fn.__name__}", {"writes": [], "inputs_written": []})
        entry["writes"] = sorted(set(entry["writes"]) | set(writes))
        entry["inputs_written"] = sorted(set(entry["inputs_written"]) | set(written_inputs))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
