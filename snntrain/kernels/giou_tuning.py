"""Launch configurations of the GIoU kernels (:mod:`snntrain.kernels.giou`).

Large inputs: the configuration (block size and warps) is tuned per power-of-two bucket
of N, argument dtypes and variant flags, so a training loop tunes once per bucket and
never again. Eager calls then launch the plain kernel with the cached configuration (no
autotuner layer on the host path). The element-wise launches (the backward kernel, the
``none`` forward: one program per block) use triton.autotune over :data:`BWD_CONFIGS` /
:data:`FWD_CONFIGS` (:func:`tuned_best` caches its choice). The reducing forward is a
persistent grid sized from each configuration's registers, so it is tuned by
:func:`tune_persistent`, which times every configuration at the grid it would get (the
autotuner would time them all at one grid). Small inputs are launch-bound: they launch
the plain kernel with one fixed configuration (:data:`SINGLE_CONFIG`, :data:`SMALL_CONFIG`).
Tuning synchronises with the host and launches the kernel many times: call the loss once
on the same sizes before capturing a CUDA graph.
"""

from __future__ import annotations

import torch
import triton

from .op_utils import INTERPRET, cdiv

__all__ = ["FWD_CONFIGS", "BWD_CONFIGS", "SINGLE_CONFIG", "SMALL_CONFIG", "SCALE_WARPS", "FWD_KEY", "BWD_KEY",
           "FINALIZE_BLOCK", "PROGRAMS_PER_SM", "BEST", "bucket", "best_key", "programs_per_sm", "tuned_best",
           "bench_launch", "tune_persistent"]

if INTERPRET:  # the interpreter cannot time configurations
    FWD_CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=4)]
    BWD_CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=4)]
    SINGLE_CONFIG = (64, 4)  # (BLOCK, num_warps)
    SMALL_CONFIG = (64, 4)
else:
    # Forward blocks are multiples of FLAG_ROWS. Few boxes per thread (BLOCK 256, 4 warps: 2)
    # keep the registers low (fused forward on sm_90: 40 fp32 / 45 bf16, so 12 / 11 programs of
    # 4 warps per SM, against 4 at BLOCK 1024); more boxes per thread give each warp more loads
    # in flight. scripts/kernel_resources.py --family giou prints each configuration's build.
    FWD_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w)
                   for b, w in ((256, 4), (512, 4), (512, 8), (1024, 4), (1024, 8))]
    BWD_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 4), (512, 4), (1024, 4), (1024, 8))]
    SINGLE_CONFIG = (4096, 16)  # one program: 8 boxes per thread, 4096 boxes per iteration
    SMALL_CONFIG = (512, 4)
SCALE_WARPS = 4

#: The autotuners' keys (names of the kernels' arguments).
FWD_KEY = ["n_bucket", "REDUCTION", "HAS_WEIGHT", "LTRB", "FUSED_PRED", "FUSED_TARGET", "FLAGS", "SKIP_PAD", "ROW4_P",
           "ROW4_T"]
BWD_KEY = ["n_bucket", "REDUCTION", "HAS_WEIGHT", "LTRB", "NEED_PRED", "NEED_TARGET", "NEED_WEIGHT", "SKIP_PAD",
           "ROW4_P", "ROW4_T"]

FINALIZE_BLOCK = 1024
#: Programs per streaming multiprocessor for the reducing forward on large inputs, until the
#: compiled kernel's register count gives the number that fits (one full wave, see programs_per_sm).
PROGRAMS_PER_SM = 8
#: Configuration chosen by the autotuner, per (kernel, bucket, dtypes, flags): launch kwargs, BLOCK and the
#: number of its programs that fit on one streaming multiprocessor.
BEST: dict[tuple, tuple[dict, int, int]] = {}


def bucket(n) -> int:
    """Power-of-two bucket (at least 1024) of a box count: the autotune key."""
    if isinstance(n, int):
        return max(1024, 1 << (n - 1).bit_length())
    b = 1024  # a symbolic size (torch.compile with dynamic shapes)
    while b < n:
        b *= 2
    return b


