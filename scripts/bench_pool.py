"""Benchmark the pooling of spike maps: our Triton max-pool against torch.nn.functional.max_pool2d.

    python scripts/bench_pool.py --out DIR [--quick] [--formats cl nchw] [--dtypes bf16 fp32] [--sweep] [--stem]
    python scripts/bench_pool.py --out DIR --dry-run    # no GPU: tiny shapes in Triton's interpreter, fake times

Cases: the max-pool of the SEW-ResNet-18 stem's spikes (3x3, stride 2, padding 1) at 224x224, batch 32,
T = 4 (``[128, 64, 112, 112]``), in the event network (128x128, batch 16, T = 16: ``[256, 64, 64, 64]``)
and at 32x32, batch 128, T = 4 (``[512, 64, 16, 16]``); and the classifier's global average pool of the last
stage's spikes at 224 (``[128, 512, 7, 7]``, ``adaptive_avg_pool2d(x, 1)``, PyTorch only: is it cheap
already?). Random spikes (20 % ones), bf16 and fp32, channels-last and NCHW. Modes:

* ``fwd``: the forward of a training step (the input requires a gradient, so the forward keeps what the
  backward needs);
* ``fwd+bwd``: forward, then backward from a full random gradient;

each timed eagerly (host launches included) and as the replay of a CUDA graph of the same call
(``... graph``: GPU time only, the number the roofline is about).

Providers: ``ours-triton`` (:class:`snntrain.nn.SpikeMaxPool2d`, ``backend="triton"``) and ``torch``
(``F.max_pool2d``; ``F.adaptive_avg_pool2d`` for the average pool).

``--stem`` times the stems whose pool runs inside the batch-norm neuron instead
(:mod:`snntrain.kernels.bn_neuron_pool`): the convolution's output through batch norm (training), LIF (tau 2,
hard reset, detach_reset, atan) and the 3x3 stride-2 max-pool, at the same sizes (SEW-ResNet-18 at 224: the
``[32, 64, 112, 112]`` output repeated over T = 4 as a stride-0 axis; event data: ``[16, 16, 64, 64, 64]``; 32 x 32:
``[128, 64, 16, 16]`` over T = 4). Providers: ``ours-fused`` (:func:`snntrain.nn.norm_neuron_max_pool`, one op)
and ``ours-separate`` (the :class:`~snntrain.nn.NormNeuron`, then the ``SpikeMaxPool2d``). Bytes, those of the
fused algorithm for both providers (``X`` the input's bytes, ``Q`` the pooled spikes', ``P`` one byte per pooled
element): ``fwd`` = 2 X + Q + P, ``fwd+bwd`` = 7 X + 2 Q + 2 P (the module docstring of ``bn_neuron_pool`` counts
them, and the separate ops' 4 E more, E the full-resolution spikes' bytes). Written as ``DIR/bench_pool_stem.*``;
``--stem --sweep`` times the fused forward's launch sizes (:mod:`snntrain.kernels.bn_neuron_pool_tuning`: tile
elements (``FWD_TILE`` in channels-last, ``FWD_STRIDED_TILE`` in NCHW), channels per channels-last tile, warps) as
CUDA-graph replays of forward plus backward, into ``DIR/bench_pool_stem_sweep.*``.

Bytes (the ``bytes`` column, the same for both providers of a case), with ``E_in`` and ``E_out`` the input's
and the output's bytes and ``P`` the output's element count: max-pool ``fwd`` = E_in + E_out + P (the
forward reads the spikes and writes the pooled spikes and a one-byte window position per output),
``fwd+bwd`` = 2 E_in + 2 E_out + 2 P (the backward reads dL/dy and the positions and writes dL/dx); average
pool ``fwd`` = E_in + E_out, ``fwd+bwd`` = 2 E_in + 2 E_out. ``roofline`` = (bytes / copy bandwidth) / time,
with the copy bandwidth (clone of 1 GiB) measured in the same run.

The ``note`` column gives the MB the forward keeps for the backward (autograd's saved tensors, the input
included where it is saved). Writes ``DIR/bench_pool.csv``, ``.jsonl`` and ``.png``. ``--sweep`` times the
launch sizes of :mod:`snntrain.kernels.spike_pool_tuning` instead (tile elements, channels per channels-last
tile, warps) on the max-pool cases, fwd+bwd as CUDA-graph replays, and writes ``DIR/bench_pool_sweep.csv`` and
``.jsonl``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bench_utils as bu  # noqa: E402
from bench_dry import DEVICE, DRY  # noqa: E402  (before snntrain: --dry-run sets Triton's interpreter)

NAME = "bench_pool"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
FORMATS = ("cl", "nchw")
# (benchmark, label, op, [N, C, H, W] with N = T * B)
CASES = [
    ("pool/sew18-224", "stem", "maxpool", (128, 64, 112, 112)),
    ("pool/event", "stem", "maxpool", (256, 64, 64, 64)),
    ("pool/sew18-32", "stem", "maxpool", (512, 64, 16, 16)),
    ("pool/sew18-224", "head", "avgpool", (128, 512, 7, 7)),
]
#: --sweep: (TILE, CL_CHANNELS, WARPS) of snntrain.kernels.spike_pool_tuning
SWEEP = list(itertools.product((1024, 2048, 4096), (32, 64), (4, 8)))
#: --stem: (benchmark, input shape, steps): [B, C, H, W] repeated over ``steps`` (a stride-0 time axis) or
#: [T, B, C, H, W] (steps None)
STEM_CASES = [
    ("stem/sew18-224", (32, 64, 112, 112), 4),
    ("stem/event", (16, 16, 64, 64, 64), None),
    ("stem/sew18-32", (128, 64, 16, 16), 4),
]
#: --stem --sweep: (FWD_TILE and FWD_STRIDED_TILE, FWD_CL_CHANNELS, FWD_WARPS and FWD_WARPS_LONG) of
#: snntrain.kernels.bn_neuron_pool_tuning
STEM_SWEEP = list(itertools.product((256, 512, 1024), (16, 32, 64), (4, 8)))


def out_shape(op, shape):
    N, C, H, W = shape
    return (N, C, 1, 1) if op == "avgpool" else (N, C, (H - 1) // 2 + 1, (W - 1) // 2 + 1)


def case_bytes(op, shape, itemsize, mode):
    oshape = out_shape(op, shape)
    e_in = itemsize * shape[0] * shape[1] * shape[2] * shape[3]
    p = oshape[0] * oshape[1] * oshape[2] * oshape[3]
    once = e_in + itemsize * p + (p if op == "maxpool" else 0)
    return once if mode == "fwd" else 2 * once


def make_input(op, shape, dtype, fmt, seed=0):
    if DRY:
        shape = (2, min(shape[1], 8), min(shape[2], 9), min(shape[3], 9))
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = (torch.rand(shape, device=DEVICE, generator=g) < 0.2).to(dtype)
    gy = torch.randn(out_shape(op, shape), device=DEVICE, generator=g).to(dtype)
    if fmt == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
        gy = gy.contiguous(memory_format=torch.channels_last)
    return x.requires_grad_(), gy


def time_fn(run, x, gy, quick, graph_only=False):
    """{mode: ms}: eager (host launches included) and CUDA-graph replays (GPU time only)."""
    def fwd():
        return run(x)

    def fwd_bwd():
        x.grad = None
        run(x).backward(gy)

    fwd()
    fwd_bwd()
    if DRY:
        return {mode: 1.0 for mode in (("fwd+bwd graph",) if graph_only else
                                       ("fwd", "fwd+bwd", "fwd graph", "fwd+bwd graph"))}
    out = {}
    if not graph_only:
        out = {"fwd": bu.bench_ms(fwd, quick), "fwd+bwd": bu.bench_ms(fwd_bwd, quick, grad_to_none=[x])}
    for mode, fn in (("fwd graph", fwd), ("fwd+bwd graph", fwd_bwd)):
        if graph_only and mode == "fwd graph":
            continue
        ms, note = bu.graph_ms(fn, quick)
        if note:  # a provider that synchronises with the host cannot be captured
            print(f"{mode}: {note}", flush=True)
        out[mode] = float("nan") if note else ms
    return out


def saved_mb(run, x) -> float:
    """MB the forward keeps for the backward (the tensors autograd saves, each storage counted once; the input
    counts when it is saved, since the backward then keeps it alive)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run(x)
    return sum(storages.values()) / 1e6


