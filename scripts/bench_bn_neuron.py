"""Benchmark batch norm followed by a LIF neuron: fused (ours) against unfused and SpikingJelly 2.0.0.

    python scripts/bench_bn_neuron.py --out DIR [--quick] [--budget SECONDS]

Cases: the BN -> neuron layers of SEW-ResNet-18 on 224x224 ImageNet at batch 32 and
T=4 (the stem's output is the same at every step: ``[B, C, H, W]`` repeated over T, a
stride-0 time axis), and the CIFAR stem and first stage at 32x32, batch 128, T=4. Each
case in fp32 and bf16 (bf16 activations with fp32 norm parameters, as under autocast), in
contiguous NCHW and channels-last, in two modes, both in training mode (batch statistics,
running statistics updated):

* ``fwd``: forward under ``torch.no_grad()``;
* ``fwd+bwd``: forward, then backward from a full random dL/dS tensor;

each timed eagerly (host launch costs included) and as the replay of a CUDA graph of the
same call (``... graph``: GPU time only, the number the roofline is about).

Providers (every one runs BatchNorm2d(C) then LIF(tau=2, decay_input, v_threshold=1,
hard reset to 0, detach_reset, atan surrogate), the SEW-ResNet default neuron):

* ``ours-fused``: :class:`snntrain.nn.NormNeuron` with ``backend="triton"`` (the fused kernels);
* ``bn+ours``: ``torch.nn.BatchNorm2d`` on the folded ``[T*B, C, H, W]`` batch (cuDNN or
  PyTorch's native kernels) followed by our Triton LIF;
* ``sj``: SpikingJelly's ``layer.BatchNorm2d`` + ``neuron.LIFNode`` (``step_mode="m"``,
  ``SJ_LIF_CUDA_IMPLEMENTATION=triton``; 16-bit through its precision API), in a child process.

Bytes (the ``bytes`` column, the same for every provider of a case) are those of the fused
algorithm (see snntrain/kernels/bn_neuron.py): with ``X`` the input's bytes (counted
once for the stride-0 stem) and ``E`` the bytes of a ``[T, B, C, H, W]`` tensor,
``fwd`` = 2 X + E (statistics read X, the fused pass reads X and writes S) and
``fwd+bwd`` = 5 X + 4 E (backward: the scan reads X and dS and writes dL/dy, the elementwise
pass reads dL/dy and X and writes dX; for the stride-0 stem dL/dy is summed over T, 7 X + 2 E).
``roofline`` = (bytes / copy bandwidth) / time, with the copy bandwidth (clone of 1 GiB)
measured in the same run.

Writes ``DIR/bench_bn_neuron.csv``, ``.jsonl``, ``.png`` and ``DIR/bench_bn_neuron.md`` (compact table).

``--sweep`` times the launch sizes of :mod:`snntrain.kernels.norm_neuron_tuning` instead (tile elements
and warps of the fused forward and backward, the channels a channels-last tile holds, the programs per SM of the
statistics and backward kernels, :data:`SWEEP_CONFIGS`): every BN-neuron
layer of SEW-ResNet-18 at 224 (batch 32, T=4) and of the event network (128x128 frames, batch 16, T=16),
forward + backward as CUDA-graph replays, each shape weighted by its number of layers; prints a table
per dtype and format and writes ``DIR/bench_bn_neuron_sweep.csv`` and ``.jsonl`` (each layer's time and the
networks' totals).
``--kernels`` prints the GPU time of each kernel of the same layers' forward + backward (the profiler over
replays of its CUDA graph) and writes ``DIR/bench_bn_neuron_kernels.csv`` and ``.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

import bench_utils as bu  # noqa: E402

NAME = "bench_bn_neuron"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
T = 4
# (benchmark, label, B, C, H, W, stride-0 time axis, layers of this shape in the network)
CASES = [
    ("bn_neuron/sew18", "stem", 32, 64, 112, 112, True, 1),
    ("bn_neuron/sew18", "layer1", 32, 64, 56, 56, False, 4),
    ("bn_neuron/sew18", "layer2", 32, 128, 28, 28, False, 5),
    ("bn_neuron/sew18", "layer3", 32, 256, 14, 14, False, 5),
    ("bn_neuron/sew18", "layer4", 32, 512, 7, 7, False, 5),
    ("bn_neuron/cifar", "stem", 128, 64, 32, 32, True, 1),
    ("bn_neuron/cifar", "layer1", 128, 64, 32, 32, False, 4),
]
FORMATS = ("nchw", "cl")


def neuron_kwargs():
    return dict(tau=2.0, decay_input=True, v_threshold=1.0, v_reset=0.0, detach_reset=True, surrogate="atan")


def case_bytes(B, C, H, W, expanded, itemsize, mode):
    e = T * B * C * H * W * itemsize
    x = e // T if expanded else e
    if mode == "fwd":
        return 2 * x + e
    return 7 * x + 2 * e if expanded else 5 * x + 4 * e


def shape_text(B, C, H, W, expanded):
    return f"[{T},{B},{C},{H},{W}]" + (" exp" if expanded else "")


def make_input(B, C, H, W, expanded, dtype, fmt, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (B, C, H, W) if expanded else (T * B, C, H, W)
    x = torch.randn(shape, device="cuda", generator=g).to(dtype)
    if fmt == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
    if not expanded:
        x = x.unflatten(0, (T, B))
    gs = torch.randn((T * B, C, H, W), device="cuda", generator=g).to(dtype)
    if fmt == "cl":
        gs = gs.contiguous(memory_format=torch.channels_last)
    return x.requires_grad_(), gs.unflatten(0, (T, B))


def sweep_layer(B, C, H, W, expanded, steps_t, dtype, fmt):
    """``(fwd, fwd_bwd)`` of a fused BN-neuron layer of :data:`SWEEP_SHAPES` on its own input (sets ``T``)."""
    global T
    from torch import nn

    from snntrain.nn import LIF, NormNeuron

    T = steps_t
    x, gs = make_input(B, C, H, W, expanded, dtype, fmt)
    layer = NormNeuron(nn.BatchNorm2d(C), LIF(**neuron_kwargs()), backend="triton").cuda()
    if fmt == "cl":
        layer = layer.to(memory_format=torch.channels_last)
    steps = T if expanded else None

    def fwd():
        with torch.no_grad():
            return layer(x, T=steps)

    def fwd_bwd():
        x.grad = None
        torch.autograd.backward(layer(x, T=steps), gs)

    return fwd, fwd_bwd


def graph_ms(fn, quick):
    """Median ms of ``fn`` captured in a CUDA graph and replayed: the GPU time without the host's launch cost;
    NaN where ``fn`` cannot be captured (a provider that synchronises with the host)."""
    ms, note = bu.graph_ms(fn, quick)
    return float("nan") if note else ms


def kernel_times(formats: tuple[str, ...], dtypes: tuple[str, ...], copy_gbps: float, replays: int = 20) -> list[dict]:
    """GPU microseconds per kernel of each :data:`SWEEP_SHAPES` layer's forward + backward (the profiler over
    ``replays`` replays of its CUDA graph), printed per layer with the layer's bytes and weighted over the
    networks' layers."""
    global T
    rows = []
    try:
        for dname in dtypes:
            for fmt in formats:
                weighted: dict[str, float] = {}
                for net, B, C, H, W, expanded, steps_t, n in SWEEP_SHAPES:
                    _fwd, fwd_bwd = sweep_layer(B, C, H, W, expanded, steps_t, DTYPES[dname], fmt)
                    graph, _outs = bu.capture([fwd_bwd])
                    for _ in range(5):
                        graph.replay()
                    torch.cuda.synchronize()
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        for _ in range(replays):
                            graph.replay()
                        torch.cuda.synchronize()
                    per: dict[str, float] = {}
                    for e in prof.events():
                        if e.device_type == torch.autograd.DeviceType.CUDA:
                            name = e.name.split("<")[0][:48]
                            per[name] = per.get(name, 0.0) + e.device_time / replays
                    mb = case_bytes(B, C, H, W, expanded, DTYPES[dname].itemsize, "fwd+bwd") / 1e6
                    print(f"{dname} {fmt} {net} {shape_text(B, C, H, W, expanded)} x{n}: {sum(per.values()):.1f} us, "
                          f"{mb:.0f} MB = {mb / copy_gbps * 1e3:.1f} us at the copy bandwidth", flush=True)
                    for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
                        print(f"    {us:8.1f} us  {name}")
                        weighted[name] = weighted.get(name, 0.0) + n * us
                        rows.append({"dtype": dname, "format": fmt, "network": net,
                                     "layer": shape_text(B, C, H, W, expanded), "layers": n, "kernel": name,
                                     "us": round(us, 2)})
                    del _fwd, fwd_bwd, graph, _outs
                    torch.cuda.empty_cache()
                print(f"{dname} {fmt}: kernels over every layer of both networks (us):")
                for name, us in sorted(weighted.items(), key=lambda kv: -kv[1]):
                    print(f"    {us:9.1f}  {name}")
    finally:
        T = 4
    return rows


