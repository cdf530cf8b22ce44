"""Benchmark the multi-step LIF neuron: ours (Triton and PyTorch backends) against SpikingJelly 2.0.0.

    python scripts/bench_neurons.py --out DIR [--quick] [--budget SECONDS] [--sweep] [--suite lif|psn]

Cases: the SpikingJelly tutorial's ``[T, 64, 65536]`` for T in 4, 8, 16, 32, and the
neuron inputs of SEW-ResNet-18 on 224x224 ImageNet at batch 32 and T=4 (the stem's
input is the stem output repeated over T, a stride-0 expanded tensor). Every case in
fp32, fp16 and bf16, in two modes:

* ``fwd``: inference forward under ``torch.no_grad()``; minimal bytes = read X + write S.
* ``fwd+bwd``: ``y = lif(x); y.sum().backward()``; minimal bytes = five tensors of X's
  size (forward reads X and writes S, the sum reads S, the backward reads X or a saved
  state of that size and writes dX; the expanded dS of the sum costs nothing). For the
  expanded stem input X is counted once, not T times.

Every provider runs the same neuron: LIF, tau=2, decay_input=True, v_threshold=1,
v_reset=0 (hard reset), detach_reset=False, sigmoid surrogate with alpha=4, multi-step.

Providers:

* ``ours-triton``, ``ours-torch``: ``snntrain.nn.LIF`` with ``backend="triton"`` / ``"torch"``.
* ``sj-triton``, ``sj-torch``: SpikingJelly's ``LIFNode(step_mode="m")`` module with
  ``SJ_LIF_CUDA_IMPLEMENTATION=triton`` / ``torch`` (the module is reset before every call).
* ``sj-triton-prec`` (fp16/bf16): the same module prepared with
  ``prepare_model_for_precision(model, "cuda", PrecisionConfig(neuron_storage=<input dtype>))``.
* ``sj-auto-module`` (fp16/bf16): the plain module with the variable unset; SpikingJelly runs
  16-bit input through its Python reference loop.

SpikingJelly reads its implementation choice when imported, so each of its settings is
measured in a child process of this script (``--worker``); rows are merged here. Without
an importable spikingjelly those providers are skipped and ours still run. ``--budget``
bounds the whole run (child processes get what is left).

Writes ``DIR/bench_neurons.csv``, ``.png`` (via scripts/bench_utils.py) and
``DIR/bench_neurons.md`` (the compact table and the target checks, for docs/benchmarks.md).

``--suite psn`` measures the parallel spiking neurons instead (:func:`psn_suite`): PSN, MaskedPSN and
SlidingPSN forward+backward on ``[T, 64, 65536]``, T in 4 and 16, fp32 and bf16, time and peak memory,
ours against SpikingJelly's module of the same name, into ``DIR/bench_neurons_psn.jsonl``.
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

NAME = "bench_neurons"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TUTORIAL_T = (4, 8, 16, 32)
SEW_T = 4
# SEW-ResNet-18, ImageNet 224x224, batch 32: the stem neuron (input expanded over T) and the four stages.
SEW_LAYERS = (
    ("stem", (32, 64, 112, 112), True),
    ("layer1", (32, 64, 56, 56), False),
    ("layer2", (32, 128, 28, 28), False),
    ("layer3", (32, 256, 14, 14), False),
    ("layer4", (32, 512, 7, 7), False),
)
MODES = ("fwd", "fwd+bwd")
CONFIG_NOTE = "LIF tau=2 decay_input v_th=1 v_reset=0 sigmoid(4)"
SJ_WORKERS = (
    # (worker name, SJ_LIF_CUDA_IMPLEMENTATION or None)
    ("sj-triton", "triton"),
    ("sj-torch", "torch"),
    ("sj-auto", None),
)
PROVIDER_ORDER = ("ours-triton", "ours-triton-graph", "ours-torch", "sj-triton", "sj-triton-prec", "sj-torch",
                  "sj-auto-module")


def cases(quick: bool) -> list[tuple[str, str, tuple[int, ...], bool]]:
    """(benchmark, label, shape, expanded time axis)."""
    out = [("neurons/tutorial", f"T{T}", (T, 64, 65536), False) for T in ((4, 32) if quick else TUTORIAL_T)]
    layers = SEW_LAYERS[:2] if quick else SEW_LAYERS
    out += [("neurons/sew18", f"{name}-T{SEW_T}", (SEW_T, *shape), exp) for name, shape, exp in layers]
    return out


def shape_text(shape: tuple[int, ...], expanded: bool) -> str:
    return "[" + ",".join(map(str, shape)) + "]" + (" exp" if expanded else "")


def min_bytes(shape: tuple[int, ...], itemsize: int, mode: str, expanded: bool) -> int:
    n_t = 1
    for s in shape:
        n_t *= s
    x_bytes = (n_t // shape[0] if expanded else n_t) * itemsize
    t_bytes = n_t * itemsize
    if mode == "fwd":
        return x_bytes + t_bytes  # read X, write S
    return 2 * x_bytes + 3 * t_bytes  # fwd: X, S; sum: S; bwd: X (or a state of its size), dX


def make_input(shape, dtype, expanded, seed=0):
    """Leaf tensor to differentiate and the (possibly expanded) input the neuron sees."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    base_shape = shape[1:] if expanded else shape
    leaf = (torch.randn(base_shape, device="cuda", generator=g) + 0.5).to(dtype).requires_grad_()
    x = leaf.unsqueeze(0).expand(shape) if expanded else leaf
    return leaf, x


