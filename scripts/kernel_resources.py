"""Registers, spills and machine-code digests of snntrain's Triton kernels, compiled for a GPU target without a GPU.

    python scripts/kernel_resources.py --family neuron [--arch 90] [--only lif|bn|ln|bn_pool|bn_residual]
    python scripts/kernel_resources.py --family layer_norm [--arch 90] [--sms 132] [--dtype float16]
                                       [--set NAME=VALUE ...] [--shape 4096x512 --shape 4x32x256x14x14:-3 ...]
    python scripts/kernel_resources.py --family giou [--arch 90] [--runtime-stride]
    python scripts/kernel_resources.py --family attention [--arch 90]
    python scripts/kernel_resources.py --family psn [--arch 90] [--sms 132] [--set NAME=VALUE ...]
    python scripts/kernel_resources.py --family spike_conv [--arch 90] [--config BM,BN,BK,GROUP,WARPS,STAGES] [--precast]
                                       [--layer 'layer4 shortcut']
    python scripts/kernel_resources.py --family step_neuron [--arch 90] [--neuron KLIF --neuron QIF ...] [--T 16 ...]

A kernel is specialised the way Triton's launcher would specialise the given argument values (pointers 16-byte
aligned, integers equal to 1 folded, multiples of 16 marked), compiled with Triton's compiler API (``ASTSource``,
not a stable interface) and measured with the ``cuobjdump`` shipped in Triton's NVIDIA backend. Per kernel build:
registers per thread, the spill stack (bytes per thread; > 0 means spills), shared memory, resident programs per
SM and ``sass``, a digest of the machine code (equal digests: the same code; a change to the kernels' source that
must not change the generated code, such as moving ``@triton.jit`` helpers between modules, keeps every digest).

``neuron``: runs the host code of ``snntrain.kernels.lif``, ``bn_neuron`` and ``ln_neuron`` on meta tensors with
the kernel launches intercepted, so every kernel is built with exactly the launch plan, constexprs and argument
specialisations the host would use, for a few cases (LIF and PLIF, fp32 and bf16, one chunk and several, the
batch-norm and layer-norm fused kernels in both memory formats and with a stride-0 time axis; forward and
backward; ``--only bn_pool``: ``bn_neuron_pool``, the batch-norm neuron with the max-pool of the ResNets' stem,
on the stems' shapes).

``layer_norm``: the same for ``snntrain.kernels.layer_norm`` (forward, then backward with dW and dB), with how many
global loads are vectorised; ``--set`` overrides fields of ``TUNING`` (for example ``--set bwd_stages=3``) to check
a variant before timing it.

``giou``: builds the forward (fused and loss-only multi-program in every tuned configuration, and the single
program), the hand-written backward in every tuned configuration and the fused mode's scale kernel with the flags
the host code passes for the benchmark cases (contiguous boxes, so the row stride is the constant 4), in fp32 and
bf16: registers (and so programs per SM), local memory (spills), shared memory, bar.sync count (reductions and
layout conversions through shared memory; ``loop bar.sync`` counts those inside the forward's grid-stride loop,
which stall every iteration) and the global loads and stores by width (``v4.b32`` = 16 bytes per thread, ``b16`` =
one 16-bit value). Last, the fp64 forward: its divisions (``div.rn.f64`` is IEEE division) and whether eps is the
exact double. ``--runtime-stride`` builds the loads with a runtime row stride instead, as for a non-contiguous
input.

``attention``: the host code of ``snntrain.kernels.spike_attention`` for the attention shapes of the variants
(Spikformer's CIFAR model, QKFormer's and the Spike-driven Transformer's ImageNet last stage, an event model at
T = 16 with PLIF), training step: ``K^T V``, the fused product-neuron forward with its checkpoints, its backward.
``psn``: the host code of ``snntrain.kernels.psn`` for the parallel spiking neurons of ``scripts/bench_neurons.py
--suite psn`` (PSN, MaskedPSN and SlidingPSN on ``[T, 64, 65536]``, T = 4, 8, 16 and 32, fp32 and bf16): the forward,
the backward and its finishing kernel; ``--set`` overrides names of ``snntrain.kernels.psn_tuning`` (for example
``--set MMA_PER_THREAD=1``) to check a launch size before timing it.

``spike_conv``: the host code of ``snntrain.kernels.spike_conv`` (the FP8 convolution and the weight's rounding)
on the convolutions of spikes of SEW-ResNet-18 at 224 (``scripts/bench_spike_conv.py``'s shapes), bf16 input;
``--config`` replaces the launch sizes of ``spike_conv_tuning.conv_config`` for every layer, ``--precast`` reads
the input cast to e4m3 first (``PRECAST``).

``step_neuron``: the generated kernels of the neuron families (``snntrain.kernels.step_neuron``: forward with
checkpoints and backward, the input's gradient and the learnable parameters' sums) on ``scripts/bench_neurons.py
--suite families``'s ``[T, 64, 65536]``, fp32 and bf16.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.backends.nvidia as nvidia_backend  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import bench_spike_conv  # noqa: E402  (scripts/, this script's folder)
from snntrain.kernels import bn_neuron as BN  # noqa: E402
from snntrain.kernels import bn_neuron_pool as BNP  # noqa: E402
from snntrain.kernels import giou as G  # noqa: E402
from snntrain.kernels import giou_tuning as GT  # noqa: E402
from snntrain.kernels import layer_norm as LNK  # noqa: E402
from snntrain.kernels import layer_norm_tuning as LT  # noqa: E402
from snntrain.kernels import lif as L  # noqa: E402
from snntrain.kernels import ln_neuron as LN  # noqa: E402
from snntrain.kernels import psn as P  # noqa: E402
from snntrain.kernels import psn_tuning as PT  # noqa: E402
from snntrain.kernels import spike_attention as A  # noqa: E402
from snntrain.kernels import spike_conv as SC  # noqa: E402
from snntrain.kernels import spike_conv_tuning as SCT  # noqa: E402
from snntrain.kernels import step_neuron as SN  # noqa: E402
from snntrain.kernels.norm_neuron_base import F_GRAD_WB  # noqa: E402

META = torch.device("meta")
GRADS = L.F_GRAD_X | L.F_GRAD_V_INIT | L.F_GRAD_K

_TORCH_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "int8": "i8",
                 "uint8": "u8", "int32": "i32", "int64": "i64", "bool": "i1", "float8_e4m3fn": "fp8e4nv"}


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


class Capture:
    """Stands in for ``wrap``: records each launch instead of running it."""

    launches: list = []

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *a, **kw: Capture.launches.append((self.fn, grid, a, kw))


def _parser(family: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"kernel_resources.py --family {family}",
                                   description=f"Registers, spills and SASS digests of the {family} kernels.")

# ------------------------------------------------------------------------------------------------------------ attention

ATTENTION_CASES = [  # label, T, B, N, heads, D, dtype, neuron kind
    ("spikformer_cifar10: T4 B64 N64 12x32 bf16 LIF", 4, 64, 64, 12, 32, torch.bfloat16, "lif"),
    ("qkformer_10_384 stage 3: T4 B32 N196 6x64 bf16 LIF", 4, 32, 196, 6, 64, torch.bfloat16, "lif"),
    ("spikformer_s: T4 B32 N196 12x32 fp32 LIF", 4, 32, 196, 12, 32, torch.float32, "lif"),
    ("event model: T16 B16 N64 8x32 bf16 PLIF", 16, 16, 64, 8, 32, torch.bfloat16, "plif"),
    ("event model: T16 B16 N64 4x64 bf16 LIF", 16, 16, 64, 4, 64, torch.bfloat16, "lif"),
]


def attention_cases():
    for label, T, B, N, H, D, dtype, kind in ATTENTION_CASES:
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


def attention_main(argv: list[str]) -> None:
    """The spiking-attention kernels (``snntrain.kernels.spike_attention``)."""
    ap = _parser("attention")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    args = ap.parse_args(argv)
    _print_launches(attention_cases(), args.arch)


# ------------------------------------------------------------------------------------------------------------------ psn

PSN_FORMS = ("PSN", "MaskedPSN", "SlidingPSN")


def psn_cases(sms: int):
    """``(label, launches)`` of a training step's forward and backward for each PSN form, T and dtype, the bench's
    shape, on meta tensors (the SM count as ``sms``)."""
    P.sm_count = lambda device, cpu=4: sms  # the backward's persistent grid, as on that GPU
    for form in PSN_FORMS:
        for T in (4, 8, 16, 32):
            for dtype in (torch.float32, torch.bfloat16):
                x = torch.empty((T, 64, 65536), dtype=dtype, device=META)
                weight = torch.empty((2,) if form == "SlidingPSN" else (T, T), device=META)
                masks = ((torch.empty((T, T), device=META), torch.empty((T, T), device=META),
                          torch.empty((), device=META)) if form == "MaskedPSN" else (None, None, None))
                bias = torch.empty((T,) if form != "SlidingPSN" else (1,), device=META)
                flags = P.F_GRAD_X | P.F_GRAD_W | P.F_GRAD_B | P.SURROGATES.index("atan")
                Capture.launches.clear()
                P._fwd_host(x, weight, bias, *masks, [2.0], flags, launch=True, wrap=Capture)
                gs = torch.empty(x.shape, dtype=dtype, device=META)
                P._bwd_host(x, weight, bias, *masks, gs, [2.0], flags, launch=True, wrap=Capture)
                yield f"{form} T={T} {str(dtype).removeprefix('torch.')}", list(Capture.launches)


def psn_main(argv: list[str]) -> None:
    """The parallel spiking neuron kernels (``snntrain.kernels.psn``)."""
    ap = _parser("psn")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--sms", type=int, default=132, help="SMs of the GPU (the backward's persistent grid)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a name of snntrain.kernels.psn_tuning (an int, or a word such as tf32x3)")
    args = ap.parse_args(argv)
    for item in args.set:
        name, _, value = item.partition("=")
        if not hasattr(PT, name):
            raise SystemExit(f"--set {item}: psn_tuning has no {name!r}; it has {', '.join(PT.__all__)}")
        setattr(PT, name, int(value) if value.lstrip("-").isdigit() else value)
    _print_launches(psn_cases(args.sms), args.arch)


# ----------------------------------------------------------------------------------------------------------- spike_conv

#: SEW-ResNet-18's convolutions of spikes at 224, batch 32, T = 4: scripts/bench_spike_conv.py's layers (label, Cin,
#: H, Cout, kernel, stride, count)
SPIKE_CONV_SHAPES = bench_spike_conv.SHAPES


def spike_conv_cases(only: str | None = None):
    """``(label, launches)`` of the weight's rounding and the FP8 convolution for each layer (whose label contains
    ``only``, if given), on meta tensors."""
    for label, cin, h, cout, k, stride, _count in SPIKE_CONV_SHAPES:
        if only is not None and only not in label:
            continue
        x = torch.empty((128, cin, h, h), dtype=torch.bfloat16, device=META).contiguous(
            memory_format=torch.channels_last)
        w = torch.empty((cout, cin, k, k), device=META)
        Capture.launches.clear()
        q, s = SC._quantize_host(w, wrap=Capture)
        SC._conv_host(x, q, s, None, [k, k], [stride] * 2, [k // 2] * 2, [1, 1], torch.bfloat16, wrap=Capture)
        yield f"{label}: {cin} -> {cout}, {k}x{k}/{stride}, {h}x{h}", list(Capture.launches)


def spike_conv_main(argv: list[str]) -> None:
    """The FP8 convolution kernels (``snntrain.kernels.spike_conv``)."""
    ap = _parser("spike_conv")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--config", help="BLOCK_M,BLOCK_N,BLOCK_K,GROUP_M,warps,stages for every layer (BLOCK_K at most "
                                     "the largest power of two that divides Cin)")
    ap.add_argument("--precast", action="store_true", help="the input cast to e4m3 first (spike_conv_tuning.PRECAST)")
    ap.add_argument("--layer", help="only the layers whose label contains this (e.g. 'layer4 shortcut')")
    args = ap.parse_args(argv)
    if args.layer and not any(args.layer in label for label, *_ in SPIKE_CONV_SHAPES):
        raise SystemExit(f"--layer {args.layer!r} matches no layer; the layers are: "
                         + ", ".join(label for label, *_ in SPIKE_CONV_SHAPES))
    if args.config:
        try:
            bm, bn, bk, group, warps, stages = (int(v) for v in args.config.split(","))
        except ValueError:
            raise SystemExit(f"--config {args.config!r}: give six integers, BLOCK_M,BLOCK_N,BLOCK_K,GROUP_M,warps,"
                             "stages") from None
        SCT.conv_config = lambda cin, cout, taps: (bm, bn, min(bk, cin & -cin), group, warps, stages)
    SCT.PRECAST = args.precast
    _print_launches(spike_conv_cases(args.layer), args.arch)


# ---------------------------------------------------------------------------------------------------------- step_neuron

def step_neuron_cases(neurons: list[str], steps: list[int]):
    """``(label, launches)`` of a training step of each generated neuron family (its defaults, learnable parameters
    as the family makes them), forward and backward, on meta tensors."""
    from snntrain.nn import build_neuron

    for name in neurons:
        neuron = build_neuron(type=name, backend="triton", channels=64)
        for T in steps:
            for dtype in (torch.float32, torch.bfloat16):
                key = neuron.kernel_key(dtype)
                params = neuron._params_on(META)
                x = torch.empty((T, 64, 65536), dtype=dtype, device=META)
                Capture.launches.clear()
                _y, _final, ckpt = SN._fwd_host(x, None, params, key, SN.F_SAVE_CKPT, launch=True, wrap=Capture)
                SN._bwd_host(x, None, ckpt, params, torch.empty_like(x), None, key, SN.F_SAVE_CKPT, launch=True,
                             wrap=Capture)
                yield f"{name} T={T} {str(dtype).removeprefix('torch.')}", list(Capture.launches)


def step_neuron_main(argv: list[str]) -> None:
    """The generated neuron kernels (``snntrain.kernels.step_neuron``)."""
    ap = _parser("step_neuron")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--neuron", action="append", help="a neuron family (repeatable; default KLIF and QIF)")
    ap.add_argument("--T", type=int, action="append", help="time steps (repeatable; default 4 and 16)")
    args = ap.parse_args(argv)
    _print_launches(step_neuron_cases(args.neuron or ["KLIF", "QIF"], args.T or [4, 16]), args.arch)


def _print_launches(cases, arch: int) -> None:
    """Each case's launches with the registers, spills, shared memory, programs per SM and SASS digest of their
    kernels (each distinct build compiled once)."""
    seen = {}
    for label, launches in cases:
        print(f"{label}:")
        for fn, grid, a, kw in launches:
            consts = {k: v for k, v in kw.items() if k.isupper()}
            key = (fn.fn.__name__, tuple(sorted(consts.items())), kw.get("num_warps"), kw.get("num_stages"),
                   tuple(type(v) if v is None else getattr(v, "dtype", v) for v in a))
            if key not in seen:
                values = dict(zip(fn.arg_names, a))
                values.update(kw)
                options = {"num_warps": values.pop("num_warps", 4)}
                if "num_stages" in values:
                    options["num_stages"] = values.pop("num_stages")
                kernel = compile_kernel(fn, values, options, arch)
                usage = resource_usage(kernel)
                warps = options["num_warps"]
                seen[key] = {"warps": warps, "regs": usage["regs"], "spill B/thread": usage["stack"],
                             "smem": usage["shared"], "programs/SM": programs_per_sm(usage["regs"], warps,
                                                                                     usage["shared"]),
                             "sass": sass_digest(kernel)}
            print(f"  {fn.fn.__name__.removeprefix('_'):24s} grid {str(tuple(grid)):14s} {consts}\n"
                  f"  {'':24s} {seen[key]}", flush=True)


# ----------------------------------------------------------------------------------------------------------------- giou

def giou_stats(fn, args: dict, num_warps: int, arch: int) -> dict:
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


def giou_fwd_args(dt: str, **over) -> dict:
    n = 1 << 24
    a = dict(pred_ptr=dt, target_ptr=dt, weight_ptr=dt, loss_ptr="fp32", count_ptr="i32", gpred_ptr=dt,
             gtarget_ptr=dt, flags_ptr="i8", N=n, stride_p=4, stride_t=4, stride_w=0, n_bucket=n, EPS=1e-7,
             REDUCTION=2, HAS_WEIGHT=False, LTRB=False, FUSED_PRED=True, FUSED_TARGET=False, SINGLE=False,
             STORE_DENOM=False, PRESCALE=False, FLAGS=True, FLAG_ROWS=G.FLAG_ROWS, SKIP_PAD=True, ROW4_P=True,
             ROW4_T=True, FP64=False, INT64=False, BLOCK=1024)
    a.update(over)
    return a


def giou_bwd_args(dt: str, **over) -> dict:
    n = 1 << 24
    a = dict(grad_out_ptr="fp32", denom_ptr="fp32", pred_ptr=dt, target_ptr=dt, weight_ptr=dt, gpred_ptr=dt,
             gtarget_ptr=dt, gweight_ptr=dt, N=n, stride_p=4, stride_t=4, stride_w=0, stride_go=0, n_bucket=n,
             EPS=1e-7, REDUCTION=2, HAS_WEIGHT=False, LTRB=False, NEED_PRED=True, NEED_TARGET=False,
             NEED_WEIGHT=False, SKIP_PAD=True, ROW4_P=True, ROW4_T=True, FP64=False, INT64=False, BLOCK=256)
    a.update(over)
    return a


def giou_main(argv: list[str]) -> None:
    """The GIoU kernels (``snntrain.kernels.giou``)."""
    ap = _parser("giou")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--runtime-stride", action="store_true", help="row stride as a runtime value (ROW4_* off)")
    args = ap.parse_args(argv)
    arch = args.arch
    row4 = not args.runtime_stride
    single_block, single_warps = 4096, 16
    fwd_cfgs = [(c.kwargs["BLOCK"], c.num_warps) for c in GT.FWD_CONFIGS]
    bwd_cfgs = [(c.kwargs["BLOCK"], c.num_warps) for c in GT.BWD_CONFIGS]
    for dt in ("fp32", "bf16"):
        cases = []
        for b, w in fwd_cfgs:
            cases.append((f"fwd fused mean, multi-program, BLOCK {b} w{w}", G._giou_fwd_kernel,
                          giou_fwd_args(dt, BLOCK=b), w))
        for b, w in fwd_cfgs:
            cases.append((f"fwd loss only, multi-program, BLOCK {b} w{w}", G._giou_fwd_kernel,
                          giou_fwd_args(dt, BLOCK=b, FUSED_PRED=False, FLAGS=False), w))
        cases.append(("fwd fused mean, single program (prescale)", G._giou_fwd_kernel,
                      giou_fwd_args(dt, N=8192, n_bucket=0, SINGLE=True, PRESCALE=True, FLAGS=False, SKIP_PAD=False,
                               BLOCK=single_block), single_warps))
        for b, w in bwd_cfgs:
            cases.append((f"bwd kernel, BLOCK {b} w{w}", G._giou_bwd_kernel, giou_bwd_args(dt, BLOCK=b), w))
        cases.append((f"scale (fused backward), {G.SCALE_GROUPS} x {G.FLAG_ROWS} rows", G._giou_scale_kernel,
                      dict(g_ptr=dt, flags_ptr="i8", grad_out_ptr="fp32", denom_ptr="fp32", n_elem=1 << 26,
                           n_flags=(1 << 24) // G.FLAG_ROWS, MEAN=True, FP64=False, INT64=False,
                           GROUPS=G.SCALE_GROUPS, FLAG_ROWS=G.FLAG_ROWS), GT.SCALE_WARPS))
        for label, fn, a, warps in cases:
            if "ROW4_P" in a and not row4:
                a.update(ROW4_P=False, ROW4_T=False)
            print(f"{dt:5s} {label}: {giou_stats(fn, a, warps, arch)}", flush=True)
    # fp64: a precision path. IEEE divisions, and eps as the exact double (not rounded to fp32).
    a = giou_fwd_args("fp64", FP64=True, BLOCK=256)
    a.update(loss_ptr="fp64")
    ptx = compile_kernel(G._giou_fwd_kernel, a, {"num_warps": 4}, arch).asm["ptx"]
    divs = Counter(re.findall(r"\b(div\.[a-z]+\.f\d\d|rcp\.[a-z.]+f\d\d)", ptx))
    exact = "0d" + struct.pack(">d", 1e-7).hex().upper()
    print(f"fp64  fwd fused mean, BLOCK 256 w4: divisions {dict(divs)}; eps {exact} (exact 1e-7) in the PTX: "
          f"{exact in ptx}", flush=True)


# ----------------------------------------------------------------------------------------------------------- layer_norm

LAYER_NORM_SHAPES = ["4096x512", "4096x4096", "4096x16384", "401408x32", "401408x64", "401408x256", "401408x512",
          "4x32x32x56x56:-3", "4x32x64x56x56:-3", "4x32x128x28x28:-3", "4x32x256x14x14:-3", "4x32x512x7x7:-3"]


def layer_norm_stats(fn, args: tuple, kwargs: dict, arch: int) -> dict:
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


def layer_norm_main(argv: list[str]) -> None:
    """The layer-norm kernels (``snntrain.kernels.layer_norm``)."""
    ap = _parser("layer_norm")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--sms", type=int, default=132, help="SM count the launch plan assumes (H100/H200 SXM: 132)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--shape", action="append", help="AxB[:dim] (dim -1 rows, -3 channels-first); repeatable")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a TUNING field")
    args = ap.parse_args(argv)
    for item in args.set:
        name, _, value = item.partition("=")
        old = getattr(LNK.TUNING, name)
        setattr(LNK.TUNING, name, type(old)(eval(value)) if not isinstance(old, bool) else value in ("1", "True"))
    LT.sm_count = lambda _device: args.sms
    LT.direct_launch = lambda: True  # as in an eager call (launch options such as maxnreg apply)
    dtype = getattr(torch, args.dtype)
    launches = Capture.launches
    for text in args.shape or LAYER_NORM_SHAPES:
        shape, dim = parse_shape(text)
        x = torch.empty(shape, device="meta", dtype=dtype)
        w = torch.empty(shape[dim], device="meta", dtype=dtype)
        launches.clear()
        _y, mean, rstd = LNK._fwd_host(x, w, w, dim, 1e-5, wrap=Capture)
        LNK._bwd_host(x, x, w, w, mean, rstd, dim, True, True, wrap=Capture)
        print(f"{text} {args.dtype}:")
        for fn, grid, a, kw in launches:
            consts = {k: v for k, v in kw.items() if k.isupper() and k not in ("HAS_W", "HAS_B")}
            name = fn.fn.__name__ if hasattr(fn, "fn") else fn.__name__
            st = layer_norm_stats(fn, a, kw, args.arch)
            print(f"  {name.removeprefix('_ln_'):22s} grid {str(tuple(grid)):14s} {consts}\n"
                  f"  {'':22s} {st}", flush=True)


# --------------------------------------------------------------------------------------------------------------- neuron

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


#: The ImageNet stems (a batch-norm neuron, then the 3x3/2 max-pool) of :mod:`snntrain.kernels.bn_neuron_pool`.
STEM_CASES = [
    ("SEW-18 224 stem: LIF atan detach bf16 channels-last [32, 64, 112, 112] with steps=4 (stride-0 time)", "lif",
     dict(surrogate="atan", detach=True), (32, 64, 112, 112), torch.bfloat16, 4, True),
    ("SEW-18 224 stem: LIF atan detach fp32 NCHW [32, 64, 112, 112] with steps=4 (stride-0 time)", "lif",
     dict(surrogate="atan", detach=True), (32, 64, 112, 112), torch.float32, 4, False),
    ("event stem: LIF sigmoid bf16 channels-last [16, 16, 64, 64, 64] (checkpoints)", "lif", {},
     (16, 16, 64, 64, 64), torch.bfloat16, None, True),
    ("PLIF sigmoid soft bf16 channels-last [4, 8, 64, 56, 56]", "plif", dict(v_reset=None), (4, 8, 64, 56, 56),
     torch.bfloat16, None, True),
    ("PLIF atan fp32 NCHW [16, 8, 64, 28, 28] (checkpoints)", "plif", dict(surrogate="atan"), (16, 8, 64, 28, 28),
     torch.float32, None, False),
]


def norm_cases(norm: str):
    """(label, launches) of the fused batch-norm or layer-norm neuron, training step; ``bn_pool``: the batch-norm
    neuron with the stem's 3x3/2 max-pool fused (:mod:`snntrain.kernels.bn_neuron_pool`), on :data:`STEM_CASES`."""
    cases = STEM_CASES if norm == "bn_pool" else [
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
        if cl and steps:
            x = x.contiguous(memory_format=torch.channels_last)
        elif cl:
            x = x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, shape[:2])
        T = steps or shape[0]
        C = shape[-3]
        w = torch.empty(C, device=META)
        flags |= L.F_SAVE_CKPT
        Capture.launches.clear()
        gs = torch.empty((T, *shape[-4:]), dtype=dtype, device=META)
        if norm == "bn_pool":
            flags |= BN.F_BATCH_STATS
            _y, pos, mean, rstd, _var, ckpt = BNP._fwd_host(x, w, w, w, w, k_tensor, T, params, flags, True,
                                                            wrap=Capture)
            BNP._bwd_host(x, w, w, mean, rstd, ckpt, k_tensor, pos, torch.empty_like(pos, dtype=dtype), T, params,
                          flags | GRADS | F_GRAD_WB, True, wrap=Capture)
        elif norm == "bn":
            flags |= BN.F_BATCH_STATS
            _s, mean, rstd, _var, ckpt = BN._bn_fwd_host(x, w, w, w, w, k_tensor, T, params, flags, True,
                                                         wrap=Capture)
            BN._bn_bwd_host(x, w, w, mean, rstd, ckpt, k_tensor, gs, T, params, flags | GRADS | F_GRAD_WB, True,
                            wrap=Capture)
        else:
            _s, ckpt = LN._ln_fwd_host(x, w, w, k_tensor, T, params, flags, True, wrap=Capture)
            LN._ln_bwd_host(x, w, w, ckpt, k_tensor, gs, T, params, flags | GRADS | F_GRAD_WB, True, wrap=Capture)
        yield f"{norm}: {label}", list(Capture.launches)