def providers(op):
    from snntrain.nn import SpikeMaxPool2d

    if op == "avgpool":
        return [("torch", lambda x: F.adaptive_avg_pool2d(x, 1))]
    ours = SpikeMaxPool2d(3, stride=2, padding=1, backend="triton")
    return [("ours-triton", ours), ("torch", lambda x: F.max_pool2d(x, 3, 2, 1))]


def run(quick, deadline, formats, dtypes, skipped):
    rows = []
    cases = CASES[:1] + CASES[3:] if quick else CASES
    for (bench, label, op, shape), dname, fmt in itertools.product(cases, dtypes, formats):
        if time.time() > deadline:
            skipped.append(f"{bench} {label} {dname} {fmt}: out of time budget")
            continue
        x, gy = make_input(op, shape, DTYPES[dname], fmt)
        for provider, fn in providers(op):
            try:
                times = time_fn(fn, x, gy, quick)
            except Exception as err:  # noqa: BLE001 - record and go on
                traceback.print_exc()
                skipped.append(f"{provider} {bench} {dname} {fmt}: {type(err).__name__}: {err}"[:300])
                continue
            note = f"saved for backward {saved_mb(fn, x):.1f} MB"
            for mode, ms in times.items():
                rows.append(bu.Row(benchmark=bench, op=f"{op}-{label}-{fmt}", mode=mode, provider=provider,
                                   dtype=dname, shape="[" + ",".join(map(str, shape)) + "]", ms=ms,
                                   bytes=case_bytes(op, shape, DTYPES[dname].itemsize, mode.split()[0]), note=note))
        del x, gy
        if not DRY:
            torch.cuda.empty_cache()
    return rows