def time_module(module, shape, dtype, expanded, quick, reset=None):
    """{mode: (ms, spike count)} for one neuron module on one case."""
    leaf, x = make_input(shape, dtype, expanded)
    out = {}

    def fwd():
        if reset is not None:
            reset()
        with torch.no_grad():
            return module(x)

    def fwd_bwd():
        if reset is not None:
            reset()
        module(x).sum().backward()

    y = fwd()
    count = int(y.float().sum().item())
    del y
    out["fwd"] = (bu.bench_ms(fwd, quick), count)
    out["fwd+bwd"] = (bu.bench_ms(fwd_bwd, quick, grad_to_none=[leaf]), count)
    leaf = x = None  # (not del: the closures above refer to them)
    torch.cuda.empty_cache()
    return out


def rows_for(provider, bench, label, shape, expanded, dtype_name, times, note=""):
    rows = []
    for mode, (ms, count) in times.items():
        nbytes = min_bytes(shape, DTYPES[dtype_name].itemsize, mode, expanded)
        rows.append(bu.Row(benchmark=bench, op="lif", mode=mode, provider=provider, dtype=dtype_name,
                           shape=shape_text(shape, expanded), ms=ms, bytes=nbytes,
                           note=f"{label} spikes={count}" + (f" {note}" if note else "")))
    return rows


# ----------------------------------------------------------------------------
# Our providers (this process)
# ----------------------------------------------------------------------------


def run_ours(provider: str, quick: bool, deadline: float, skipped: list[str]) -> list[bu.Row]:
    from snntrain.nn import LIF

    backend = provider.split("-", 1)[1]
    module = LIF(tau=2.0, v_threshold=1.0, v_reset=0.0, decay_input=True, detach_reset=False,
                 surrogate="sigmoid", alpha=4.0, backend=backend)
    rows = []
    for bench, label, shape, expanded in cases(quick):
        for dname, dtype in DTYPES.items():
            if time.time() > deadline:
                skipped.append(f"{provider} {label} {dname}: out of time budget")
                continue
            try:
                times = time_module(module, shape, dtype, expanded, quick)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                skipped.append(f"{provider} {label} {dname}: out of memory")
                continue
            rows += rows_for(provider, bench, label, shape, expanded, dname, times)
            if backend == "triton" and label in ("T4", "T32"):
                ms = graph_ms(module, shape, dtype, quick)
                rows.append(bu.Row(bench, "lif", "fwd+bwd", "ours-triton-graph", dname, shape_text(shape, expanded),
                                   ms, min_bytes(shape, dtype.itemsize, "fwd+bwd", expanded),
                                   note=f"{label} CUDA-graph replay: GPU time without host overhead"))
    return rows