#: The residual modes of :func:`snntrain.kernels.bn_neuron.bn_neuron` (``residual``, ``residual_to``, ``connect``).
RESIDUAL_MODES = {"ADD to the spikes (SEW ADD)": 1, "ADD to the input (Spiking ResNet)": 2, "SEW AND": 3,
                  "SEW IAND": 4}


def residual_cases():
    """(label, launches) of the batch-norm neuron with a residual in each mode (:data:`RESIDUAL_MODES`), training
    step, on a SEW-ResNet-18 layer-1 shape (bf16, channels-last, T = 4)."""
    from snntrain.kernels import norm_neuron_base as NB

    shape, dtype = (4, 32, 64, 56, 56), torch.bfloat16
    flags, params, k_tensor = _flags("lif", surrogate="atan", detach=True)
    params = params + [1e-5]
    flags |= L.F_SAVE_CKPT | BN.F_BATCH_STATS
    x = torch.empty(shape, dtype=dtype, device=META).flatten(0, 1).contiguous(
        memory_format=torch.channels_last).unflatten(0, shape[:2])
    out_shape, out_strides = NB.spike_layout(x, shape[0])
    r = torch.empty_strided(out_shape, out_strides, dtype=dtype, device=META)
    w = torch.empty(shape[2], device=META)
    gs = torch.empty_strided(out_shape, out_strides, dtype=dtype, device=META)
    for label, mode in RESIDUAL_MODES.items():
        Capture.launches.clear()
        _s, mean, rstd, _var, ckpt = BN._bn_fwd_host(x, w, w, w, w, k_tensor, shape[0], params, flags, True,
                                                     wrap=Capture, residual=r, residual_to=mode)
        BN._bn_bwd_host(x, w, w, mean, rstd, ckpt, k_tensor, gs, shape[0], params, flags | GRADS | F_GRAD_WB, True,
                        wrap=Capture, **({} if mode == 1 else {"residual": r, "residual_to": mode}))
        yield f"bn_residual: {label}, LIF atan detach bf16 channels-last {list(shape)}", list(Capture.launches)


