"""Registers, spills and vectorised loads of the layer-norm kernels, compiled for a GPU target without a GPU.

    python scripts/layer_norm_resources.py [--arch 90] [--sms 132] [--dtype float16] [--set NAME=VALUE ...]
                                           [--shape 4096x512 --shape 4x32x256x14x14:-3 ...]

Runs the host code of ``snntrain.kernels.layer_norm`` on meta tensors with the kernel
launches intercepted, so every kernel is built with exactly the launch plan, constexprs and
argument specialisations the host would use (forward, then backward with dW and dB), and
reads the cubin's resource usage with the ``cuobjdump`` shipped in Triton's NVIDIA backend:
registers per thread, spill stack (STACK, bytes per thread; > 0 means spills), shared
memory, resident programs per SM, how many global loads are vectorised, and a digest of the
machine code (``sass``; equal digests: the same code). ``--set``
overrides fields of ``TUNING`` (for example ``--set bwd_stages=3``) to check a variant
before timing it. It uses Triton's compiler API (``ASTSource``), which is not a stable
interface.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernel_resources import compile_kernel, programs_per_sm, resource_usage, sass_digest  # noqa: E402
from snntrain.kernels import layer_norm as K  # noqa: E402
from snntrain.kernels import layer_norm_tuning as LT  # noqa: E402

SHAPES = ["4096x512", "4096x4096", "4096x16384", "401408x32", "401408x64", "401408x256", "401408x512",
          "4x32x32x56x56:-3", "4x32x64x56x56:-3", "4x32x128x28x28:-3", "4x32x256x14x14:-3", "4x32x512x7x7:-3"]


def compile_stats(fn, args: tuple, kwargs: dict, arch: int) -> dict:
    """Compile ``fn`` with argument values specialised like the launcher would; return resource usage."""
    values = dict(zip(fn.arg_names, args))
    values.update(kwargs)
    options = {"num_warps": values.pop("num_warps", 4)}
    if "maxnreg" in values:
        options["maxnreg"] = values.pop("maxnreg")
    kernel = compile_kernel(fn, values, options, arch)
    ptx = kernel.asm["ptx"]
    usage = resource_usage(kernel)
    n_vec = len(re.findall(r"ld[.]global(?:[.]\w+)*[.]v\d", ptx))
    n_all = len(re.findall(r"ld[.]global", ptx))
    n_async = len(re.findall(r"cp[.]async[.]c", ptx))
    return {
        "warps": options["num_warps"],
        **({"maxnreg": options["maxnreg"]} if "maxnreg" in options else {}),
        "regs": usage["regs"],
        "spill B/thread": usage["stack"],
        "smem": usage["shared"],
        "programs/SM": programs_per_sm(usage["regs"], options["num_warps"], usage["shared"]),
        "vector loads": f"{n_vec}/{n_all}" + (f" +{n_async} cp.async" if n_async else ""),
        "sass": sass_digest(kernel),
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
    LT.sm_count = lambda _device: args.sms
    LT.direct_launch = lambda: True  # as in an eager call (launch options such as maxnreg apply)
    dtype = getattr(torch, args.dtype)
    launches = []

    class Capture:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *a, **kw: launches.append((self.fn, grid, a, kw))

    for text in args.shape or SHAPES:
        shape, dim = parse_shape(text)
        x = torch.empty(shape, device="meta", dtype=dtype)
        w = torch.empty(shape[dim], device="meta", dtype=dtype)
        launches.clear()
        _y, mean, rstd = K._fwd_host(x, w, w, dim, 1e-5, wrap=Capture)
        K._bwd_host(x, x, w, w, mean, rstd, dim, True, True, wrap=Capture)
        print(f"{text} {args.dtype}:")
        for fn, grid, a, kw in launches:
            consts = {k: v for k, v in kw.items() if k.isupper() and k not in ("HAS_W", "HAS_B")}
            name = fn.fn.__name__ if hasattr(fn, "fn") else fn.__name__
            st = compile_stats(fn, a, kw, args.arch)
            print(f"  {name.removeprefix('_ln_'):22s} grid {str(tuple(grid)):14s} {consts}\n"
                  f"  {'':22s} {st}", flush=True)


if __name__ == "__main__":
    main()