def time_fn(run, x, gs, quick):
    """{mode: ms}; ``run(x)`` returns the spikes [T, B, C, H, W]. Eager (host launches included) and
    CUDA-graph replays (GPU time only; NaN where the provider cannot be captured)."""
    def fwd():
        with torch.no_grad():
            return run(x)

    def fwd_bwd():
        x.grad = None
        torch.autograd.backward(run(x), gs)

    fwd()
    fwd_bwd()
    out = {"fwd": bu.bench_ms(fwd, quick), "fwd+bwd": bu.bench_ms(fwd_bwd, quick, grad_to_none=[x])}
    for mode, fn in (("fwd graph", fwd), ("fwd+bwd graph", fwd_bwd)):
        out[mode] = graph_ms(fn, quick)
    return out


def rows_for(provider, case, dname, fmt, times, note=""):
    bench, label, B, C, H, W, expanded, _n = case
    out = []
    for mode, ms in times.items():
        out.append(bu.Row(benchmark=bench, op=f"{label}-{fmt}", mode=mode, provider=provider, dtype=dname,
                          shape=shape_text(B, C, H, W, expanded), ms=ms,
                          bytes=case_bytes(B, C, H, W, expanded, DTYPES[dname].itemsize, mode.split()[0]),
                          note=note))
    return out