def stem_input(shape, steps, dtype, fmt, seed=0):
    """The convolution's output (requiring a gradient) and dL/d(pooled spikes) of a stem case."""
    if DRY:
        shape = (2, min(shape[-3], 8), 9, 9) if steps else (2, 2, min(shape[-3], 8), 9, 9)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = (torch.randn(shape, device=DEVICE, generator=g) * 1.5 + 0.3).to(dtype)
    T = steps or shape[0]
    pooled = (T, *shape[-4:-2], (shape[-2] - 1) // 2 + 1, (shape[-1] - 1) // 2 + 1)
    gy = torch.randn(pooled, device=DEVICE, generator=g).to(dtype)
    if fmt == "cl":
        x = x.contiguous(memory_format=torch.channels_last) if steps else \
            x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, shape[:2])
        gy = gy.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, pooled[:2])
    return x.requires_grad_(), gy


def stem_bytes(x, gy, mode):
    """The fused algorithm's bytes (see the module docstring)."""
    X, Q, P = x.numel() * x.element_size(), gy.numel() * gy.element_size(), gy.numel()
    return 2 * X + Q + P if mode == "fwd" else 7 * X + 2 * Q + 2 * P


def stem_providers(steps, C):
    """(name, fn) of the stem: the fused op and the two modules one after the other (fresh layers, training)."""
    from snntrain.models.common import DEFAULT_NEURON
    from snntrain.nn import MultiStep, NormNeuron, SpikeMaxPool2d, build_neuron, norm_neuron_max_pool

    def layers():
        neuron = build_neuron(**DEFAULT_NEURON, backend="triton")
        sn = NormNeuron(torch.nn.BatchNorm2d(C), neuron, backend="triton").to(DEVICE)
        return sn, MultiStep(SpikeMaxPool2d(3, stride=2, padding=1, backend="triton"))

    sn_f, pool_f = layers()
    sn_s, pool_s = layers()
    return [("ours-fused", lambda x: norm_neuron_max_pool(sn_f, pool_f, x, T=steps)),
            ("ours-separate", lambda x: pool_s(sn_s(x, T=steps)))]


def stem_run(quick, deadline, formats, dtypes, skipped):
    rows = []
    cases = STEM_CASES[:1] if quick else STEM_CASES
    for (bench, shape, steps), dname, fmt in itertools.product(cases, dtypes, formats):
        if time.time() > deadline:
            skipped.append(f"{bench} {dname} {fmt}: out of time budget")
            continue
        x, gy = stem_input(shape, steps, DTYPES[dname], fmt)
        for provider, fn in stem_providers(steps, x.shape[-3]):
            try:
                times = time_fn(fn, x, gy, quick)
            except Exception as err:  # noqa: BLE001 - record and go on
                traceback.print_exc()
                skipped.append(f"{provider} {bench} {dname} {fmt}: {type(err).__name__}: {err}"[:300])
                continue
            note = f"saved for backward {saved_mb(fn, x):.1f} MB"
            label = "[" + ",".join(map(str, shape)) + "]" + (f" over T={steps}" if steps else "")
            for mode, ms in times.items():
                rows.append(bu.Row(benchmark=bench, op=f"bn-lif-maxpool-{fmt}", mode=mode, provider=provider,
                                   dtype=dname, shape=label, ms=ms, bytes=stem_bytes(x, gy, mode.split()[0]),
                                   note=note))
        del x, gy
        if not DRY:
            torch.cuda.empty_cache()
    return rows


