"""Build a Triton kernel for a GPU target without a GPU and read its resource usage.

Shared by ``scripts/giou_resources.py`` and ``scripts/layer_norm_resources.py``. A kernel
is specialised the way Triton's launcher would specialise the given argument values
(pointers 16-byte aligned, integers equal to 1 folded, multiples of 16 marked), compiled
with Triton's compiler API (``ASTSource``, not a stable interface) and measured with the
``cuobjdump`` shipped in Triton's NVIDIA backend.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from collections import Counter

import triton
import triton.backends.nvidia as nvidia_backend
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_TORCH_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "int8": "i8",
                 "int32": "i32", "int64": "i64", "bool": "i1"}


def _pointer_type(value) -> str | None:
    """``"fp32"`` etc. for a pointer argument given as a type string or a (meta) tensor, else None."""
    if isinstance(value, str):
        return value
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return _TORCH_DTYPES[str(dtype).removeprefix("torch.")]
    return None


def compile_kernel(fn, values: dict, options: dict, arch: int):
    """Compile the JIT function ``fn`` for ``sm_<arch>`` with argument ``values`` (by name)."""
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        v = values[name]
        if fn.params[i].is_constexpr or v is None:  # None arguments (absent pointers) are specialised away
            sig[name], const[name] = "constexpr", v
        elif (ptr := _pointer_type(v)) is not None:  # allocations are 16-byte aligned
            sig[name], attrs[(i,)] = "*" + ptr, [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int) and fn.params[i].do_not_specialize:
            sig[name] = "i64" if abs(v) >= 2**31 else "i32"
        elif isinstance(v, int):
            if v == 1:  # Triton specialises integer arguments equal to 1
                sig[name], const[name] = "constexpr", 1
            else:
                sig[name] = "i64" if abs(v) >= 2**31 else "i32"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", arch, 32), options=options)


def cuobjdump(kernel, flag: str) -> str:
    """What Triton's bundled ``cuobjdump <flag>`` prints for a compiled kernel's cubin."""
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(nvidia_backend.__file__), "bin", "cuobjdump")
    try:
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)


def resource_usage(kernel) -> dict:
    """Registers, local memory, spill stack and shared memory per thread/program of a compiled kernel."""
    usage = cuobjdump(kernel, "--dump-resource-usage")

    def field(name: str) -> int:
        m = re.search(name + r":(\d+)", usage)
        return int(m.group(1)) if m else 0

    return {"regs": field("REG"), "local": field("LOCAL"), "stack": field("STACK"),
            "shared": max(field("SHARED"), getattr(kernel.metadata, "shared", 0) or 0)}


def sass_digest(kernel) -> str:
    """A short hash of the kernel's SASS instructions: equal digests mean the same machine code."""
    sass = cuobjdump(kernel, "--dump-sass")
    code = [line.split(";")[0].strip() for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]
    return hashlib.sha1("\n".join(code).encode()).hexdigest()[:12]


def programs_per_sm(regs: int, num_warps: int, shared: int = 0) -> int:
    """Resident programs per SM on a Hopper SM (2048 threads, 64 K registers, 228 KB shared memory)."""
    threads = 32 * num_warps
    by_smem = (228 * 1024) // shared if shared else 32
    return min(2048 // threads, 65536 // (max(regs, 1) * threads), by_smem, 32)


def access_widths(ptx: str, op: str) -> str:
    """Counts of ``op`` (e.g. ``ld.global``) by width suffix in the PTX, e.g. ``v4.b32x2 b16x8``."""
    c = Counter(m.replace(op + ".", "") for m in re.findall(op + r"(?:\.[a-z0-9]+)+", ptx))
    return " ".join(f"{k}x{v}" for k, v in sorted(c.items()))