def run_ours(quick: bool, deadline: float, skipped: list[str]) -> list[bu.Row]:
    from torch import nn

    from snntrain.nn import LIF, NormNeuron

    rows = []
    for case in CASES:
        _bench, label, B, C, H, W, expanded, _n = case
        for dname, dtype in DTYPES.items():
            for fmt in FORMATS:
                if time.time() > deadline:
                    skipped.append(f"ours {label} {dname} {fmt}: out of time budget")
                    continue
                x, gs = make_input(B, C, H, W, expanded, dtype, fmt)
                steps = T if expanded else None
                fused = NormNeuron(nn.BatchNorm2d(C), LIF(**neuron_kwargs()), backend="triton").cuda()
                bn = nn.BatchNorm2d(C).cuda()
                lif = LIF(**neuron_kwargs(), backend="triton")
                if fmt == "cl":
                    fused, bn = fused.to(memory_format=torch.channels_last), bn.to(memory_format=torch.channels_last)

                def unfused(x):
                    if expanded:
                        y = bn(x)
                        return lif(y.unsqueeze(0).expand(T, *y.shape))
                    return lif(bn(x.flatten(0, 1)).unflatten(0, (T, B)))

                for provider, fn in (("ours-fused", lambda x: fused(x, T=steps)), ("bn+ours", unfused)):
                    try:
                        rows += rows_for(provider, case, dname, fmt, time_fn(fn, x, gs, quick))
                    except Exception as err:  # noqa: BLE001 - record and go on
                        traceback.print_exc()
                        skipped.append(f"{provider} {label} {dname} {fmt}: {type(err).__name__}: {err}"[:300])
                del x, gs
                torch.cuda.empty_cache()
    return rows