def best_key(tuned, n: int, dtypes: tuple, flags: dict) -> tuple:
    """The key of :data:`BEST` for launches of ``tuned`` on ``n`` boxes of ``dtypes`` with the constexprs ``flags``."""
    return (tuned, bucket(n), dtypes, id(flags))  # flags: one cached dict per variant (giou's _fwd_flags / _bwd_flags)


def programs_per_sm(kernel, num_warps: int) -> int:
    """How many programs of a compiled kernel fit on one SM at once (registers and threads; no shared memory used).

    A persistent grid of exactly that many programs per SM runs in one wave: with more
    programs than fit, the last ones start only when others finish and the grid-stride
    loop gives each the same work, so a fractional extra wave costs a whole one.
    """
    try:
        regs = int(kernel.n_regs)
    except (AttributeError, TypeError, ValueError):  # interpreter, or a Triton without the attribute
        return PROGRAMS_PER_SM
    if regs <= 0:
        return PROGRAMS_PER_SM
    regs_per_warp = -(-regs * 32 // 256) * 256  # registers are allocated per warp in units of 256
    return max(1, min(2048 // (32 * num_warps), 65536 // (regs_per_warp * num_warps), 32))


def tuned_best(tuned, grid, args, key: tuple, flags: dict) -> tuple[dict, int, int]:
    """``BEST[key]``: the configuration ``tuned`` picked (launch kwargs, BLOCK, programs per SM).

    On first use the autotuner runs on ``args`` (which end before ``n_bucket``; ``grid(block,
    per_sm)`` gives its grid) and writes their outputs; callers then launch the plain kernel
    with the result, so the first call computes exactly what later calls do.
    """
    best = BEST.get(key)
    if best is None:
        kernel = tuned[lambda meta: grid(meta["BLOCK"], PROGRAMS_PER_SM)](*args, key[1], **flags)
        cfg = tuned.best_config
        best = BEST[key] = (cfg.all_kwargs(), cfg.kwargs["BLOCK"], programs_per_sm(kernel, cfg.num_warps))
    return best


def bench_launch(fn) -> float:
    """Median milliseconds of a launch (L2 flushed between runs); replaced in tests."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=5, rep=25, return_mode="median"))


def tune_persistent(kernel, args: tuple, n: int, sms: int, acc: torch.dtype, dev: torch.device, key: tuple,
                    flags: dict) -> tuple[dict, int, int]:
    """``BEST[key]`` for the reducing forward ``kernel``: each configuration timed at its own one-wave grid.

    ``args``: the forward's arguments with the partials left out (pred, target, weight,
    then from the gradient buffers on; they are written, as by a real call). Each
    configuration is compiled by one launch at the default grid, which gives its register
    count and so its programs per SM, then timed at ``min(cdiv(N, BLOCK), per_sm * SMs)``
    programs; the fastest (first on a tie) is kept. With one configuration nothing is timed.
    """
    best = BEST.get(key)
    if best is not None:
        return best
    scratch = (torch.empty(32 * sms, dtype=acc, device=dev), torch.empty(32 * sms, dtype=torch.int32, device=dev))
    full = (*args[:3], *scratch, *args[3:], key[1])
    found = []
    for cfg in FWD_CONFIGS:
        kwargs, block, warps = cfg.all_kwargs(), cfg.kwargs["BLOCK"], cfg.num_warps
        compiled = kernel[(min(cdiv(n, block), PROGRAMS_PER_SM * sms),)](*full, **flags, **kwargs)
        per_sm = programs_per_sm(compiled, warps)
        grid = (min(cdiv(n, block), per_sm * sms),)
        ms = bench_launch(lambda: kernel[grid](*full, **flags, **kwargs)) if len(FWD_CONFIGS) > 1 else 0.0
        found.append((ms, kwargs, block, per_sm))
    _, kwargs, block, per_sm = min(found, key=lambda f: f[0])
    best = BEST[key] = (kwargs, block, per_sm)
    return best
