"""Training steps of whole spiking networks on the GPU, against SpikingJelly, with a GPU-time breakdown.

Cases (``--cases``), each a full step (forward, loss, backward, optimizer step) on the
same weights and batch:

* ``sew18-224``: SEW-ResNet-18 (ImageNet stem, width 64, ADD, LIF tau 2, sigmoid
  surrogate, no detach), T = 4, 224x224, batch 32, 10 classes, SGD (momentum 0.9);
* ``sew18-32``: the same network at 32x32, batch 128;
* ``sew18-cifar``: the CIFAR stem (3x3 conv, no max-pool) at 32x32, batch 128;
* ``detector``: the default ``task=detect`` model on a ``faces`` batch, FCOS loss, AdamW.

Providers: ``snntrain-eager`` (channels-last, the default on CUDA), ``snntrain-eager-unfused`` (the
same without the fused norm-neuron op: ``NormNeuron.fused = False``), ``snntrain-eager-nchw`` and
``snntrain-eager-nchw-unfused`` (contiguous NCHW maps),
``snntrain-compile`` and ``snntrain-reduce-overhead`` (``torch.compile`` of the model; the
second captures forward and backward in CUDA graphs), ``snntrain-torch`` (the PyTorch
reference backend), and SpikingJelly 2.0.0's ``sew_resnet18`` in a child process per
implementation (``SJ_LIF_CUDA_IMPLEMENTATION=triton``; bf16 through its precision API,
``prepare_model_for_precision(..., PrecisionConfig(neuron_storage="bf16"))``). Every
provider uses a fused optimizer. Precision: fp32, or bf16 autocast.

Per row: ms/step (steps run back to back after warm-up, between two synchronisations), images/s, peak
memory (``max_memory_allocated`` over the timed steps), compile time (first calls) and,
with ``--profile``, the GPU time per step split by kind: convolution, norm, neuron,
pooling, layout (NCHW<->NHWC transposes), elementwise (everything else, inductor's fused
kernels too), optimizer, and idle/host (the step's wall time not covered by kernels).

    python scripts/bench_train.py --out DIR [--cases sew18-224 sew18-32 ...] [--providers ...]
        [--precisions fp32 bf16] [--steps 20] [--profile]

Writes ``bench_train.csv``, ``bench_train.json`` (one line per row, written as rows
finish, so a run cut short keeps what it measured) and ``bench_train.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "sew18-224": {"size": 224, "batch": 32, "stem": "imagenet"},
    "sew18-32": {"size": 32, "batch": 128, "stem": "imagenet"},
    "sew18-cifar": {"size": 32, "batch": 128, "stem": "cifar"},
    "detector": {},
}
T, CLASSES = 4, 10
NEURON = {"type": "LIF", "tau": 2.0, "detach_reset": False, "surrogate": "sigmoid"}
PROVIDERS = ("snntrain-eager", "snntrain-eager-unfused", "snntrain-eager-nchw", "snntrain-eager-nchw-unfused",
             "snntrain-compile",
             "snntrain-reduce-overhead",
             "snntrain-torch", "spikingjelly")
KINDS = ("convolution", "norm", "neuron", "pooling", "layout", "elementwise", "optimizer", "idle/host")


def autocast(precision: str):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")


def kind_of(name: str) -> str:
    n = name.lower()
    if "neuron" in n or "multistep_lif" in n or "lif_" in n:
        return "neuron"
    if "nchwtonhwc" in n or "nhwctonchw" in n or "transpose" in n or "permute" in n:
        return "layout"
    if any(k in n for k in ("batch_norm", "batchnorm", "bn_", "welford", "layer_norm", "native_batch")):
        return "norm"
    if any(k in n for k in ("conv", "cudnn", "xmma", "implicit", "gemm", "wgrad", "dgrad", "fprop", "cutlass",
                            "sm80_", "sm90_", "winograd")):
        return "convolution"
    if any(k in n for k in ("batch_norm", "batchnorm", "bn_", "welford", "layer_norm", "native_batch")):
        return "norm"
    if "pool" in n:
        return "pooling"
    if any(k in n for k in ("multi_tensor", "fused_sgd", "sgd", "adam", "foreach")):
        return "optimizer"
    return "elementwise"


def time_steps(step, steps: int, warmup: int) -> tuple[float, float, float]:
    """(seconds of the warm-up calls, compilation included; ms per step over ``steps`` steps run
    back to back between two synchronisations, as in a training loop; peak bytes)."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return first, (time.perf_counter() - t) / steps * 1e3, torch.cuda.max_memory_allocated()


