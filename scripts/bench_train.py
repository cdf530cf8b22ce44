"""Training throughput (images/s) of whole spiking networks on the GPU.

Cases, each timed with ``backend=torch`` and ``backend=triton`` on the same weights and
batch, and (for SEW-ResNet-18) against SpikingJelly 2.0.0's ``sew_resnet18`` in a child
process per implementation (it picks its kernels from ``SJ_LIF_CUDA_IMPLEMENTATION``,
read at import):

* ``detector``: the default ``task=detect`` model (spiking FCOS on a light SEW-ResNet-18)
  on a batch of the ``faces`` dataset, with its full loss (FCOS targets, focal + GIoU +
  centerness), AdamW.
* ``sew18``: SEW-ResNet-18 (ImageNet stem, width 64, LIF tau 2, ATan surrogate,
  detach_reset, ADD), T = 4, 10 classes, cross-entropy on the T-averaged logits, SGD.

A step is forward + backward + optimizer step; the rate is batch size x steps / time
after warm-up steps, with the GPU synchronised before and after the timed steps.
Precision: fp32 and bf16 autocast.

    python scripts/bench_train.py --out DIR [--steps 20] [--cases detector sew18]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def timed(step, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def autocast(precision: str):
    if precision == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cuda", enabled=False)


def detector_case(steps: int, warmup: int, precision: str) -> list[dict]:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from snntrain.data import build_datamodule
    from snntrain.losses import fcos_loss
    from snntrain.models import build_model
    from snntrain.nn import set_backend

    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["task=detect", "paths.output_dir=/tmp/bench_train"])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    dm = build_datamodule({**cfg["data"], "num_train": 64, "num_val": 8, "num_test": 8, "augment": False}, seed=0)
    dm.setup()
    images, targets = next(iter(dm.train_dataloader()))
    images = images.cuda()
    targets = {k: v.cuda() for k, v in targets.items() if torch.is_tensor(v)}
    torch.manual_seed(0)
    model = build_model(cfg["model"], backend="torch").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows = []
    for backend in ("torch", "triton"):
        set_backend(model, backend)

        def step():
            with autocast(precision):
                out = model(images)
                assigned = model.targets(out, targets["boxes"], targets["labels"], targets["num_boxes"])
                loss = fcos_loss(out, assigned, backend=backend)["loss"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        sec = timed(step, steps, warmup)
        rows.append({"case": "detector", "provider": f"snntrain-{backend}", "precision": precision,
                     "batch": images.shape[0], "shape": list(images.shape), "T": cfg["T"],
                     "ms_per_step": sec * 1e3, "images_per_s": images.shape[0] / sec})
    return rows


SEW18 = {"T": 4, "batch": 32, "size": 128, "classes": 10}


def sew18_ours(steps: int, warmup: int, precision: str) -> list[dict]:
    from snntrain.models import SEWResNet
    from snntrain.nn import set_backend

    torch.manual_seed(0)
    model = SEWResNet(depth=18, num_classes=SEW18["classes"], in_channels=3, T=SEW18["T"], stem="imagenet", width=64,
                      neuron={"type": "LIF", "tau": 2.0, "detach_reset": True, "surrogate": "atan"},
                      backend="torch").cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(SEW18["batch"], 3, SEW18["size"], SEW18["size"], device="cuda")
    y = torch.randint(0, SEW18["classes"], (SEW18["batch"],), device="cuda")
    rows = []
    for backend in ("torch", "triton"):
        set_backend(model, backend)

        def step():
            with autocast(precision):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        sec = timed(step, steps, warmup)
        rows.append({"case": "sew18", "provider": f"snntrain-{backend}", "precision": precision,
                     "batch": SEW18["batch"], "shape": [SEW18["batch"], 3, SEW18["size"], SEW18["size"]],
                     "T": SEW18["T"], "ms_per_step": sec * 1e3, "images_per_s": SEW18["batch"] / sec})
    return rows


def sew18_spikingjelly(steps: int, warmup: int, precision: str, impl: str) -> list[dict]:
    from spikingjelly.activation_based import functional, neuron, surrogate
    from spikingjelly.activation_based.model import sew_resnet

    torch.manual_seed(0)
    net = sew_resnet.sew_resnet18(spiking_neuron=neuron.LIFNode, surrogate_function=surrogate.ATan(), tau=2.0,
                                  detach_reset=True, cnf="ADD", num_classes=SEW18["classes"]).cuda()
    functional.set_step_mode(net, "m")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(SEW18["batch"], 3, SEW18["size"], SEW18["size"], device="cuda")
    y = torch.randint(0, SEW18["classes"], (SEW18["batch"],), device="cuda")

    def step():
        functional.reset_net(net)
        with autocast(precision):
            xt = x.unsqueeze(0).repeat(SEW18["T"], 1, 1, 1, 1)
            loss = torch.nn.functional.cross_entropy(net(xt).mean(0), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    sec = timed(step, steps, warmup)
    return [{"case": "sew18", "provider": f"spikingjelly-{impl}", "precision": precision, "batch": SEW18["batch"],
             "shape": [SEW18["batch"], 3, SEW18["size"], SEW18["size"]], "T": SEW18["T"],
             "ms_per_step": sec * 1e3, "images_per_s": SEW18["batch"] / sec}]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench_results"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=["detector", "sew18"], choices=["detector", "sew18"])
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--sj-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks need a CUDA GPU")
    if args.sj_worker:
        rows = []
        for prec in args.precisions:
            try:
                rows += sew18_spikingjelly(args.steps, args.warmup, prec, args.sj_worker)
            except Exception as err:  # noqa: BLE001 - report and go on
                print(f"spikingjelly-{args.sj_worker} {prec}: {type(err).__name__}: {err}", file=sys.stderr)
        print("ROWS " + json.dumps(rows))
        return
    rows: list[dict] = []
    for prec in args.precisions:
        if "detector" in args.cases:
            rows += detector_case(args.steps, args.warmup, prec)
        if "sew18" in args.cases:
            rows += sew18_ours(args.steps, args.warmup, prec)
    if "sew18" in args.cases:
        for impl in ("triton", "torch"):
            env = dict(os.environ, SJ_LIF_CUDA_IMPLEMENTATION=impl)
            cmd = [sys.executable, __file__, "--sj-worker", impl, "--steps", str(args.steps), "--warmup",
                   str(args.warmup), "--precisions", *args.precisions]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            got = [line for line in res.stdout.splitlines() if line.startswith("ROWS ")]
            if got:
                rows += json.loads(got[-1][5:])
            for line in res.stderr.splitlines():
                if line.startswith(f"spikingjelly-{impl} "):
                    print(line[:300])
            if res.returncode != 0 or not got:
                print(f"spikingjelly-{impl} failed: {' | '.join(res.stderr.strip().splitlines()[-3:])[:500]}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_train.json").write_text(json.dumps(rows, indent=2))
    print(f"\nGPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  date {time.strftime('%Y-%m-%d')}")
    print(f"{'case':9s} {'precision':9s} {'provider':22s} {'ms/step':>9s} {'images/s':>9s}")
    for r in rows:
        print(f"{r['case']:9s} {r['precision']:9s} {r['provider']:22s} {r['ms_per_step']:9.2f} {r['images_per_s']:9.1f}")


if __name__ == "__main__":
    main()
