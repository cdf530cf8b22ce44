"""Registers, spills and vectorised loads of the layer-norm kernels, compiled for a GPU target without a GPU.

    python scripts/layer_norm_resources.py [--arch 90]

Builds the fused forward and backward kernels with the launch plan the host code
would pick for a few benchmark shapes (fp16), then reads the cubin's resource usage
with the ``cuobjdump`` shipped in Triton's NVIDIA backend. Useful when changing
``snntrain.kernels.layer_norm.TUNING``: it shows registers per thread (hence programs
per SM), local memory (spills) and how many global loads are vectorised. It uses
Triton's compiler API (``ASTSource``), which is not a stable interface.
"""

from __future__ import annotations

import argparse
import dataclasses
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

SHAPES = [((4096, 512), -1), ((4096, 4096), -1), ((4096, 16384), -1), ((401408, 64), -1), ((401408, 512), -1),
          ((4, 32, 64, 56, 56), -3), ((4, 32, 256, 14, 14), -3), ((4, 32, 512, 7, 7), -3)]


def compile_stats(fn, args: dict, num_warps: int, arch: int) -> dict:
    """Compile ``fn`` with argument values like the launcher would specialise them; return resource usage."""
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        v = args[name]
        if fn.params[i].is_constexpr:
            sig[name], const[name] = "constexpr", v
        elif isinstance(v, str):  # a pointer: its element type
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
    n_vec = len(re.findall(r"ld[.]global(?:[.]\w+)*[.]v\d", ptx))
    n_all = len(re.findall(r"ld[.]global", ptx))
    return {
        "regs": regs,
        "local": int(re.search(r"LOCAL:(\d+)", usage).group(1)),
        "programs/SM": min(2048 // threads, 65536 // (regs * threads)),
        "vector loads": f"{n_vec}/{n_all}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    arch = ap.parse_args().arch
    for shape, dim in SHAPES:
        x = torch.empty(shape, device="meta", dtype=torch.float16)
        d = dim % len(shape)
        split = K._split(x, d)
        s = K._strides3(x, d, split)
        p = K._plan(x, d, split, K.TUNING.fwd_tile, K.TUNING.fwd_warp_elems)
        args = dict(X="fp16", Y="fp16", W="fp16", Bias="fp16", Mean="fp32", Rstd="fp32", S=p.S, C=p.C,
                    tiles_per_b=p.tiles_per_b, sx_b=s[0], sx_s=s[1], sx_c=s[2], sy_b=s[0], sy_s=s[1], sy_c=s[2], eps=1e-5,
                    HAS_W=True, HAS_B=True, BLOCK_S=p.block_s, BLOCK_C=p.block_c, SINGLE=p.single)
        print(f"fwd {shape} tile {p.block_s}x{p.block_c} warps {p.num_warps} single={p.single}:",
              compile_stats(K._ln_fwd_kernel, args, p.num_warps, arch), flush=True)
        p = K._plan(x, d, split, K.TUNING.bwd_tile, K.TUNING.bwd_warp_elems)
        if p.block_s == 1 or (p.s_unit and s[2] % 16):  # as in the backward launch
            p = dataclasses.replace(p, num_warps=K._warps(p.block_s * p.block_c, K.TUNING.narrow_warp_elems))
        if not p.single:
            print(f"bwd {shape}: looped path")
            continue
        args = dict(DY="fp16", X="fp16", W="fp16", Mean="fp32", Rstd="fp32", DX="fp16", P="fp32", S=p.S, C=p.C,
                    tiles_per_b=p.tiles_per_b, num_tiles=p.num_tiles, sd_b=s[0], sd_s=s[1], sd_c=s[2], sx_b=s[0],
                    sx_s=s[1], sx_c=s[2], sg_b=s[0], sg_s=s[1], sg_c=s[2], HAS_W=True,
                    NEED_P=p.block_c <= K.TUNING.fused_dw_max_c,
                    REDUCE_EACH=p.s_unit or p.block_s == 1 or K.TUNING.rows_reduce_each,
                    BLOCK_S=p.block_s, BLOCK_C=p.block_c)
        print(f"bwd {shape} tile {p.block_s}x{p.block_c} warps {p.num_warps}:",
              compile_stats(K._ln_bwd_fused_kernel, args, p.num_warps, arch), flush=True)


if __name__ == "__main__":
    main()