def neuron_main(argv: list[str]) -> None:
    """The neuron kernels (``snntrain.kernels.lif``, ``bn_neuron``, ``ln_neuron``, ``bn_neuron_pool``)."""
    ap = _parser("neuron")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--only", choices=["lif", "bn", "ln", "bn_pool", "bn_residual"], help="one family only")
    args = ap.parse_args(argv)
    groups = {"lif": lif_cases, "bn": lambda: norm_cases("bn"), "ln": lambda: norm_cases("ln"),
              "bn_pool": lambda: norm_cases("bn_pool"), "bn_residual": residual_cases}
    for name, cases in groups.items():
        if args.only in (None, name):
            _print_launches(cases(), args.arch)


FAMILIES = {"neuron": neuron_main, "layer_norm": layer_norm_main, "giou": giou_main, "attention": attention_main, "psn": psn_main,
            "spike_conv": spike_conv_main, "step_neuron": step_neuron_main}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    ap.add_argument("--family", choices=list(FAMILIES), help="which kernels")
    ap.add_argument("-h", "--help", action="store_true")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.family is None:
        ap.print_help()
        if not args.help:
            sys.exit("kernel_resources.py: give --family " + "|".join(FAMILIES))
        return
    FAMILIES[args.family](rest + (["--help"] if args.help else []))


if __name__ == "__main__":
    main()
