"""Registers, spills and load/store widths of the GIoU kernels, compiled for a GPU target without a GPU.

    python scripts/giou_resources.py [--arch 90]

Builds the forward (fused and loss-only multi-program in every tuned configuration, and
the single program), the hand-written backward in every tuned configuration and the fused
mode's scale kernel with the flags the host code passes for the benchmark cases
(contiguous boxes, so the row stride is the constant 4), in fp32 and bf16, and reports
from the sm_90 build: registers per thread (and so programs per SM), local memory
(spills), shared memory, bar.sync count (reductions and layout conversions through shared
memory; ``loop bar.sync`` counts those inside the forward's grid-stride loop, which stall
every iteration) and the global loads and stores by width (``v4.b32`` = 16 bytes per
thread, ``b16`` = one 16-bit value). Last, the fp64 forward: its divisions (``div.rn.f64``
is IEEE division) and whether eps is the exact double. ``sass`` is a digest of each build's
machine code (equal digests: the same code). ``--runtime-stride`` builds the
loads with a runtime row stride instead, as for a non-contiguous input. It uses Triton's
compiler API (``ASTSource``), which is not a stable interface.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_resources import access_widths, compile_kernel, programs_per_sm, resource_usage, sass_digest  # noqa: E402
from snntrain.kernels import giou as K  # noqa: E402
from snntrain.kernels import giou_tuning as GT  # noqa: E402


def compile_stats(fn, args: dict, num_warps: int, arch: int) -> dict:
    """Compile ``fn`` with argument values like the launcher would specialise them; return resource usage."""
    kernel = compile_kernel(fn, args, {"num_warps": num_warps}, arch)
    ptx = kernel.asm["ptx"]
    usage = resource_usage(kernel)
    # The forward's grid-stride loop: from its back-edge target label to the branch back to it.
    loop_sync = 0
    for label in re.findall(r"\n(\$L__BB\d+_\d+):", ptx):
        start = ptx.index(label + ":")
        back = ptx.find("bra.uni \t" + label + ";", start)
        back = back if back >= 0 else ptx.find("bra \t" + label + ";", start)
        if back > start:
            loop_sync = max(loop_sync, ptx[start:back].count("bar.sync"))
    return {
        "regs": usage["regs"],
        "local": usage["local"],
        "shared": usage["shared"],
        "bar.sync": ptx.count("bar.sync"),
        "loop bar.sync": loop_sync,
        "programs/SM": programs_per_sm(usage["regs"], num_warps),
        "loads": access_widths(ptx, "ld.global"),
        "stores": access_widths(ptx, "st.global"),
        "sass": sass_digest(kernel),
    }


def fwd_args(dt: str, **over) -> dict:
    n = 1 << 24
    a = dict(pred_ptr=dt, target_ptr=dt, weight_ptr=dt, loss_ptr="fp32", count_ptr="i32", gpred_ptr=dt,
             gtarget_ptr=dt, flags_ptr="i8", N=n, stride_p=4, stride_t=4, stride_w=0, n_bucket=n, EPS=1e-7,
             REDUCTION=2, HAS_WEIGHT=False, LTRB=False, FUSED_PRED=True, FUSED_TARGET=False, SINGLE=False,
             STORE_DENOM=False, PRESCALE=False, FLAGS=True, FLAG_ROWS=K.FLAG_ROWS, SKIP_PAD=True, ROW4_P=True,
             ROW4_T=True, FP64=False, INT64=False, BLOCK=1024)
    a.update(over)
    return a


def bwd_args(dt: str, **over) -> dict:
    n = 1 << 24
    a = dict(grad_out_ptr="fp32", denom_ptr="fp32", pred_ptr=dt, target_ptr=dt, weight_ptr=dt, gpred_ptr=dt,
             gtarget_ptr=dt, gweight_ptr=dt, N=n, stride_p=4, stride_t=4, stride_w=0, stride_go=0, n_bucket=n,
             EPS=1e-7, REDUCTION=2, HAS_WEIGHT=False, LTRB=False, NEED_PRED=True, NEED_TARGET=False,
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
    fwd_cfgs = [(c.kwargs["BLOCK"], c.num_warps) for c in GT.FWD_CONFIGS]
    bwd_cfgs = [(c.kwargs["BLOCK"], c.num_warps) for c in GT.BWD_CONFIGS]
    for dt in ("fp32", "bf16"):
        cases = []
        for b, w in fwd_cfgs:
            cases.append((f"fwd fused mean, multi-program, BLOCK {b} w{w}", K._giou_fwd_kernel,
                          fwd_args(dt, BLOCK=b), w))
        for b, w in fwd_cfgs:
            cases.append((f"fwd loss only, multi-program, BLOCK {b} w{w}", K._giou_fwd_kernel,
                          fwd_args(dt, BLOCK=b, FUSED_PRED=False, FLAGS=False), w))
        cases.append(("fwd fused mean, single program (prescale)", K._giou_fwd_kernel,
                      fwd_args(dt, N=8192, n_bucket=0, SINGLE=True, PRESCALE=True, FLAGS=False, SKIP_PAD=False,
                               BLOCK=single_block), single_warps))
        for b, w in bwd_cfgs:
            cases.append((f"bwd kernel, BLOCK {b} w{w}", K._giou_bwd_kernel, bwd_args(dt, BLOCK=b), w))
        cases.append((f"scale (fused backward), {K.SCALE_GROUPS} x {K.FLAG_ROWS} rows", K._giou_scale_kernel,
                      dict(g_ptr=dt, flags_ptr="i8", grad_out_ptr="fp32", denom_ptr="fp32", n_elem=1 << 26,
                           n_flags=(1 << 24) // K.FLAG_ROWS, MEAN=True, FP64=False, INT64=False,
                           GROUPS=K.SCALE_GROUPS, FLAG_ROWS=K.FLAG_ROWS), GT.SCALE_WARPS))
        for label, fn, a, warps in cases:
            if "ROW4_P" in a and not row4:
                a.update(ROW4_P=False, ROW4_T=False)
            print(f"{dt:5s} {label}: {compile_stats(fn, a, warps, arch)}", flush=True)
    # fp64: a precision path. IEEE divisions, and eps as the exact double (not rounded to fp32).
    a = fwd_args("fp64", FP64=True, BLOCK=256)
    a.update(loss_ptr="fp64")
    ptx = compile_kernel(K._giou_fwd_kernel, a, {"num_warps": 4}, arch).asm["ptx"]
    divs = Counter(re.findall(r"\b(div\.[a-z]+\.f\d\d|rcp\.[a-z.]+f\d\d)", ptx))
    exact = "0d" + struct.pack(">d", 1e-7).hex().upper()
    print(f"fp64  fwd fused mean, BLOCK 256 w4: divisions {dict(divs)}; eps {exact} (exact 1e-7) in the PTX: "
          f"{exact in ptx}", flush=True)


if __name__ == "__main__":
    main()