def graph_ms(module, shape, dtype, quick) -> float:
    """fwd+bwd captured once in a CUDA graph and replayed: the GPU time of the same work,
    without the per-call host cost (and a check that a training step can be captured)."""
    leaf, x = make_input(shape, dtype, False)

    def step():
        return torch.autograd.grad(module(x).sum(), leaf)[0]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    ms = bu.bench_ms(graph.replay, quick)
    graph = leaf = x = None  # (not del: step() refers to them)
    torch.cuda.empty_cache()
    return ms


# ----------------------------------------------------------------------------
# SpikingJelly providers (child processes, one per implementation setting)
# ----------------------------------------------------------------------------


def sj_worker(worker: str, quick: bool, out_path: Path) -> None:
    """Measure SpikingJelly in this process (its implementation variable is already set)."""
    result, save = bu.worker_result(out_path)

    try:
        from spikingjelly.activation_based import neuron, surrogate
    except Exception as err:  # noqa: BLE001 - any import failure means: skip SpikingJelly
        result["error"] = f"spikingjelly not importable: {type(err).__name__}: {err}"
        save()
        return

    def make(dtype, precision):
        node = neuron.LIFNode(tau=2.0, decay_input=True, v_threshold=1.0, v_reset=0.0,
                              surrogate_function=surrogate.Sigmoid(alpha=4.0), detach_reset=False,
                              step_mode="m").cuda()
        if precision:
            from spikingjelly.activation_based.precision import PrecisionConfig, prepare_model_for_precision

            storage = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
            node = prepare_model_for_precision(node, "cuda", PrecisionConfig(neuron_storage=storage)).model
        return node

    # (provider, dtypes, precision API)
    plans = {
        "sj-triton": [("sj-triton", ("fp32",), False), ("sj-triton-prec", ("fp16", "bf16"), True)],
        "sj-torch": [("sj-torch", ("fp32", "fp16", "bf16"), False)],
        "sj-auto": [("sj-auto-module", ("fp16", "bf16"), False)],
    }[worker]
    for provider, dtype_names, precision in plans:
        for bench, label, shape, expanded in cases(quick):
            for dname in dtype_names:
                dtype = DTYPES[dname]
                try:
                    node = make(dtype, precision)
                    times = time_module(node, shape, dtype, expanded, quick, reset=node.reset)
                except Exception as err:  # noqa: BLE001 - record and go on with the next case
                    torch.cuda.empty_cache()
                    msg = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
                    result["skipped"].append(f"{provider} {label} {dname}: {type(err).__name__}: {msg}")
                    save()
                    continue
                note = "precision API" if precision else ("module API" if provider == "sj-auto-module" else "")
                result["rows"] += [asdict(r) for r in rows_for(provider, bench, label, shape, expanded, dname,
                                                               times, note)]
                save()
    save()


def run_sj(worker: str, impl: str | None, quick: bool, deadline: float, out: Path, skipped: list[str]):
    env = dict(os.environ)
    env.pop("SJ_LIF_CUDA_IMPLEMENTATION", None)
    if impl is not None:
        env["SJ_LIF_CUDA_IMPLEMENTATION"] = impl
    left = deadline - time.time()
    if left >= 20:
        print(f"[{worker}] child process, SJ_LIF_CUDA_IMPLEMENTATION={impl or '(unset)'}, up to {left:.0f} s",
              flush=True)
    return bu.run_worker(__file__, worker, ["--worker", worker], env, quick, deadline, out, NAME, skipped)


# ----------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------


