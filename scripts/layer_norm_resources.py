"""Registers, spills and vectorised loads of the layer-norm kernels, compiled for a GPU target without a GPU.

    python scripts/layer_norm_resources.py [--arch 90] [--sms 132] [--dtype float16] [--set NAME=VALUE ...]
                                           [--shape 4096x512 --shape 4x32x256x14x14:-3 ...]

Runs the host code of ``snntrain.kernels.layer_norm`` on meta tensors with the kernel
launches intercepted, so every kernel is built with exactly the launch plan, constexprs and
argument specialisations the host would use (forward, then backward with dW and dB), and
reads the cubin's resource usage with the ``cuobjdump`` shipped in Triton's NVIDIA backend:
registers per thread, spill stack (STACK, bytes per thread; > 0 means spills), shared
memory, resident programs per SM, and how many global loads are vectorised. ``--set``
overrides fields of ``TUNING`` (for example ``--set bwd_stages=3``) to check a variant
before timing it. It uses Triton's compiler API (``ASTSource``), which is not a stable
interface.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.backends.nvidia as nvidia_backend  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from snntrain.kernels import layer_norm as K  # noqa: E402

SHAPES = ["4096x512", "4096x4096", "4096x16384", "401408x32", "401408x64", "401408x256", "401408x512",
          "4x32x32x56x56:-3", "4x32x64x56x56:-3", "4x32x128x28x28:-3", "4x32x256x14x14:-3", "4x32x512x7x7:-3"]
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def compile_stats(fn, args: tuple, kwargs: dict, arch: int) -> dict:
    """Compile ``fn`` with argument values specialised like the launcher would; return resource usage."""
    sig, const, attrs = {}, {}, {}
    values = dict(zip(fn.arg_names, args))
    values.update(kwargs)
    options = {"num_warps": values.pop("num_warps", 4)}
    if "maxnreg" in values:
        options["maxnreg"] = values.pop("maxnreg")
    num_warps = options["num_warps"]
    for i, name in enumerate(fn.arg_names):
        v = values[name]
        if fn.params[i].is_constexpr:
            sig[name], const[name] = "constexpr", v
        elif isinstance(v, torch.Tensor):  # allocations are 16-byte aligned
            sig[name], attrs[(i,)] = "*" + DTYPES[v.dtype], [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            if v == 1:  # Triton specialises integer arguments equal to 1
                sig[name], const[name] = "constexpr", 1
            else:
                sig[name] = "i64" if abs(v) >= 2**31 else "i32"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    kernel = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", arch, 32),
                            options=options)
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(nvidia_backend.__file__), "bin", "cuobjdump")
    usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    ptx = kernel.asm["ptx"]
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    smem = int(re.search(r"SHARED:(\d+)", usage).group(1))
    smem = max(smem, getattr(kernel.metadata, "shared", 0) or 0)
    threads = 32 * num_warps
    by_smem = (228 * 1024) // smem if smem else 32
    n_vec = len(re.findall(r"ld[.]global(?:[.]\w+)*[.]v\d", ptx))
    n_all = len(re.findall(r"ld[.]global", ptx))
    n_async = len(re.findall(r"cp[.]async[.]c", ptx))
    return {
        "warps": num_warps,
        **({"maxnreg": options["maxnreg"]} if "maxnreg" in options else {}),
        "regs": regs,
        "spill B/thread": stack,
        "smem": smem,
        "programs/SM": min(2048 // threads, 65536 // (max(regs, 1) * threads), by_smem, 32),
        "vector loads": f"{n_vec}/{n_all}" + (f" +{n_async} cp.async" if n_async else ""),
    }


def parse_shape(text: str) -> tuple[tuple[int, ...], int]:
    shape, _, dim = text.partition(":")
    return tuple(int(v) for v in shape.split("x")), int(dim or -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--sms", type=int, default=132, help="SM count the launch plan assumes (H100/H200 SXM: 132)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--shape", action="append", help="AxB[:dim] (dim -1 rows, -3 channels-first); repeatable")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a TUNING field")
    args = ap.parse_args()
    for item in args.set:
        name, _, value = item.partition("=")
        old = getattr(K.TUNING, name)
        setattr(K.TUNING, name, type(old)(eval(value)) if not isinstance(old, bool) else value in ("1", "True"))
    K._num_sms = lambda _device: args.sms
    K._direct_launch = lambda: True  # as in an eager call of the op (launch options such as maxnreg apply)
    dtype = getattr(torch, args.dtype)
    launches = []

    class Capture:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *a, **kw: launches.append((self.fn, grid, a, kw))

    K.wrap_triton = Capture
    for text in args.shape or SHAPES:
        shape, dim = parse_shape(text)
        x = torch.empty(shape, device="meta", dtype=dtype)
        w = torch.empty(shape[dim], device="meta", dtype=dtype)
        launches.clear()
        _y, mean, rstd = K._layer_norm_fwd(x, w, w, dim, 1e-5)
        K._layer_norm_bwd(x, x, w, w, mean, rstd, dim, True, True)
        print(f"{text} {args.dtype}:")
        for fn, grid, a, kw in launches:
            consts = {k: v for k, v in kw.items() if k.isupper() and k not in ("HAS_W", "HAS_B")}
            name = fn.fn.__name__ if hasattr(fn, "fn") else fn.__name__
            st = compile_stats(fn, a, kw, args.arch)
            print(f"  {name.removeprefix('_ln_'):22s} grid {str(tuple(grid)):14s} {consts}\n"
                  f"  {'':22s} {st}", flush=True)


if __name__ == "__main__":
    main()