def stem_sweep(quick, deadline, formats, dtypes, copy_gbps):
    from snntrain.kernels import bn_neuron_pool as BNP
    from snntrain.kernels import bn_neuron_pool_tuning as tuning

    saved = (tuning.FWD_TILE, tuning.FWD_STRIDED_TILE, tuning.FWD_CL_CHANNELS, tuning.FWD_WARPS, tuning.FWD_WARPS_LONG)
    rows = []
    try:
        for (bench, shape, steps), dname, fmt in itertools.product(STEM_CASES, dtypes, formats):
            x, gy = stem_input(shape, steps, DTYPES[dname], fmt)
            nbytes = stem_bytes(x, gy, "fwd+bwd")
            fused = stem_providers(steps, x.shape[-3])[0][1]
            for tile, channels, warps in STEM_SWEEP:
                if time.time() > deadline:
                    break
                tuning.FWD_TILE = tuning.FWD_STRIDED_TILE = tile
                tuning.FWD_CL_CHANNELS, tuning.FWD_WARPS, tuning.FWD_WARPS_LONG = channels, warps, warps
                tuning.fwd_tiles.cache_clear()
                BNP._FWD_PLANS.clear()  # the eager plans hold the launch sizes
                ms = time_fn(fused, x, gy, quick, graph_only=True)["fwd+bwd graph"]
                rows.append({"benchmark": bench, "dtype": dname, "format": fmt, "tile": tile, "cl_channels": channels,
                             "warps": warps, "ms": ms, "roofline": nbytes / copy_gbps / 1e6 / ms})
                print(f"{bench} {dname} {fmt} tile={tile} channels={channels} warps={warps}: {ms:.4f} ms "
                      f"({rows[-1]['roofline']:.2f} of the copy rate)", flush=True)
            del x, gy
            if not DRY:
                torch.cuda.empty_cache()
    finally:
        (tuning.FWD_TILE, tuning.FWD_STRIDED_TILE, tuning.FWD_CL_CHANNELS, tuning.FWD_WARPS,
         tuning.FWD_WARPS_LONG) = saved
        tuning.fwd_tiles.cache_clear()
        BNP._FWD_PLANS.clear()
    return rows


def sweep(quick, deadline, formats, dtypes, copy_gbps):
    from snntrain.kernels import spike_pool_tuning as tuning
    from snntrain.nn import SpikeMaxPool2d

    saved = (tuning.TILE, tuning.CL_CHANNELS, tuning.WARPS)
    pool = SpikeMaxPool2d(3, stride=2, padding=1, backend="triton")
    rows = []
    try:
        for (bench, _label, op, shape), dname, fmt in itertools.product(CASES, dtypes, formats):
            if op != "maxpool":
                continue
            x, gy = make_input(op, shape, DTYPES[dname], fmt)
            nbytes = case_bytes(op, shape, DTYPES[dname].itemsize, "fwd+bwd")
            for tile, channels, warps in SWEEP:
                if time.time() > deadline:
                    break
                tuning.TILE, tuning.CL_CHANNELS, tuning.WARPS = tile, channels, warps
                tuning.pool_tiles.cache_clear()
                ms = time_fn(pool, x, gy, quick, graph_only=True)["fwd+bwd graph"]
                rows.append({"benchmark": bench, "dtype": dname, "format": fmt, "tile": tile, "cl_channels": channels,
                             "warps": warps, "ms": ms, "roofline": nbytes / copy_gbps / 1e6 / ms})
                print(f"{bench} {dname} {fmt} tile={tile} channels={channels} warps={warps}: {ms:.4f} ms "
                      f"({rows[-1]['roofline']:.2f} of the copy rate)", flush=True)
            del x, gy
            if not DRY:
                torch.cuda.empty_cache()
    finally:
        tuning.TILE, tuning.CL_CHANNELS, tuning.WARPS = saved
        tuning.pool_tiles.cache_clear()
    return rows


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sweep", action="store_true", help="time the launch sizes instead")
        p.add_argument("--stem", action="store_true",
                       help="the stems' batch norm, neuron and max-pool: fused against the separate ops")
        p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
        p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
        p.add_argument("--budget", type=float, default=300.0, help="seconds for the whole run")
        p.add_argument("--dry-run", action="store_true", help="no GPU: tiny shapes in Triton's interpreter, fake times")

    args = bu.parse_args(__doc__.splitlines()[0], extra)
    if not DRY:
        bu.device()
    deadline = time.time() + args.budget
    copy_gbps = 1000.0 if DRY else bu.copy_bandwidth()
    print(f"copy bandwidth {copy_gbps:.0f} GB/s on {bu.gpu_name()}", flush=True)
    name = f"{NAME}_stem" if args.stem else NAME
    if args.sweep:
        rows = (stem_sweep if args.stem else sweep)(args.quick, deadline, tuple(args.formats), tuple(args.dtypes),
                                                    copy_gbps)
        if rows:
            bu.write_rows(rows, args.out, f"{name}_sweep")
        return
    skipped: list[str] = []
    rows = (stem_run if args.stem else run)(args.quick, deadline, tuple(args.formats), tuple(args.dtypes), skipped)
    bu.finish(rows, copy_gbps, args.out, name, "Stems: batch norm, neuron and max-pool of spikes" if args.stem
              else "Pooling of spikes")
    if skipped:
        print("skipped:\n" + "\n".join(f"- {s}" for s in skipped))


if __name__ == "__main__":
    main()
