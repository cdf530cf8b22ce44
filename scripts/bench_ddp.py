"""Training throughput on one GPU against several, through the real command line and Trainer.

Each case runs ``python -m snntrain ...`` once per device count with ``trainer.devices=N`` (DDP
for N > 1), on data that costs next to nothing to load, and reads the rate that
:class:`snntrain.callbacks.TrainingSpeedMonitor` logs as ``perf/train_images_per_s``: images of
all GPUs per second of the training steps after 5 warm-up steps of each epoch, the GPUs
synchronised only at the two ends of that window (start-up, compilation, autotuning and
validation are outside it). The rate of the last epoch is reported. Every device count runs the
same number of steps per GPU with the same per-GPU batch, so N GPUs see N times the images.

Cases:

* ``sew18``: SEW-ResNet-18 (ImageNet stem, width 64, LIF), T = 4, 224 x 224 RGB, batch 32 per GPU,
  ``data=synthetic`` (a pool of random images in memory), the classification task (AdamW).
* ``detector``: the default ``task=detect`` model and loss on ``data=faces`` (64 x 64, batch 32 per
  GPU, no augmentation, images rendered in the first epoch and cached, so later epochs only copy).

Every run passes ``cuda_graph=false`` unless the extra overrides set it (``cuda_graph=true``: the whole step,
under DDP with the gradients' all-reduce, captured), so that the speed-up compares the same step.

It also checks that every process of a DDP run reported the same validation metrics (the
``final metrics`` line of ``cli.log`` and ``cli_rank<N>.log``).

    python scripts/bench_ddp.py --out $OUT [--devices 1 2] [--cases sew18 detector] [--steps 60] [--rounds 1]

With ``--rounds N`` every case and device count runs N times, the device counts taking turns (1, 2, 1, 2, ...),
and the speed-up is the median of the rounds' (each round's N-GPU rate over its one-GPU rate), with its range:
the host's speed drifts between runs, and a single pair of runs can land on either side of a target.

Writes ``<out>/bench_ddp.csv`` and ``.jsonl`` (one row per case, device count and round; the speed-ups' medians
over the rounds in ``bench_ddp_median.csv`` and ``.jsonl``) and prints a table with the speed-up over
one GPU.

``--bare`` adds, per device count, the bare step of the ``sew18`` case beside the command line: the same
network, loss and AdamW update with the gradients' all-reduce (:func:`snntrain.distributed.all_reduce_gradients`)
and the per-step SIGTERM broadcast of the command line's loop, as one CUDA graph per process
(``cuda_graph=true``) without Lightning, on a fixed batch per process; 60 steps after 8, the slowest process's
time, three rounds (the median is reported). Compare it with ``cuda_graph=true`` command lines.

    python scripts/bench_ddp.py --out $OUT --cases sew18 --precision bf16-mixed --bare cuda_graph=true

``--comm`` measures the link instead: an NCCL all-reduce over all visible GPUs of a buffer the size
of a model's gradients (``--comm-mb``, default 47 MB: SEW-ResNet-18's fp32 gradients) in fp32 and
bf16, the median of 20 after 5 warm-up, with its bus bandwidth (NCCL's definition: 2 (n-1)/n x bytes
/ time) and ``nvidia-smi topo -m``; written to ``<out>/bench_comm.csv`` and ``.jsonl`` (one row per dtype; the
topology in the ``topology`` column).

    python scripts/bench_ddp.py --out $OUT --comm
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_utils as bu  # noqa: E402

CASES = {
    "sew18": ["task=classify", "data=synthetic", "data.image_size=224", "data.batch_size=32", "data.num_val=128",
              "model.stem=imagenet", "model.width=64", "T=4"],
    "detector": ["task=detect", "data.augment=false", "data.batch_size=32", "data.num_val=128", "T=4"],
}


def last_epoch_rate(run: Path) -> float | None:
    import csv

    rate = None
    with open(run / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("perf/train_images_per_s"):
                rate = float(row["perf/train_images_per_s"])
    return rate


def rank_metrics(run: Path) -> dict[str, dict]:
    out = {}
    for log in sorted(run.glob("cli*.log")):
        lines = [ln for ln in log.read_text().splitlines() if "final metrics " in ln]
        if lines:
            out[log.stem] = ast.literal_eval(lines[-1].split("final metrics ", 1)[1])
    return out


def speedups(rows: list[dict], base_devices: int) -> list[dict]:
    """Sets each row's ``speedup``: its images/s over the run on ``base_devices`` GPUs of the same case, provider
    and round. Returns, per case, provider and device count, the medians over the rounds (images/s and speed-up,
    with the speed-up's range): rounds take turns between the device counts, so a host that slows down for a while
    slows both sides of a round's ratio."""
    def key(r: dict) -> tuple:
        return r["case"], r["provider"], r.get("round")

    base = {key(r): r["images_per_s"] for r in rows if r.get("devices") == base_devices and r.get("images_per_s")}
    for r in rows:
        if r.get("images_per_s") and base.get(key(r)):
            r["speedup"] = r["images_per_s"] / base[key(r)]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "speedup" in r:
            groups.setdefault((r["case"], r["provider"], r["devices"]), []).append(r)
    return [{"case": c, "provider": p, "devices": n, "rounds": len(g),
             "images_per_s": statistics.median(r["images_per_s"] for r in g),
             "speedup": statistics.median(r["speedup"] for r in g),
             "speedup_min": min(r["speedup"] for r in g), "speedup_max": max(r["speedup"] for r in g)}
            for (c, p, n), g in groups.items()]


def run_case(case: str, devices: int, steps: int, epochs: int, backend: str, precision: str, out: Path,
             extra: list[str], accelerator: str = "gpu", round_: int | None = None) -> dict:
    run = out / (f"{case}_{devices}gpu" + ("" if round_ is None else f"_round{round_}"))
    # the per-GPU batch: the case's, or an extra override's (the last one wins, as in Hydra)
    per_gpu = int([a.split("=", 1)[1] for a in [*CASES[case], *extra] if a.startswith("data.batch_size=")][-1])
    n_train = steps * per_gpu * devices
    size = ["data.num_train=" + str(n_train)]
    cmd = [sys.executable, "-m", "snntrain", *CASES[case], *size, f"backend={backend}",
           f"trainer.accelerator={accelerator}", f"trainer.devices={devices}", f"trainer.max_epochs={epochs}",
           f"trainer.precision={precision}",
           "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=50", "logger=csv",
           f"hydra.run.dir={run}", *extra]
    if not any(e.startswith("cuda_graph=") for e in extra):
        # eager unless asked (the earlier tables are eager); cuda_graph=true in the extra overrides captures it
        cmd.append("cuda_graph=false")
    print(" ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        print(res.stdout[-2000:], res.stderr[-4000:], sep="\n")
        return {"case": case, "devices": devices, "round": round_, "error": res.stderr.strip().splitlines()[-1:]}
    metrics = rank_metrics(run)
    same = len({json.dumps(m, sort_keys=True) for m in metrics.values()}) == 1
    return {"case": case, "devices": devices, "round": round_, "backend": backend, "precision": precision,
            "batch_per_gpu": per_gpu, "steps_per_epoch": steps, "epochs": epochs,
            "images_per_s": last_epoch_rate(run), "wall_s": wall, "ranks_report_same_val_metrics": same,
            "val_metrics": metrics, "run_dir": str(run)}


def _bare_worker(rank: int, world: int, port: int, precision: str, steps: int, queue) -> None:
    from bench_train import case_input, sew_model
    from snntrain.distributed import _SigtermFlag, all_reduce_gradients
    from snntrain.nn import set_backend
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import to_channels_last
    from snntrain.tasks.step_graph import StepGraph, training_step_fn

    torch.cuda.set_device(rank)
    if world > 1:
        torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                             world_size=world, device_id=torch.device("cuda", rank))
    torch.backends.cudnn.benchmark = True  # what trainer.benchmark=auto sets
    model = sew_model("sew18-224", "triton").cuda()
    to_channels_last(model)
    set_backend(model, "triton")
    opt = build_optimizer(model, {"name": "adamw", "lr": 0.002, "weight_decay": 1e-4})  # conf/task/classify.yaml
    params = [p for g in opt.param_groups for p in g["params"]]

    def objective(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision.startswith("bf16")):
            return {"loss": torch.nn.functional.cross_entropy(model(x), y)}

    reduce = (lambda: all_reduce_gradients(params, world)) if world > 1 else None
    graph = StepGraph(training_step_fn(objective, opt, reduce), opt)
    flag = _SigtermFlag(torch.device("cuda", rank)) if world > 1 else None
    x, y = case_input("sew18-224", torch.Generator(device="cuda").manual_seed(rank))

    def step() -> None:
        if flag is not None:
            flag.ask(False)
        graph(x, y)

    for _ in range(8):
        step()
    rounds = []
    for _ in range(3):
        torch.cuda.synchronize()
        if world > 1:
            torch.distributed.barrier()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        ms = torch.tensor((time.perf_counter() - t) / steps * 1e3, device="cuda")
        if world > 1:
            torch.distributed.all_reduce(ms, op=torch.distributed.ReduceOp.MAX)
        rounds.append(float(ms))
    if rank == 0:
        queue.put(rounds)
    graph = None  # dropped before the communicator goes (NCCL waits for graphs that hold it)
    torch.cuda.synchronize()
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def bare(devices: int, precision: str, steps: int = 60) -> dict:
    """The bare whole-step graph of the ``sew18`` case on ``devices`` GPUs (``--bare``)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").Queue()
    mp.start_processes(_bare_worker, args=(devices, port, precision, steps, queue), nprocs=devices,
                       start_method="spawn")
    rounds = queue.get()
    ms = sorted(rounds)[len(rounds) // 2]
    return {"case": "sew18", "devices": devices, "provider": "bare step, whole-step graph", "precision": precision,
            "batch_per_gpu": 32, "ms_per_step_rounds": rounds, "images_per_s": 32 * devices / ms * 1e3}


def _comm_worker(rank: int, world: int, port: int, megabytes: float, queue) -> None:
    torch.cuda.set_device(rank)
    torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        n = int(megabytes * 1e6) // torch.tensor([], dtype=dtype).element_size()
        buf = torch.ones(n, dtype=dtype, device="cuda")
        times = []
        for i in range(25):
            torch.distributed.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.distributed.all_reduce(buf)
            end.record()
            end.synchronize()
            if i >= 5:
                times.append(start.elapsed_time(end))
        ms = sorted(times)[len(times) // 2]
        size = n * buf.element_size()
        rows.append({"dtype": str(dtype).replace("torch.", ""), "bytes": size, "ms": ms,
                     "bus_gb_per_s": 2 * (world - 1) / world * size / ms / 1e6})
    if rank == 0:
        queue.put(rows)
    torch.distributed.destroy_process_group()


def comm(out: Path, megabytes: float) -> None:
    """All-reduce time and bus bandwidth over every visible GPU, and the topology nvidia-smi reports."""
    import socket

    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    if world < 2:
        sys.exit(f"--comm needs at least 2 CUDA GPUs; found {world}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(_comm_worker, args=(world, port, megabytes, queue), nprocs=world, start_method="spawn")
    rows = queue.get()
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
    info = {"gpu": torch.cuda.get_device_name(), "gpus": world,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())), "topology": topo}
    bu.write_rows(rows, out, "bench_comm", **info)
    print(topo)
    print(f"all-reduce over {world} x {info['gpu']}, NCCL {info['nccl']}")
    for r in rows:
        print(f"  {r['dtype']:9s} {r['bytes'] / 1e6:7.1f} MB  {r['ms']:7.3f} ms  bus {r['bus_gb_per_s']:7.1f} GB/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench_results"))
    p.add_argument("--devices", nargs="+", type=int, default=[1, 2])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--steps", type=int, default=60, help="training steps per epoch and GPU (5 are warm-up)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--backend", default="triton", choices=["triton", "torch"])
    p.add_argument("--precision", default="32-true")
    p.add_argument("--accelerator", default="gpu", choices=["gpu", "cpu"], help="cpu: a dry run of the script")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every case and device count this many times, the device counts taking turns; the "
                        "speed-up is then the median of each round's (see speedups())")
    p.add_argument("--bare", action="store_true", help="also time the bare whole-step graph of sew18 (see above)")
    p.add_argument("--comm", action="store_true", help="time an NCCL all-reduce over all GPUs instead of runs")
    p.add_argument("--comm-mb", type=float, default=47.0, help="all-reduce size in MB (--comm)")
    p.add_argument("extra", nargs="*", help="more overrides for every run (e.g. trainer.sync_batchnorm=true)")
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.comm:
        out = Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        return comm(out, args.comm_mb)
    if args.accelerator == "gpu" and torch.cuda.device_count() < max(args.devices):
        sys.exit(f"needs {max(args.devices)} CUDA GPU(s); found {torch.cuda.device_count()}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = [run_case(case, n, args.steps, args.epochs, args.backend, args.precision, out, args.extra, args.accelerator,
                     r if args.rounds > 1 else None)
            for r in range(args.rounds) for case in args.cases for n in args.devices]
    for r in rows:
        r.setdefault("provider", "command line")
    if args.bare:
        rows += [bare(n, args.precision) for n in args.devices]
    medians = speedups(rows, min(args.devices))
    info = {"gpu": torch.cuda.get_device_name() if args.accelerator == "gpu" else "cpu",
            "gpus": torch.cuda.device_count(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    csv_path, jsonl_path = bu.write_rows(rows, out, "bench_ddp", gpu=info["gpu"], gpus=info["gpus"])
    bu.write_rows(medians, out, "bench_ddp_median", gpu=info["gpu"], gpus=info["gpus"])
    print(f"\nGPU: {info['gpu']} x {info['gpus']}  torch {info['torch']}  date {info['date']}")
    print(f"{'case':9s} {'provider':28s} {'GPUs':>4s} {'images/s':>10s} {'speed-up':>9s} "
          f"{'same val metrics on all ranks':>30s}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:9s} {r['provider']:28s} {r['devices']:4d} failed: {r['error']}")
            continue
        rate = f"{r['images_per_s']:.1f}" if r["images_per_s"] else "-"
        print(f"{r['case']:9s} {r['provider']:28s} {r['devices']:4d} {rate:>10s} {r.get('speedup', float('nan')):9.2f} "
              f"{str(r.get('ranks_report_same_val_metrics', '')):>30s}")
    if args.rounds > 1:
        print(f"\nmedian of {args.rounds} rounds (range of the speed-up):")
        for m in medians:
            print(f"{m['case']:9s} {m['provider']:28s} {m['devices']:4d} {m['images_per_s']:10.1f} "
                  f"{m['speedup']:9.2f} ({m['speedup_min']:.2f}-{m['speedup_max']:.2f})")
    print(f"csv: {csv_path}  jsonl: {jsonl_path}")


if __name__ == "__main__":
    main()
