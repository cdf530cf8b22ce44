"""Registers, spills and load/store widths of the GIoU kernels, compiled for a GPU target without a GPU.

    python scripts/giou_resources.py [--arch 90]

Builds the forward (fused and loss-only, single- and multi-program), the hand-written
backward and the fused mode's scale kernel with the flags the host code passes for the
benchmark cases (contiguous boxes, so the row stride is the constant 4), in fp32 and
bf16, and reports from the sm_90 build: registers per thread (and so programs per SM),
local memory (spills), shared memory, bar.sync count (layout conversions through shared
memory) and the global loads and stores by width (``v4.b32`` = 16 bytes per thread,
``b16`` = one 16-bit value). ``--runtime-stride`` builds the loads with a runtime row
stride instead, as for a non-contiguous input. It uses Triton's compiler API
(``ASTSource``), which is not a stable interface.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.backends.nvidia as nvidia_backend  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from snntrain.kernels import giou as K  # noqa: E402


def compile_stats(fn, args: dict, num_warps: int, arch: int) -> dict:
    """Compile ``fn`` with argument values like the launcher would specialise them; return resource usage."""
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        v = args[name]
        if fn.params[i].is_constexpr:
            sig[name], const[name] = "constexpr", v
        elif isinstance(v, str):  # a pointer: its element type (16-byte aligned, as from the caching allocator)
            sig[name], attrs[(i,)] = "*" + v, [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            if v == 1:  # Triton specialises integer arguments equal to 1
                sig[name], const[name] = "constexpr", 1
            else:
                sig[name] = "i32"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    kernel = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(nvidia_backend.__file__), "bin", "cuobjdump")
    usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    ptx = kernel.asm["ptx"]
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    threads = 32 * num_warps

    def widths(op):
        c = Counter(m.replace(op + ".", "") for m in re.findall(op + r"(?:\.[a-z0-9]+)+", ptx))
        return " ".join(f"{k}x{v}" for k, v in sorted(c.items()))

    return {
        "regs": regs,
        "local": int(re.search(r"LOCAL:(\d+)", usage).group(1)),
        "shared": kernel.metadata.shared,
        "bar.sync": ptx.count("bar.sync"),
        "programs/SM": min(2048 // threads, 65536 // (max(regs, 1) * threads)),
        "loads": widths("ld.global"),
        "stores": widths("st.global"),
    }


def fwd_args(dt: str, **over) -> dict:
    n = 1 << 24
    a = dict(pred_ptr=dt, target_ptr=dt, weight_ptr=dt, loss_ptr="fp32", count_ptr="i32", gpred_ptr=dt,
             gtarget_ptr=dt, flags_ptr="i8", N=n, stride_p=4, stride_t=4, stride_w=0, eps=1e-7, n_bucket=n,
             REDUCTION=2, HAS_WEIGHT=False, LTRB=False, FUSED_PRED=True, FUSED_TARGET=False, SINGLE=False,
             STORE_DENOM=False, PRESCALE=False, FLAGS=True, FLAG_ROWS=K.FLAG_ROWS, SKIP_PAD=True, ROW4_P=True,
             ROW4_T=True, FP64=False, INT64=False, BLOCK=1024)
    a.update(over)
    return a


def bwd_args(dt: str, **over) -> dict:
    n = 1 << 24
    a = dict(grad_out_ptr="fp32", denom_ptr="fp32", pred_ptr=dt, target_ptr=dt, weight_ptr=dt, gpred_ptr=dt,
             gtarget_ptr=dt, gweight_ptr=dt, N=n, stride_p=4, stride_t=4, stride_w=0, stride_go=0, eps=1e-7,
             n_bucket=n, REDUCTION=2, HAS_WEIGHT=False, LTRB=False, NEED_PRED=True, NEED_TARGET=False,
             NEED_WEIGHT=False, SKIP_PAD=True, ROW4_P=True, ROW4_T=True, FP64=False, INT64=False, BLOCK=256)
    a.update(over)
    return a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--runtime-stride", action="store_true", help="row stride as a runtime value (ROW4_* off)")
    args = ap.parse_args()
    arch = args.arch
    row4 = not args.runtime_stride
    single_block, single_warps = 4096, 16
    for dt in ("fp32", "bf16"):
        cases = [
            ("fwd fused mean, multi-program, BLOCK 1024 w4", K._giou_fwd_kernel, fwd_args(dt), 4),
            ("fwd fused mean, multi-program, BLOCK 2048 w8", K._giou_fwd_kernel, fwd_args(dt, BLOCK=2048), 8),
            ("fwd loss only, multi-program, BLOCK 1024 w4", K._giou_fwd_kernel,
             fwd_args(dt, FUSED_PRED=False, FLAGS=False), 4),
            ("fwd fused mean, single program (prescale)", K._giou_fwd_kernel,
             fwd_args(dt, N=8192, n_bucket=0, SINGLE=True, PRESCALE=True, FLAGS=False, SKIP_PAD=False,
                      BLOCK=single_block), single_warps),
            ("bwd kernel, BLOCK 256 w4", K._giou_bwd_kernel, bwd_args(dt), 4),
            ("bwd kernel, BLOCK 1024 w4", K._giou_bwd_kernel, bwd_args(dt, BLOCK=1024), 4),
            ("scale (fused backward), 4 x FLAG_ROWS", K._giou_scale_kernel,
             dict(g_ptr=dt, flags_ptr="i8", grad_out_ptr="fp32", denom_ptr="fp32", n_elem=1 << 26, MEAN=True,
                  FP64=False, INT64=False, BLOCK=4 * K.FLAG_ROWS), K._SCALE_WARPS),
        ]
        for label, fn, a, warps in cases:
            if "ROW4_P" in a and not row4:
                a.update(ROW4_P=False, ROW4_T=False)
            print(f"{dt:5s} {label}: {compile_stats(fn, a, warps, arch)}", flush=True)


if __name__ == "__main__":
    main()
