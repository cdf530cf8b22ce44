"""Registers, spills and machine-code digests of the neuron kernels, compiled for a GPU target without a GPU.

    python scripts/neuron_resources.py [--arch 90] [--only lif|bn|ln]

Runs the host code of ``snntrain.kernels.lif``, ``bn_neuron`` and ``ln_neuron`` on meta
tensors with the kernel launches intercepted, so every kernel is built with exactly the
launch plan, constexprs and argument specialisations the host would use, for a few cases
(LIF and PLIF, fp32 and bf16, one chunk and several, the batch-norm and layer-norm fused
kernels in both memory formats and with a stride-0 time axis; forward and backward). For
each launch it prints the registers per thread, the spill stack (bytes per thread; > 0 means
spills), shared memory, resident programs per SM and a digest of the SASS: a change to the
kernels' source that must not change the generated code (moving ``@triton.jit`` helpers
between modules, renaming them) keeps every digest. Uses Triton's compiler API
(``ASTSource``), which is not a stable interface, and the ``cuobjdump`` shipped with Triton.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernel_resources import compile_kernel, programs_per_sm, resource_usage, sass_digest  # noqa: E402
from snntrain.kernels import bn_neuron as BN  # noqa: E402
from snntrain.kernels import lif as L  # noqa: E402
from snntrain.kernels import ln_neuron as LN  # noqa: E402
from snntrain.kernels.norm_neuron_base import F_GRAD_WB  # noqa: E402

META = torch.device("meta")
GRADS = L.F_GRAD_X | L.F_GRAD_V_INIT | L.F_GRAD_K


class Capture:
    """Stands in for ``wrap``: records each launch instead of running it."""

    launches: list = []

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *a, **kw: Capture.launches.append((self.fn, grid, a, kw))


def _flags(kind, surrogate="sigmoid", v_reset=0.0, detach=False, decay=True):
    w = torch.zeros((), device=META) if kind == "plif" else None
    flags, k, k_tensor = L.neuron_flags(kind, 2.0, w, v_reset, decay, detach, surrogate)
    return flags, [k, 1.0, 0.0 if v_reset is None else v_reset, 4.0], k_tensor


def lif_cases():
    """(label, launches) of the multi-step neuron: forward with checkpoints, then the backward."""
    cases = [
        ("LIF sigmoid hard fp32 [32, 64, 65536]", "lif", {}, (32, 64, 65536), torch.float32, False, False),
        ("LIF sigmoid hard bf16 [32, 64, 65536]", "lif", {}, (32, 64, 65536), torch.bfloat16, False, False),
        ("PLIF atan soft detach fp32 [4, 32, 64, 3136], v_init, state and membrane", "plif",
         dict(surrogate="atan", v_reset=None, detach=True), (4, 32, 64, 3136), torch.float32, True, False),
        ("IF piecewise_quadratic bf16 [8, 32, 8192], expanded dS", "if", dict(surrogate="piecewise_quadratic"),
         (8, 32, 8192), torch.bfloat16, False, True),
        ("PLIF sigmoid hard, no decay_input, bf16 [16, 32, 4096]", "plif", dict(decay=False), (16, 32, 4096),
         torch.bfloat16, False, False),
    ]
    for label, kind, opts, shape, dtype, full, expanded_gs in cases:
        flags, params, k_tensor = _flags(kind, **opts)
        x = torch.empty(shape, dtype=dtype, device=META)
        v_init = torch.empty(shape[1:], device=META) if full else None
        flags |= L.F_SAVE_CKPT | ((L.F_RETURN_STATE | L.F_RETURN_MEMBRANE) if full else 0)
        Capture.launches.clear()
        _spikes, v_final, ckpt, v_seq = L._fwd_host(x, v_init, k_tensor, params, flags, launch=True, wrap=Capture)
        gs = torch.empty((), dtype=dtype, device=META).expand(shape) if expanded_gs else torch.empty_like(x)
        L._bwd_host(x, ckpt, v_init, k_tensor, gs, v_final if full else None, v_seq if full else None, params,
                    flags | GRADS, launch=True, wrap=Capture)
        yield label, list(Capture.launches)


def norm_cases(norm: str):
    """(label, launches) of the fused batch-norm or layer-norm neuron, training step."""
    cases = [
        ("LIF atan detach (SEW default) fp32 NCHW [4, 32, 64, 56, 56]", "lif", dict(surrogate="atan", detach=True),
         (4, 32, 64, 56, 56), torch.float32, None, False),
        ("PLIF sigmoid bf16 channels-last [4, 32, 128, 28, 28]", "plif", {}, (4, 32, 128, 28, 28), torch.bfloat16,
         None, True),
        ("LIF atan detach fp32 [32, 64, 112, 112] with steps=4 (stride-0 time)", "lif",
         dict(surrogate="atan", detach=True), (32, 64, 112, 112), torch.float32, 4, False),
        ("PLIF atan soft fp32 NCHW [16, 8, 256, 14, 14] (checkpoints)", "plif", dict(surrogate="atan", v_reset=None),
         (16, 8, 256, 14, 14), torch.float32, None, False),
        ("PLIF sigmoid, no decay_input, fp32 NCHW [4, 8, 32, 28, 28]", "plif", dict(decay=False),
         (4, 8, 32, 28, 28), torch.float32, None, False),
    ]
    for label, kind, opts, shape, dtype, steps, cl in cases:
        flags, params, k_tensor = _flags(kind, **opts)
        params = params + [1e-5]
        x = torch.empty(shape, dtype=dtype, device=META)
        if cl:
            x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, shape[:2])
        T = steps or shape[0]
        C = shape[-3]
        w = torch.empty(C, device=META)
        flags |= L.F_SAVE_CKPT
        Capture.launches.clear()
        gs = torch.empty((T, *shape[-4:]), dtype=dtype, device=META)
        if norm == "bn":
            flags |= BN.F_BATCH_STATS
            _s, mean, rstd, _var, ckpt = BN._bn_fwd_host(x, w, w, w, w, k_tensor, T, params, flags, True,
                                                         wrap=Capture)
            BN._bn_bwd_host(x, w, w, mean, rstd, ckpt, k_tensor, gs, T, params, flags | GRADS | F_GRAD_WB, True,
                            wrap=Capture)
        else:
            _s, ckpt = LN._ln_fwd_host(x, w, w, k_tensor, T, params, flags, True, wrap=Capture)
            LN._ln_bwd_host(x, w, w, ckpt, k_tensor, gs, T, params, flags | GRADS | F_GRAD_WB, True, wrap=Capture)
        yield f"{norm}: {label}", list(Capture.launches)


def compile_stats(fn, args: tuple, kwargs: dict, arch: int) -> dict:
    values = dict(zip(fn.arg_names, args))
    values.update(kwargs)
    warps = values.pop("num_warps", 4)
    kernel = compile_kernel(fn, values, {"num_warps": warps}, arch)
    usage = resource_usage(kernel)
    return {"warps": warps, "regs": usage["regs"], "spill B/thread": usage["stack"], "smem": usage["shared"],
            "programs/SM": programs_per_sm(usage["regs"], warps, usage["shared"]), "sass": sass_digest(kernel)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--only", choices=["lif", "bn", "ln"], help="one family only")
    args = ap.parse_args()
    groups = {"lif": lif_cases, "bn": lambda: norm_cases("bn"), "ln": lambda: norm_cases("ln")}
    seen = {}
    for name, cases in groups.items():
        if args.only not in (None, name):
            continue
        for label, launches in cases():
            print(f"{label}:")
            for fn, grid, a, kw in launches:
                consts = {k: v for k, v in kw.items() if k.isupper()}
                key = (fn.fn.__name__, tuple(sorted((k, v) for k, v in consts.items() if k != "num_warps")),
                       kw.get("num_warps"), tuple(type(v) if v is None else getattr(v, "dtype", v) for v in a))
                if key not in seen:
                    seen[key] = compile_stats(fn, a, kw, args.arch)
                print(f"  {fn.fn.__name__.removeprefix('_'):24s} grid {str(tuple(grid)):16s} {consts}\n"
                      f"  {'':24s} {seen[key]}", flush=True)


if __name__ == "__main__":
    main()