def sj_worker(quick: bool, out_path: Path) -> None:
    result, save = bu.worker_result(out_path)

    try:
        from spikingjelly.activation_based import layer, neuron, surrogate
    except Exception as err:  # noqa: BLE001 - any import failure means: skip SpikingJelly
        result["error"] = f"spikingjelly not importable: {type(err).__name__}: {err}"
        save()
        return

    def make(C, dtype):
        bn = layer.BatchNorm2d(C, step_mode="m").cuda()
        node = neuron.LIFNode(tau=2.0, decay_input=True, v_threshold=1.0, v_reset=0.0,
                              surrogate_function=surrogate.ATan(), detach_reset=True, step_mode="m").cuda()
        note = ""
        if dtype != torch.float32:
            from spikingjelly.activation_based.precision import PrecisionConfig, prepare_model_for_precision

            node = prepare_model_for_precision(node, "cuda", PrecisionConfig(neuron_storage="bf16")).model
            note = "precision API"
        return bn, node, note

    for case in CASES:
        _bench, label, B, C, H, W, expanded, _n = case
        for dname, dtype in DTYPES.items():
            for fmt in FORMATS:
                try:
                    bn, node, note = make(C, dtype)
                    if fmt == "cl":
                        bn = bn.to(memory_format=torch.channels_last)
                    x, gs = make_input(B, C, H, W, expanded, dtype, fmt)

                    def run(x):
                        node.reset()
                        if expanded:  # SpikingJelly's multi-step BN on the repeated stem output
                            y = bn(x.unsqueeze(0).expand(T, *x.shape))
                        else:
                            y = bn(x)
                        return node(y)

                    result["rows"] += [asdict(r) for r in rows_for("sj", case, dname, fmt, time_fn(run, x, gs, quick),
                                                                   note)]
                except Exception as err:  # noqa: BLE001
                    msg = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
                    result["skipped"].append(f"sj {label} {dname} {fmt}: {type(err).__name__}: {msg}")
                torch.cuda.empty_cache()
                save()
    save()


def run_sj(quick: bool, deadline: float, out: Path, skipped: list[str]) -> list[bu.Row]:
    env = dict(os.environ, SJ_LIF_CUDA_IMPLEMENTATION="triton")
    return bu.run_worker(__file__, "sj", ["--worker"], env, quick, deadline, out, NAME, skipped)