def compact(rows: list[bu.Row], copy_gbps: float) -> tuple[str, list[str]]:
    """A pivot table (one line per case, ms per provider) and the target checks."""
    providers = [p for p in PROVIDER_ORDER if any(r.provider == p for r in rows)]
    keys = list(dict.fromkeys((r.benchmark, r.note.split()[0], r.shape, r.mode, r.dtype) for r in rows))
    by = {(r.benchmark, r.note.split()[0], r.shape, r.mode, r.dtype, r.provider): r for r in rows}
    head = ["case", "mode", "dtype", "GB/s", "xroof"] + providers
    lines = []
    for b, label, shape, mode, dtype in keys:
        ours = by.get((b, label, shape, mode, dtype, "ours-triton"))
        cells = [f"{b.split('/')[1]}-{label}", mode, dtype,
                 f"{ours.gbps:.0f}" if ours else "-", f"{1 / ours.roofline:.2f}" if ours and ours.roofline else "-"]
        for p in providers:
            r = by.get((b, label, shape, mode, dtype, p))
            cells.append(f"{r.ms:.3f}" if r else "-")
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(head)]
    text = [f"ms per call; GB/s and xroof of ours-triton (time / (minimal bytes / copy bandwidth {copy_gbps:.0f} GB/s)); "
            f"tutorial-T<n> = [n,64,65536], sew18-<layer> = SEW-ResNet-18 ImageNet batch 32 (stem: expanded over T)",
            "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
            "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    text += ["| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |" for cells in lines]

    def get(label, mode, dtype, provider):
        return by.get(("neurons/tutorial", label, shape_text((int(label[1:]), 64, 65536), False), mode, dtype, provider))

    checks = []
    r = get("T32", "fwd+bwd", "fp32", "ours-triton")
    if r:
        x = 1 / r.roofline
        checks.append(f"fp32 T=32 fwd+bwd: ours {r.ms:.3f} ms = {x:.2f}x the roofline "
                      f"({r.bytes / copy_gbps / 1e6:.3f} ms); target <= 1.15x: {'PASS' if x <= 1.15 else 'MISS'}")
    for label, dtype, peer, target in (("T4", "fp32", "sj-triton", 5.0), ("T32", "bf16", "sj-triton-prec", 2.5)):
        r, s = get(label, "fwd+bwd", dtype, "ours-triton"), get(label, "fwd+bwd", dtype, peer)
        if r and s:
            sp = s.ms / r.ms
            checks.append(f"{dtype} {label[0]}={label[1:]} fwd+bwd: ours {r.ms:.3f} ms vs {peer} {s.ms:.3f} ms = "
                          f"{sp:.1f}x faster; target >= {target:g}x: {'PASS' if sp >= target else 'MISS'}")
        elif r:
            checks.append(f"{dtype} {label[0]}={label[1:]} fwd+bwd: ours {r.ms:.3f} ms; {peer} not measured")
        g = get(label, "fwd+bwd", dtype, "ours-triton-graph")
        if g and s:
            checks.append(f"  (GPU time of ours, CUDA-graph replay: {g.ms:.3f} ms = {s.ms / g.ms:.1f}x faster than {peer}; "
                          f"the rest of the eager time is host overhead)")
    # Same spikes as SpikingJelly's fp32 paths (identical configuration and dynamics)?
    mism = []
    for r in rows:
        if r.provider != "ours-triton" or r.mode != "fwd":
            continue
        for p in ("ours-torch", "sj-triton", "sj-torch"):
            o = by.get((r.benchmark, r.note.split()[0], r.shape, r.mode, r.dtype, p))
            if o and o.note.split()[1] != r.note.split()[1] and (p == "ours-torch" or r.dtype == "fp32"):
                mism.append(f"{r.note.split()[0]} {r.dtype} {p}")
    checks.append("spike counts equal to ours-torch (all dtypes) and SpikingJelly (fp32): "
                  + ("yes" if not mism else "NO: " + ", ".join(mism)))
    return "\n".join(text), checks


def sweep(quick: bool) -> None:
    """Time our kernels over launch configurations (for tuning; not part of the default run).

    Forward configurations are timed in ``fwd`` mode, backward configurations in
    ``fwd+bwd`` mode with the default forward.
    """
    from snntrain.kernels import lif as K
    from snntrain.nn import LIF

    module = LIF(backend="triton")
    default = {"FWD_BLOCK": K.FWD_BLOCK, "FWD_WARPS": K.FWD_WARPS, "BWD_BLOCK": K.BWD_BLOCK, "BWD_WARPS": K.BWD_WARPS,
               "BWD16_BLOCK": K.BWD16_BLOCK, "BWD16_WARPS": K.BWD16_WARPS}
    plans = [("fwd", "FWD", cfg) for cfg in ((1024, 8), (1024, 4), (512, 4), (2048, 8), (512, 2))]
    plans += [("fwd+bwd", "BWD", cfg) for cfg in ((512, 4), (256, 2), (256, 4), (512, 8), (1024, 8), (1024, 16),
                                                    (128, 1))]
    copy_gbps = bu.copy_bandwidth()
    print(f"sweep on {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s; defaults {default}")
    for T in (4, 32):
        for dname in ("fp32", "bf16"):
            shape = (T, 64, 65536)
            line = []
            for mode, which, (block, warps) in plans:
                for prefix in ((which, "BWD16") if which == "BWD" else (which,)):
                    setattr(K, f"{prefix}_BLOCK", block)
                    setattr(K, f"{prefix}_WARPS", warps)
                roof = min_bytes(shape, DTYPES[dname].itemsize, mode, False) / copy_gbps / 1e6
                try:
                    ms = time_module(module, shape, DTYPES[dname], False, quick)[mode][0]
                    line.append(f"{which} {block}/{warps}: {ms / roof:.3f}x")
                except Exception as err:  # noqa: BLE001
                    line.append(f"{which} {block}/{warps}: {type(err).__name__}")
                for key, value in default.items():
                    setattr(K, key, value)
            print(f"T={T:2d} {dname} (x roofline of the mode): " + "; ".join(line), flush=True)


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--budget", type=float, default=330.0, help="seconds for the whole run (default 330)")
        p.add_argument("--sweep", action="store_true", help="only time our kernels over launch configurations")
        p.add_argument("--worker", choices=[w for w, _ in SJ_WORKERS], help=argparse.SUPPRESS)
        p.add_argument("--worker-out", help=argparse.SUPPRESS)
        p.add_argument("--suite", choices=("lif", "psn"), default="lif",
                       help="lif: the LIF cases above; psn: PSN, MaskedPSN, SlidingPSN against SpikingJelly")

    args = bu.parse_args(__doc__.splitlines()[0], extra)
    bu.device()
    if args.worker:
        sj_worker(args.worker, args.quick, Path(args.worker_out))
        return
    if args.sweep:
        sweep(args.quick)
        return
    if args.suite == "psn":
        psn_suite(Path(args.out), args.quick, time.time() + args.budget)
        return
    start = time.time()
    deadline = start + args.budget
    out = Path(args.out)
    copy_gbps = bu.copy_bandwidth()
    print(f"GPU {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s, torch {torch.__version__}; {CONFIG_NOTE}",
          flush=True)
    rows: list[bu.Row] = []
    skipped: list[str] = []
    # Most important first: ours, then SpikingJelly's Triton paths, then the PyTorch loops.
    steps = [("ours-triton", None), ("sj-triton", "triton"), ("ours-torch", None), ("sj-torch", "torch"),
             ("sj-auto", None)]
    for name, impl in steps:
        t0 = time.time()
        try:
            if name.startswith("ours-"):
                got = run_ours(name, args.quick, deadline, skipped)
            else:
                got = run_sj(name, impl, args.quick, deadline, out, skipped)
        except Exception:  # noqa: BLE001 - keep what the other providers measured
            traceback.print_exc()
            skipped.append(f"{name}: failed, see the traceback above")
            got = []
        rows += got
        print(f"[{name}] {len(got)} rows in {time.time() - t0:.0f} s", flush=True)
    if not rows:
        sys.exit("no rows measured")
    bu.finish(rows, copy_gbps, out, NAME, "Multi-step LIF, forward and forward+backward")
    table, checks = compact(rows, copy_gbps)
    if skipped:
        print(f"\nskipped ({len(skipped)}):")
        for s in skipped[:40]:
            print("  " + s)
        if len(skipped) > 40:
            print(f"  ... and {len(skipped) - 40} more")
    print(f"\n== compact ({bu.gpu_name()}, {time.time() - start:.0f} s) ==")
    print(table)
    print("\n== targets ==")
    for c in checks:
        print(c)
    md = [f"GPU: {bu.gpu_name()}; torch {torch.__version__}; {CONFIG_NOTE}; ms = median of triton.testing.do_bench.",
          "", table, "", *[f"- {c}" for c in checks]]
    if skipped:
        md += ["", "Skipped:", *[f"- {s}" for s in skipped]]
    (out / f"{NAME}.md").write_text("\n".join(md) + "\n")
    print(f"markdown: {out / f'{NAME}.md'}")


# ----------------------------------------------------------------------------
# The parallel spiking neurons (--suite psn)
# ----------------------------------------------------------------------------

PSN_T = (4, 16)
PSN_DTYPES = ("fp32", "bf16")
PSN_SHAPE = (64, 65536)  # [T, 64, 65536], the tutorial's neurons
PSN_K = 2  # the order of MaskedPSN and SlidingPSN
PSN_NAME = "bench_neurons_psn"


def _psn_pair(neuron: str, T: int):
    """(ours with backend="triton", SpikingJelly's module) holding the same parameters, on the GPU."""
    from spikingjelly.activation_based import neuron as sjn

    from snntrain.nn import PSN, MaskedPSN, SlidingPSN

    if neuron == "PSN":
        sj, ours = sjn.PSN(T), PSN(T)
    elif neuron == "MaskedPSN":
        sj, ours = sjn.MaskedPSN(PSN_K, T, lambda_init=0.5, step_mode="m"), MaskedPSN(PSN_K, T, lambda_init=0.5)
    else:
        sj, ours = sjn.SlidingPSN(PSN_K, step_mode="m"), SlidingPSN(PSN_K)
    ours.load_state_dict(sj.state_dict())
    return ours.cuda(), sj.cuda()


def _psn_measure(module, shape, dtype, quick) -> tuple[float, float, int]:
    """(fwd+bwd ms, peak MiB above what was allocated before the step, spikes) of ``module(x).sum().backward()``,
    gradients for the input and the module's parameters."""
    leaf, x = make_input(shape, dtype, False)

    def step():
        module(x).sum().backward()

    with torch.no_grad():
        count = int(module(x).float().sum().item())
    step()  # compile and warm up
    leaf.grad = None
    module.zero_grad(set_to_none=False)  # parameter gradients stay allocated, as in training
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    ms = bu.bench_ms(step, quick, grad_to_none=[leaf])
    leaf = x = None  # (not del: step() refers to them)
    torch.cuda.empty_cache()
    return ms, peak, count


def psn_suite(out: Path, quick: bool, deadline: float) -> None:
    """PSN, MaskedPSN, SlidingPSN forward+backward: ours (the Triton kernels, and the torch backend) against
    SpikingJelly 2.0.0's module of the same name, whose one implementation (``torch.addmm`` and its surrogate
    function) is its fastest; 16-bit rows run SpikingJelly's module converted to that dtype (it multiplies in
    the input's dtype), ours with fp32 parameters. Writes ``<out>/bench_neurons_psn.jsonl`` (one JSON object per
    measurement), the CSV and plot of :func:`bench_utils.finish`, and prints the target checks (ours at least
    2x faster, at most 0.5x the peak memory)."""
    import json

    copy_gbps = bu.copy_bandwidth()
    print(f"GPU {bu.gpu_name()}, copy bandwidth {copy_gbps:.0f} GB/s, torch {torch.__version__}; PSN suite, "
          f"k={PSN_K}, atan surrogate", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{PSN_NAME}.jsonl").write_text("")
    lines: list[dict] = []
    rows: list[bu.Row] = []
    checks: list[str] = []
    skipped: list[str] = []
    for neuron in ("PSN", "MaskedPSN", "SlidingPSN"):
        for T in PSN_T[:1] if quick else PSN_T:
            shape = (T, *PSN_SHAPE)
            for dname in PSN_DTYPES:
                if time.time() > deadline:
                    skipped.append(f"{neuron} T{T} {dname}: out of time budget")
                    continue
                dtype = DTYPES[dname]
                ours, sj = _psn_pair(neuron, T)
                if dtype != torch.float32:
                    sj = sj.to(dtype)
                got = {}
                for provider, module in (("ours-triton", ours), ("ours-torch", ours), ("sj", sj)):
                    if provider.startswith("ours-"):
                        module.backend = provider.split("-", 1)[1]
                    try:
                        got[provider] = _psn_measure(module, shape, dtype, quick)
                    except Exception as err:  # noqa: BLE001 - record and go on with the next provider
                        torch.cuda.empty_cache()
                        skipped.append(f"{neuron} T{T} {dname} {provider}: {type(err).__name__}: "
                                       f"{str(err).strip()[:160]}")
                        continue
                    ms, peak, count = got[provider]
                    line = {"suite": "psn", "neuron": neuron, "provider": provider, "T": T, "dtype": dname,
                            "shape": list(shape), "mode": "fwd+bwd", "ms": ms, "peak_mib": peak, "spikes": count,
                            "gpu": bu.gpu_name()}
                    lines.append(line)
                    with open(out / f"{PSN_NAME}.jsonl", "a") as f:
                        f.write(json.dumps(line) + "\n")
                    rows.append(bu.Row("neurons/psn", neuron.lower(), "fwd+bwd", provider, dname,
                                       shape_text(shape, False), ms, min_bytes(shape, dtype.itemsize, "fwd+bwd", False),
                                       note=f"T{T} peak={peak:.0f}MiB spikes={count}"))
                    print(f"{neuron:10s} T={T:2d} {dname} {provider:11s} {ms:8.3f} ms  peak {peak:8.0f} MiB", flush=True)
                if "ours-triton" in got and "sj" in got:
                    (ms0, mem0, _), (ms1, mem1, _) = got["ours-triton"], got["sj"]
                    speed, mem = ms1 / ms0, mem0 / mem1 if mem1 > 0 else float("inf")
                    checks.append(f"{neuron} T={T} {dname}: {speed:.2f}x faster than SpikingJelly (target >= 2) "
                                  f"{'PASS' if speed >= 2 else 'FAIL'}; {mem:.2f}x its peak memory (target <= 0.5) "
                                  f"{'PASS' if mem <= 0.5 else 'FAIL'}")
                ours = sj = None
                torch.cuda.empty_cache()
    if rows:
        bu.finish(rows, copy_gbps, out, PSN_NAME, "Parallel spiking neurons, forward+backward")
    print("\n== targets ==")
    for c in checks:
        print(c)
    for s in skipped:
        print("skipped: " + s)
    md = [f"GPU: {bu.gpu_name()}; torch {torch.__version__}; PSN suite, k={PSN_K}, atan surrogate; ms = median of "
          "triton.testing.do_bench; peak = max allocated above the step's start.", "", *[f"- {c}" for c in checks]]
    md += [f"- skipped: {s}" for s in skipped]
    (out / f"{PSN_NAME}.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
