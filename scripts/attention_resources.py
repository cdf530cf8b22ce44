"""Registers, spills and machine-code digests of the spiking-attention kernels, compiled for a GPU target without a
GPU (as ``scripts/neuron_resources.py`` does for the neuron kernels).

    python scripts/attention_resources.py [--arch 90]

Runs the host code of ``snntrain.kernels.spike_attention`` on meta tensors with the launches intercepted, for the
attention shapes of the variants (Spikformer's CIFAR model, QKFormer's and the Spike-driven Transformer's ImageNet
last stage, an event model at T = 16 with PLIF), training step: ``K^T V``, the fused product-neuron forward with its
checkpoints, its backward. Per launch: registers per thread, spill stack (bytes per thread; > 0 means spills),
shared memory, resident programs per SM, a digest of the SASS.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernel_resources import compile_kernel, programs_per_sm, resource_usage, sass_digest  # noqa: E402
from snntrain.kernels import spike_attention as A  # noqa: E402

META = torch.device("meta")

CASES = [  # label, T, B, N, heads, D, dtype, neuron kind
    ("spikformer_cifar10: T4 B64 N64 12x32 bf16 LIF", 4, 64, 64, 12, 32, torch.bfloat16, "lif"),
    ("qkformer_10_384 stage 3: T4 B32 N196 6x64 bf16 LIF", 4, 32, 196, 6, 64, torch.bfloat16, "lif"),
    ("spikformer_s: T4 B32 N196 12x32 fp32 LIF", 4, 32, 196, 12, 32, torch.float32, "lif"),
    ("event model: T16 B16 N64 8x32 bf16 PLIF", 16, 16, 64, 8, 32, torch.bfloat16, "plif"),
    ("event model: T16 B16 N64 4x64 bf16 LIF", 16, 16, 64, 4, 64, torch.bfloat16, "lif"),
]


class Capture:
    """Stands in for ``wrap``: records each launch instead of running it."""

    launches: list = []

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *a, **kw: Capture.launches.append((self.fn, grid, a, kw))


def cases():
    for label, T, B, N, H, D, dtype, kind in CASES:
        w = torch.zeros((), device=META) if kind == "plif" else None
        flags, k, k_tensor = A.neuron_flags(kind, 2.0, w, 0.0, True, True, "sigmoid")
        flags |= A.F_SAVE_CKPT | (A.F_GRAD_K if kind == "plif" else 0)
        params = [k, 0.5, 0.0, 4.0, 0.125]
        qkv = torch.empty((T, B, N, 3 * H * D), dtype=dtype, device=META)
        q, kk, v = qkv.split(H * D, dim=-1)
        Capture.launches.clear()
        kv = A._kv_host(kk, v, H, launch=True, wrap=Capture)
        _s, ckpt = A._fwd_host(q, kv, k_tensor, params, flags, H, launch=True, wrap=Capture)
        gs = torch.empty(q.shape, dtype=dtype, device=META)
        A._bwd_host(q, kv, ckpt, k_tensor, gs, params, flags, H, launch=True, wrap=Capture)
        yield label, list(Capture.launches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    args = ap.parse_args()
    seen = {}
    for label, launches in cases():
        print(f"{label}:")
        for fn, grid, a, kw in launches:
            consts = {k: v for k, v in kw.items() if k.isupper()}
            key = (fn.fn.__name__, tuple(sorted(consts.items())), kw.get("num_warps"),
                   tuple(type(v) if v is None else getattr(v, "dtype", v) for v in a))
            if key not in seen:
                values = dict(zip(fn.arg_names, a))
                values.update(kw)
                warps = values.pop("num_warps", 4)
                kernel = compile_kernel(fn, values, {"num_warps": warps}, args.arch)
                usage = resource_usage(kernel)
                seen[key] = {"warps": warps, "regs": usage["regs"], "spill B/thread": usage["stack"],
                             "smem": usage["shared"], "programs/SM": programs_per_sm(usage["regs"], warps,
                                                                                     usage["shared"]),
                             "sass": sass_digest(kernel)}
            print(f"  {fn.fn.__name__.removeprefix('_'):18s} grid {str(tuple(grid)):14s} {consts}\n"
                  f"  {'':18s} {seen[key]}", flush=True)


if __name__ == "__main__":
    main()