def compact(rows: list[bu.Row], copy_gbps: float) -> str:
    """Markdown: ms per provider, our roofline fraction and speed-ups, per case, dtype, format, mode."""
    by = {(r.benchmark, r.op, r.dtype, r.mode, r.provider): r for r in rows}
    lines = [f"GPU: {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s, T={T}", "",
             "| case | format | dtype | mode | ours-fused ms | roofline | bn+ours ms | sj ms | vs bn+ours | vs sj |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r.benchmark, r.op, r.dtype, r.mode) for r in rows))
    for bench, op, dtype, mode in keys:
        ours = by.get((bench, op, dtype, mode, "ours-fused"))
        base = by.get((bench, op, dtype, mode, "bn+ours"))
        sj = by.get((bench, op, dtype, mode, "sj"))
        if ours is None:
            continue
        label, fmt = op.rsplit("-", 1)
        lines.append(
            f"| {bench.split('/')[1]} {label} {ours.shape} | {fmt} | {dtype} | {mode} | {ours.ms:.3f} | "
            f"{ours.roofline:.2f} | {base.ms if base else float('nan'):.3f} | {sj.ms if sj else float('nan'):.3f} | "
            f"{(base.ms / ours.ms) if base else float('nan'):.2f}x | {(sj.ms / ours.ms) if sj else float('nan'):.2f}x |")
    # whole-network totals (each layer shape times its count) for SEW-ResNet-18
    lines += ["", "SEW-ResNet-18 (all 20 BN-neuron layers), training step fwd+bwd, ms:", "",
              "| timing | dtype | format | ours-fused | bn+ours | sj |", "|---|---|---|---|---|---|"]
    for mode, dtype, fmt in ((m, d, f) for m in ("fwd+bwd", "fwd+bwd graph") for d in DTYPES for f in FORMATS):
        tot = {}
        for prov in ("ours-fused", "bn+ours", "sj"):
            s, ok = 0.0, True
            for bench, label, *_rest, n in CASES:
                if bench != "bn_neuron/sew18":
                    continue
                r = by.get((bench, f"{label}-{fmt}", dtype, mode, prov))
                if r is None:
                    ok = False
                    break
                s += n * r.ms
            tot[prov] = f"{s:.2f}" if ok else "-"
        lines.append(f"| {'graph' if 'graph' in mode else 'eager'} | {dtype} | {fmt} | {tot['ours-fused']} | "
                         f"{tot['bn+ours']} | {tot['sj']} |")
    return "\n".join(lines)


#: (network, B, C, H, W, stride-0 time axis, T, layers) of the sweep
SWEEP_SHAPES = [
    ("sew18", 32, 64, 112, 112, True, 4, 1), ("sew18", 32, 64, 56, 56, False, 4, 4),
    ("sew18", 32, 128, 28, 28, False, 4, 5), ("sew18", 32, 256, 14, 14, False, 4, 5),
    ("sew18", 32, 512, 7, 7, False, 4, 5),
    ("event", 16, 64, 64, 64, False, 16, 1), ("event", 16, 64, 32, 32, False, 16, 4),
    ("event", 16, 128, 16, 16, False, 16, 5),
    ("event", 16, 256, 8, 8, False, 16, 5), ("event", 16, 512, 4, 4, False, 16, 5),
]
#: (FWD_TILE, FWD_WARPS, BWD_TILE, BWD_WARPS, FWD_CL_CHANNELS, BWD_CL_CHANNELS, BWD_CL_CHANNELS_LONG, STATS_TILE,
#: STATS_PROGRAMS_PER_SM, BWD_PROGRAMS_PER_SM, BWD_PREFETCH): the launch sizes of
#: snntrain/kernels/norm_neuron_tuning.py (BWD_TILE: where the scan's chunks have 4 steps), the defaults first, then
#: the defaults without the backward's prefetch
SWEEP_CONFIGS = [
    (1024, 4, 512, 4, 32, 32, 32, 4096, 4, 8, True), (1024, 4, 512, 4, 32, 32, 32, 4096, 4, 8, False),
    (1024, 4, 512, 4, 32, 64, 32, 4096, 4, 8, True), (1024, 4, 256, 4, 32, 32, 32, 4096, 4, 8, True),
    (1024, 4, 512, 4, 32, 32, 32, 4096, 4, 6, True), (1024, 4, 512, 4, 32, 16, 16, 4096, 4, 8, True),
    (1024, 4, 1024, 4, 32, 32, 32, 4096, 4, 8, True),
]


def sweep(quick: bool, deadline: float, formats: tuple[str, ...], dtypes: tuple[str, ...]) -> list[dict]:
    """Milliseconds of the networks' BN-neuron layers (forward, forward + backward) per launch configuration."""
    global T
    from snntrain.kernels import bn_neuron, norm_neuron_tuning

    names = ("FWD_TILE", "FWD_WARPS", "BWD_TILE", "BWD_WARPS", "FWD_CL_CHANNELS", "BWD_CL_CHANNELS",
             "BWD_CL_CHANNELS_LONG", "STATS_TILE", "STATS_PROGRAMS_PER_SM", "BWD_PROGRAMS_PER_SM", "BWD_PREFETCH")
    defaults = {n: getattr(norm_neuron_tuning, n) for n in names}
    results = []
    try:
        for cfg in SWEEP_CONFIGS:
            for n, v in zip(names, cfg):
                setattr(norm_neuron_tuning, n, v)  # read when a plan is made
            bn_neuron.clear_plans()
            for dname in dtypes:
                for fmt in formats:
                    if time.time() > deadline:
                        print(f"sweep: out of time at {cfg} {dname} {fmt}", flush=True)
                        return results
                    total = {}
                    for net, B, C, H, W, expanded, steps_t, n in SWEEP_SHAPES:
                        fwd, fwd_bwd = sweep_layer(B, C, H, W, expanded, steps_t, DTYPES[dname], fmt)
                        for mode, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                            ms = graph_ms(fn, quick)
                            total[(net, mode)] = total.get((net, mode), 0.0) + n * ms
                            results.append({**dict(zip(names, cfg)), "dtype": dname, "format": fmt, "network": net,
                                            "layer": shape_text(B, C, H, W, expanded), "layers": n, "mode": mode,
                                            "ms": round(ms, 4)})
                        del fwd, fwd_bwd
                        torch.cuda.empty_cache()
                    for (net, mode), ms in total.items():
                        results.append({**dict(zip(names, cfg)), "dtype": dname, "format": fmt, "network": net,
                                        "layer": "all", "layers": sum(s[-1] for s in SWEEP_SHAPES if s[0] == net),
                                        "mode": mode, "ms": round(ms, 4)})
                    print(" ".join(str(v) for v in cfg), dname, fmt,
                          " ".join(f"{net} {mode} {ms:.3f}" for (net, mode), ms in total.items()), flush=True)
    finally:
        T = 4
        for n, v in defaults.items():
            setattr(norm_neuron_tuning, n, v)
        bn_neuron.clear_plans()
    return results


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sweep", action="store_true", help="time the launch configurations instead")
        p.add_argument("--kernels", action="store_true", help="GPU time per kernel of the sweep's layers instead")
        p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
        p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
        p.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
        p.add_argument("--no-sj", action="store_true", help="skip SpikingJelly")
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)

    args = bu.parse_args(__doc__.splitlines()[0], extra)
    bu.device()
    if args.worker:
        sj_worker(args.quick, Path(args.worker_out))
        return
    deadline = time.time() + args.budget
    if args.sweep or args.kernels:
        if args.sweep:
            rows, name = sweep(args.quick, deadline, tuple(args.formats), tuple(args.dtypes)), "sweep"
        else:
            copy_gbps = bu.copy_bandwidth()
            print(f"copy bandwidth {copy_gbps:.0f} GB/s on {bu.gpu_name()}", flush=True)
            rows, name = kernel_times(tuple(args.formats), tuple(args.dtypes), copy_gbps), "kernels"
        if rows:
            bu.write_rows(rows, args.out, f"{NAME}_{name}")
        return
    copy_gbps = bu.copy_bandwidth()
    print(f"copy bandwidth {copy_gbps:.0f} GB/s on {bu.gpu_name()}", flush=True)
    skipped: list[str] = []
    rows = run_ours(args.quick, deadline - (0 if args.no_sj else 0.35 * args.budget), skipped)
    if not args.no_sj:
        rows += run_sj(args.quick, deadline, Path(args.out), skipped)
    bu.finish(rows, copy_gbps, args.out, NAME, "BatchNorm2d + LIF")
    md = compact(rows, copy_gbps)
    if skipped:
        md += "\n\nskipped:\n" + "\n".join(f"- {s}" for s in skipped)
    Path(args.out, f"{NAME}.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