def breakdown(step, ms_per_step: float, steps: int = 5) -> dict[str, float]:
    """GPU milliseconds per step by kind, and idle/host = the unprofiled step time not covered
    by kernels (the profiler slows the host down, so its own wall time is not used)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = dict.fromkeys(KINDS, 0.0)
    for evt in prof.key_averages():
        if getattr(evt, "is_user_annotation", False) or evt.key.startswith(("snntrain::", "ProfilerStep")):
            continue  # a range around kernels counted by their own names (record_function ranges)
        gpu_us = getattr(evt, "self_device_time_total", None)
        if gpu_us is None:
            gpu_us = getattr(evt, "self_cuda_time_total", 0.0)
        if gpu_us and evt.device_type == torch.autograd.DeviceType.CUDA:
            out[kind_of(evt.key)] += gpu_us / 1e3 / steps
    out["idle/host"] = max(0.0, ms_per_step - sum(out.values()))
    return out


def row(case, provider, precision, batch, first, ms, peak, prof=None, note=""):
    r = {"case": case, "provider": provider, "precision": precision, "batch": batch, "T": T,
         "ms_per_step": round(ms, 3), "images_per_s": round(batch / ms * 1e3, 1),
         "peak_mem_mib": round(peak / 2**20, 1), "first_calls_s": round(first, 2), "note": note,
         "gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
    for k in KINDS:
        r[f"ms_{k}"] = round(prof[k], 3) if prof else ""
    return r


# ----------------------------------------------------------------------------- snntrain


def sew_model(case: str, backend: str):
    from snntrain.models import SEWResNet

    c = CASES[case]
    torch.manual_seed(0)
    return SEWResNet(depth=18, num_classes=CLASSES, in_channels=3, T=T, stem=c["stem"], width=64, neuron=NEURON,
                     backend=backend)


def unfuse(model, provider: str) -> None:
    """``*-unfused`` providers: each norm and neuron through its own kernels (no fused norm-neuron op)."""
    from snntrain.nn import NormNeuron

    for m in model.modules():
        if isinstance(m, NormNeuron):
            m.fused = not provider.endswith("-unfused")


def ours(case: str, provider: str, precision: str, args) -> dict:
    from snntrain.nn import set_backend
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last

    backend = "torch" if provider == "snntrain-torch" else "triton"
    mode = {"snntrain-compile": "default", "snntrain-reduce-overhead": "reduce-overhead"}.get(provider)
    torch._dynamo.reset()
    if case == "detector":
        return detector(provider, precision, backend, mode, args)
    c = CASES[case]
    model = sew_model(case, backend).cuda()
    if "nchw" not in provider:
        to_channels_last(model)
    set_backend(model, backend)
    unfuse(model, provider)
    fn = compile_model(model, mode)
    opt = build_optimizer(model, {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0})
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(c["batch"], 3, c["size"], c["size"], device="cuda", generator=g)
    y = torch.randint(0, CLASSES, (c["batch"],), device="cuda", generator=g)

    def step():
        with autocast(precision):
            loss = torch.nn.functional.cross_entropy(fn(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    first, ms, peak = time_steps(step, args.steps, args.warmup)
    prof = breakdown(step, ms) if args.profile else None
    return row(case, provider, precision, c["batch"], first, ms, peak, prof)


def detector(provider, precision, backend, mode, args) -> dict:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from snntrain.data import build_datamodule
    from snntrain.losses import fcos_loss
    from snntrain.models import build_model
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last

    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["task=detect", "paths.output_dir=/tmp/bench_train"])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    dm = build_datamodule({**cfg["data"], "num_train": 64, "num_val": 8, "num_test": 8, "augment": False}, seed=0)
    dm.setup()
    images, targets = next(iter(dm.train_dataloader()))
    images = images.cuda()
    targets = {k: v.cuda() for k, v in targets.items() if torch.is_tensor(v)}
    torch.manual_seed(0)
    model = build_model(cfg["model"], backend=backend).cuda()
    if "nchw" not in provider:
        to_channels_last(model)
    unfuse(model, provider)
    fn = compile_model(model, mode)
    opt = build_optimizer(model, cfg["task"]["optimizer"])

    def step():
        with autocast(precision):
            out = fn(images)
            assigned = model.targets(out, targets["boxes"], targets["labels"], targets["num_boxes"])
            loss = fcos_loss(out, assigned, backend=backend)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    first, ms, peak = time_steps(step, args.steps, args.warmup)
    prof = breakdown(step, ms) if args.profile else None
    return row("detector", provider, precision, images.shape[0], first, ms, peak, prof)


# ----------------------------------------------------------------------------- SpikingJelly


def spikingjelly(case: str, precision: str, args) -> dict:
    from spikingjelly.activation_based import functional, layer, neuron, surrogate
    from spikingjelly.activation_based.model import sew_resnet

    c = CASES[case]
    torch.manual_seed(0)
    net = sew_resnet.sew_resnet18(spiking_neuron=neuron.LIFNode, surrogate_function=surrogate.Sigmoid(), tau=2.0,
                                  detach_reset=False, cnf="ADD", num_classes=CLASSES)
    if c["stem"] == "cifar":
        net.conv1 = layer.Conv2d(3, 64, 3, padding=1, bias=False)
        net.maxpool = torch.nn.Identity()
    functional.set_step_mode(net, "m")
    net = net.cuda()
    ctx = autocast(precision)
    note = "SJ_LIF_CUDA_IMPLEMENTATION=triton"
    if precision == "bf16":
        from spikingjelly.activation_based.precision import PrecisionConfig, prepare_model_for_precision

        art = prepare_model_for_precision(net, "cuda", PrecisionConfig(neuron_storage="bf16"))
        net = art.model
        ctx = art.autocast_context()
        note += ", precision API neuron_storage=bf16"
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(c["batch"], 3, c["size"], c["size"], device="cuda", generator=g)
    y = torch.randint(0, CLASSES, (c["batch"],), device="cuda", generator=g)

    def step():
        functional.reset_net(net)
        with ctx:
            xt = x.unsqueeze(0).repeat(T, 1, 1, 1, 1)
            loss = torch.nn.functional.cross_entropy(net(xt).mean(0), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    first, ms, peak = time_steps(step, args.steps, args.warmup)
    prof = breakdown(step, ms) if args.profile else None
    return row(case, "spikingjelly", precision, c["batch"], first, ms, peak, prof, note)


def run_spikingjelly(case: str, precision: str, args) -> list[dict]:
    env = dict(os.environ, SJ_LIF_CUDA_IMPLEMENTATION="triton")
    cmd = [sys.executable, __file__, "--sj-worker", case, "--precisions", precision, "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + (["--profile"] if args.profile else [])
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    got = [line for line in res.stdout.splitlines() if line.startswith("ROW ")]
    if not got:
        print(f"spikingjelly {case} {precision} failed: {' | '.join(res.stderr.strip().splitlines()[-4:])[:600]}")
        return []
    return [json.loads(got[-1][4:])]


# ----------------------------------------------------------------------------- output


def save(rows: list[dict], out: Path) -> None:
    with open(out / "bench_train.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    keys = sorted({(r["case"], r["precision"]) for r in rows})
    provs = [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(keys)), 4.5))
    width = 0.8 / max(1, len(provs))
    for i, p in enumerate(provs):
        vals = [next((r["images_per_s"] for r in rows if (r["case"], r["precision"]) == k and r["provider"] == p), 0)
                for k in keys]
        ax.bar([j + i * width for j in range(len(keys))], vals, width, label=p)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [f"{c}\n{p}" for c, p in keys], fontsize=8)
    ax.set_ylabel("images / s (training)")
    ax.set_title(f"Training steps, T={T} ({rows[0]['gpu']}, {rows[0]['date']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench_train.png", dpi=120)


def print_rows(rows: list[dict]) -> None:
    print(f"\nGPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  date {time.strftime('%Y-%m-%d')}")
    head = f"{'case':12s} {'prec':5s} {'provider':26s} {'ms/step':>8s} {'img/s':>8s} {'peak MiB':>9s} {'first s':>8s}"
    print(head + "  " + " ".join(f"{k[:6]:>6s}" for k in KINDS))
    for r in rows:
        print(f"{r['case']:12s} {r['precision']:5s} {r['provider']:26s} {r['ms_per_step']:8.2f} "
              f"{r['images_per_s']:8.1f} {r['peak_mem_mib']:9.1f} {r['first_calls_s']:8.1f}  "
              + " ".join(f"{r[f'ms_{k}']:6.2f}" if r[f"ms_{k}"] != "" else f"{'':6s}" for k in KINDS))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench_results"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=list(PROVIDERS))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--profile", action="store_true", help="GPU-time breakdown by kind for every row")
    p.add_argument("--sj-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks need a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    if args.sj_worker:
        print("ROW " + json.dumps(spikingjelly(args.sj_worker, args.precisions[0], args)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    log = open(out / "bench_train.json", "a")
    for case in args.cases:
        for prec in args.precisions:
            for prov in args.providers:
                if prov == "spikingjelly" and case == "detector":
                    continue
                try:
                    new = run_spikingjelly(case, prec, args) if prov == "spikingjelly" else [ours(case, prov, prec, args)]
                except Exception as err:  # noqa: BLE001 - report and go on with the other rows
                    print(f"{case} {prec} {prov}: {type(err).__name__}: {str(err)[:400]}")
                    continue
                finally:
                    torch.cuda.empty_cache()
                for r in new:
                    rows.append(r)
                    log.write(json.dumps(r) + "\n")
                    log.flush()
                    print(f"  {case} {prec} {prov}: {r['ms_per_step']:.2f} ms, {r['peak_mem_mib']:.0f} MiB, "
                          f"first calls {r['first_calls_s']:.1f} s", flush=True)
    if rows:
        save(rows, out)
        print_rows(rows)


if __name__ == "__main__":
    main()
