"""Image-folder loading speed: the CPU path, the GPU path (nvJPEG + one kernel) and DALI, alone and
feeding the compiled SEW-ResNet-18 training step, on a JPEG folder the script writes.

The folder: ``--images`` JPEGs of ImageNet-like sizes (400-500 x 333-400 pixels, a fifth portrait) and
quality (88-96, 4:2:0; about 85 KB a file, where ImageNet averages about 110 KB), each a random crop of one
of the photographs that scikit-image and scikit-learn ship, with jittered brightness, contrast and noise;
one class per photograph, ``root/train`` and ``root/val`` as ImageNet lays them out, and ``--odd`` of the
files progressive or CMYK JPEGs or PNGs (which the GPU path decodes on the CPU, counted). Rows
(``scripts/bench_utils.py``'s CSV schema; ``ms`` per batch, ``bytes`` the JPEG bytes of a batch, images/s in
``note``):

* ``loader/alone``: training batches of ``data=image_folder`` with ``decode=cpu`` (PIL in ``--cpu-workers``
  processes, the batch copied to the GPU), ``gpu`` (``--gpu-workers`` processes read the files; nvJPEG and
  the resized-crop kernel on the GPU) and ``dali`` (when importable), each to a finished batch on the GPU;
* ``step/synthetic``: the compiled training step (SEW-ResNet-18, ImageNet stem, T=4, ``--precision``,
  channels-last, ``compile=--compile``, SGD) on one batch already on the GPU: the rate a loader must beat;
* ``loader+step``: the same step fed by each path, batch by batch, the device paths decoding each batch in a
  background thread as it arrives (as in training, ``data.decode_ahead``); ``gpu-in-loop`` decodes in the
  loop's thread instead;
* ``train-run`` (``--train-runs``): short runs of the real training loop (Lightning, the same model and
  compile mode) on ``data=synthetic`` and on the folder with each path: ``perf/train_images_per_s`` of the
  last epoch and ``val/acc`` (the paths' validation accuracy must agree within noise).

    python scripts/bench_loader.py --out DIR [--images 4096] [--batch 32] [--size 224] [--precision bf16]
        [--paths cpu gpu dali] [--train-runs | --no-train-runs] [--device cpu --quick]

Writes ``bench_loader.csv`` and ``.jsonl`` (the rows), ``bench_loader_run.csv`` and ``.jsonl`` (one row for the
run: rates, ratios against the targets, fallback counts, host milliseconds per batch, the training runs) and
``bench_loader.png``. ``--device cpu --quick`` is a dry run on a machine
without a GPU (tiny model, eager, no targets).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_utils  # noqa: E402

SIZES = [(500, 375), (500, 333), (400, 350), (500, 400), (450, 338), (480, 360)]  # (width, height), landscape


# ----------------------------------------------------------------------------- the JPEG folder

_SOURCES: list[np.ndarray] | None = None


def sources() -> list[np.ndarray]:
    """RGB photographs that ship with scikit-image and scikit-learn (no download)."""
    global _SOURCES
    if _SOURCES is None:
        import skimage.data as sk

        found = []
        for name in ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
                     "colorwheel", "camera", "coins"):
            try:
                img = getattr(sk, name)()
            except Exception:  # noqa: BLE001 - a photograph this version lacks or would download
                continue
            if img.ndim == 2:  # grey: tinted, so that colour carries information too
                img = np.stack([img, (img * 0.8).astype(np.uint8), (255 - img // 2).astype(np.uint8)], -1)
            found.append(np.ascontiguousarray(img[..., :3]))
        try:
            from sklearn.datasets import load_sample_images

            found += [np.ascontiguousarray(i) for i in load_sample_images().images]
        except Exception:  # noqa: BLE001
            pass
        if len(found) < 2:
            sys.exit("bench_loader needs scikit-image's or scikit-learn's sample photographs (found fewer than 2)")
        _SOURCES = found
    return _SOURCES


def write_image(job: tuple[str, int, int, str]) -> int:
    """Write image ``seed`` of class ``cls`` to ``path`` (format ``kind``); returns its size in bytes."""
    from PIL import Image

    path, cls, seed, kind = job
    rng = np.random.default_rng(seed)
    src = sources()[cls]
    H, W = src.shape[:2]
    area = rng.uniform(0.35, 1.0) * H * W
    aspect = float(np.exp(rng.uniform(np.log(0.6), np.log(1.6))))
    h = int(min(H, round(np.sqrt(area / aspect))))
    w = int(min(W, round(np.sqrt(area * aspect))))
    top, left = int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1))
    crop = src[top:top + h, left:left + w]
    ow, oh = SIZES[int(rng.integers(len(SIZES)))]
    ow, oh = ow + int(rng.integers(-10, 11)), oh + int(rng.integers(-10, 11))
    if rng.random() < 0.2:
        ow, oh = oh, ow
    img = np.asarray(Image.fromarray(crop).resize((ow, oh), Image.BILINEAR), dtype=np.float32)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    img = (img - 128) * rng.uniform(0.7, 1.3) + 128 + rng.uniform(-30, 30) + rng.normal(0, 12, img.shape)
    pil = Image.fromarray(img.clip(0, 255).astype(np.uint8))
    quality = int(rng.integers(88, 97))
    if kind == "png":
        pil.save(path, "PNG")
    elif kind == "cmyk":
        pil.convert("CMYK").save(path, "JPEG", quality=quality)
    else:
        pil.save(path, "JPEG", quality=quality, progressive=kind == "progressive")
    return os.path.getsize(path)


def make_folder(root: Path, images: int, odd: float, val_fraction: float = 0.1) -> dict:
    """Write the folder (once: an existing complete folder is reused); returns what it holds."""
    from multiprocessing import get_context

    stamp = root / "folder.json"
    if stamp.exists():
        info = json.loads(stamp.read_text())
        if info["images"] == images and info["odd"] == odd:
            return info
    classes = len(sources())
    jobs = []
    rng = np.random.default_rng(0)
    for i in range(images):
        cls = i % classes
        split = "val" if (i // classes) % int(round(1 / val_fraction)) == 0 else "train"  # every class in both
        kind = "jpeg"
        if rng.random() < odd:
            kind = ("progressive", "cmyk", "png")[int(rng.integers(3))]
        folder = root / split / f"class{cls:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((str(folder / f"{i:06d}.{'png' if kind == 'png' else 'jpg'}"), cls, i, kind))
    t0 = time.perf_counter()
    with get_context("fork").Pool(os.cpu_count()) as pool:
        sizes = pool.map(write_image, jobs, chunksize=16)
    kinds = {k: sum(j[3] == k for j in jobs) for k in ("jpeg", "progressive", "cmyk", "png")}
    info = {"images": images, "odd": odd, "classes": classes, "kinds": kinds, "mean_bytes": float(np.mean(sizes)),
            "train": sum("/train/" in j[0] for j in jobs), "val": sum("/val/" in j[0] for j in jobs),
            "seconds": round(time.perf_counter() - t0, 1)}
    stamp.write_text(json.dumps(info))
    return info


# ----------------------------------------------------------------------------- loaders and the step


def datamodule(root: Path, path: str, args, workers: int):
    from snntrain.data import build_datamodule

    cfg = {"name": "image_folder", "root": str(root), "image_size": args.size, "batch_size": args.batch,
           "num_workers": workers, "crop_scale": [0.08, 1.0], "val_resize": int(round(args.size * 256 / 224)),
           "decode": path, "dtype": "bfloat16" if args.precision == "bf16" else "float32", "channels_last": True}
    dm = build_datamodule(cfg, seed=0)
    dm.setup("fit")
    return dm


def batches(dm, device: torch.device, dtype: torch.dtype, host: dict, ahead=None):
    """Finished training batches ``(x, y)`` on ``device``, epoch after epoch; ``host`` collects the host
    seconds spent waiting for the loader (``fetch``) and in the device decoder (``decode``). ``ahead``: a
    :class:`DecodeAhead` that starts decoding each batch as it arrives, as in training."""
    from snntrain.data.device_decode import EncodedBatch

    epoch = 0
    while True:
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        if ahead is not None:
            loader.wrap = ahead.wrap
        it = iter(loader)
        upcoming = next(it, None)
        while upcoming is not None:
            t0 = time.perf_counter()
            batch, upcoming = upcoming, next(it, None)  # one batch ahead, as Lightning's loop fetches
            t1 = time.perf_counter()
            if isinstance(batch, EncodedBatch):
                x, y = dm.on_after_batch_transfer(batch.to(device, non_blocking=True), 0)
            else:  # the CPU path's float32 NCHW batch, in the device path's dtype and layout (one compiled graph)
                x, y = (t.to(device, non_blocking=True) for t in batch)
                layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
                x = x.to(dtype=dtype).contiguous(memory_format=layout)
            t2 = time.perf_counter()
            host["fetch"] += t1 - t0
            host["decode"] += t2 - t1
            host["batches"] += 1
            if len(y) == dm.batch_size:  # static shapes for the compiled step: a last partial batch is skipped
                yield x, y
        epoch += 1


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_step(args, classes: int, device: torch.device):
    """The training step of bench_train.py's sew18-224 case (our compile path), as ``step(x, y)``."""
    from snntrain.models import SEWResNet
    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last

    torch.manual_seed(0)
    torch._dynamo.reset()
    backend = "triton" if device.type == "cuda" else "torch"
    width, T = (64, 4) if not args.quick else (8, 2)
    model = SEWResNet(depth=18, num_classes=classes, in_channels=3, T=T, stem="imagenet", width=width,
                      neuron={"type": "LIF", "tau": 2.0, "detach_reset": False, "surrogate": "sigmoid"},
                      backend=backend).to(device)
    if device.type == "cuda":
        to_channels_last(model)
    fn = compile_model(model, None if args.compile == "none" else args.compile)
    opt = build_optimizer(model, {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0})
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step(x, y):
        with amp:
            loss = torch.nn.functional.cross_entropy(fn(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(fn, n: int, warmup: int, device: torch.device) -> float:
    """Seconds per call of ``fn`` over ``n`` calls after ``warmup``, between two synchronisations."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / n


def per_batch_ms(seconds: dict[str, float], batches: int) -> dict[str, float]:
    """Host milliseconds per batch of each total in ``seconds``."""
    return {k: round(v / batches * 1e3, 3) for k, v in seconds.items()}


def profile_fed(fed, n: int, device: torch.device, out: Path) -> None:
    """``n`` iterations of ``fed`` under torch.profiler (host threads and GPU streams): the tables of
    ``loader_profile.txt`` and the timeline ``loader_trace.json.gz`` (chrome://tracing, Perfetto)."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fed()
        sync(device)
    averages = prof.key_averages()
    with open(out / "loader_profile.txt", "w") as f:
        f.write(f"{n} iterations of the GPU path feeding the compiled step\n\n")
        f.write(averages.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70) + "\n\n")
        f.write(averages.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=70) + "\n")
    trace = out / "loader_trace.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()


# ----------------------------------------------------------------------------- training runs


def train_run(name: str, overrides: list[str], out: Path) -> dict:
    import csv

    from hydra import compose, initialize_config_module

    from snntrain.cli import train

    run = out / f"run_{name}"
    torch._dynamo.reset()  # each run compiles its own model (the on-disk caches make that quick)
    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, "logger=csv", f"paths.output_dir={run}"])
    t0 = time.perf_counter()
    metrics = train(cfg)
    wall = time.perf_counter() - t0
    rate = None
    with open(run / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("perf/train_images_per_s"):
                rate = float(row["perf/train_images_per_s"])
    return {"run": name, "images_per_s": rate, "val_acc": metrics.get("val/acc"), "wall_s": round(wall, 1)}


def train_runs(args, root: Path, folder: dict, out: Path, device: torch.device) -> list[dict]:
    steps = folder["train"] // args.batch
    common = ["model.stem=imagenet", "model.width=64" if not args.quick else "model.width=8",
              "T=4" if not args.quick else "T=2", f"compile={args.compile if args.compile != 'none' else 'null'}",
              f"trainer.max_epochs={args.epochs}", "trainer.enable_progress_bar=false",
              "trainer.accelerator=" + ("gpu" if device.type == "cuda" else "cpu"),
              "trainer.precision=" + ("bf16-mixed" if args.precision == "bf16" else "32-true"),
              "backend=" + ("triton" if device.type == "cuda" else "torch"), "callbacks.precise_bn.num_batches=10",
              "callbacks.checkpoint.every_n_minutes=null", "task.optimizer.name=sgd", "task.optimizer.lr=0.1",
              "task.optimizer.weight_decay=0.0"]
    runs = [("synthetic", ["data=synthetic", f"data.image_size={args.size}", f"data.batch_size={args.batch}",
                           f"data.num_train={steps * args.batch}", f"data.num_val={folder['val']}",
                           f"data.num_classes={folder['classes']}"])]
    for path in sorted(args.paths, key=("gpu", "cpu", "dali").index):
        workers = args.cpu_workers if path == "cpu" else args.gpu_workers
        runs.append((path, ["data=imagenet", f"data.root={root}", f"data.decode={path}", f"data.image_size={args.size}",
                            f"data.val_resize={int(round(args.size * 256 / 224))}", f"data.batch_size={args.batch}",
                            f"data.num_workers={workers}"]))
    rows = []
    for name, data in runs:
        if time.time() + 30 > args.deadline:
            print(f"train-run {name}: skipped, out of the time budget", flush=True)
            continue
        try:
            rows.append(train_run(name, [*common, *data], out))
        except Exception as err:  # noqa: BLE001 - report and go on
            print(f"train-run {name}: {type(err).__name__}: {str(err)[:400]}", flush=True)
            continue
        print(f"train-run {name}: {rows[-1]}", flush=True)
    return rows


# ----------------------------------------------------------------------------- main


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        cores = os.cpu_count() or 2
        p.add_argument("--images", type=int, default=4096)
        p.add_argument("--odd", type=float, default=0.005, help="fraction of progressive/CMYK JPEGs and PNGs")
        p.add_argument("--batch", type=int, default=32)
        p.add_argument("--size", type=int, default=224)
        p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
        p.add_argument("--compile", default="default", choices=["default", "reduce-overhead", "none"])
        p.add_argument("--paths", nargs="+", default=["cpu", "gpu", "dali"], choices=["cpu", "gpu", "dali"])
        p.add_argument("--cpu-workers", type=int, default=max(1, cores - 1))
        p.add_argument("--gpu-workers", type=int, default=max(1, min(8, cores - 1)))
        p.add_argument("--batches", type=int, default=60, help="timed batches per measurement")
        p.add_argument("--epochs", type=int, default=2, help="epochs of each training run")
        p.add_argument("--train-runs", action=argparse.BooleanOptionalAction, default=True)
        p.add_argument("--budget", type=float, default=240.0, help="seconds; later parts are skipped past it")
        p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run")
        p.add_argument("--folder", default=None, help="where to write the JPEGs (default: <out>/jpegs)")
        p.add_argument("--profile", type=int, default=0, metavar="N",
                       help="profile N iterations of the GPU path feeding the step (torch.profiler, host and device): "
                            "loader_profile.txt and loader_trace.json.gz")

    args = bench_utils.parse_args(__doc__.splitlines()[0], extra)
    start = time.time()
    args.deadline = start + args.budget
    device = bench_utils.device() if args.device == "cuda" else torch.device("cpu")
    if args.quick:
        args.images, args.batches, args.size = min(args.images, 96), min(args.batches, 3), min(args.size, 32)
        args.batch, args.epochs = min(args.batch, 8), 1
    if "dali" in args.paths:
        from snntrain.data.device_decode import dali_available

        if not dali_available():
            print("dali: NVIDIA DALI is not installed (pip install \".[dali]\"): its rows are left out", flush=True)
            args.paths = [p for p in args.paths if p != "dali"]
    torch.backends.cudnn.benchmark = True
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = Path(args.folder) if args.folder else out / "jpegs"
    folder = make_folder(root, args.images, args.odd)
    print(f"folder {root}: {folder}", flush=True)
    shape = f"{args.batch}x3x{args.size}x{args.size}"
    dtype = args.precision
    xdtype = torch.bfloat16 if args.precision == "bf16" else torch.float32  # the batches every path delivers
    rows: list[bench_utils.Row] = []
    report: dict = {"folder": folder, "args": {k: v for k, v in vars(args).items() if k != "deadline"},
                    "cores": os.cpu_count(), "alone": {}, "fed": {}, "host_ms": {}, "fallbacks": {}}

    def add(bench: str, provider: str, seconds: float, note: str = "") -> float:
        rate = args.batch / seconds
        rows.append(bench_utils.Row(bench, "image_folder", "train", provider, dtype, shape, seconds * 1e3,
                                    int(folder["mean_bytes"] * args.batch) if bench != "step/synthetic" else 0,
                                    note=f"{rate:.0f} images/s" + (f"; {note}" if note else "")))
        print(f"{bench:18s} {provider:10s} {seconds * 1e3:8.2f} ms/batch {rate:9.1f} images/s {note}", flush=True)
        return rate

    def stream(path: str, ahead: bool = True):
        from snntrain.data.device_decode import DecodeAhead

        workers = args.cpu_workers if path == "cpu" else args.gpu_workers
        dm = datamodule(root, path, args, workers)
        host = {"fetch": 0.0, "decode": 0.0, "batches": 0}
        helper = DecodeAhead(dm.decoder, device) if ahead and dm.decoder is not None else None
        # the workers fill 2 batches each before the clock starts: warm up past them to time the steady state;
        # the timed batches stay in the first epoch (a new epoch starts the loader's processes again, which a
        # real epoch of thousands of batches spreads thin)
        warmup = 2 * workers + 5
        per_epoch = len(dm.train_set) // args.batch
        n = min(args.batches, per_epoch - warmup)
        if n < min(10, args.batches):
            sys.exit(f"bench_loader: an epoch of {per_epoch} batches leaves {n} to time after {warmup} of warm-up "
                     f"({workers} loader processes); write a larger folder (--images) or use fewer processes")
        return dm, batches(dm, device, xdtype, host, helper), host, warmup, n

    # 1. each path alone
    for path in args.paths:
        dm, gen, host, warmup, n = stream(path)
        seconds = timed(lambda gen=gen: next(gen), n, warmup, device)
        report["host_ms"][path] = per_batch_ms({"fetch": host["fetch"], "decode": host["decode"]}, host["batches"])
        report["alone"][path] = add("loader/alone", path, seconds, f"{dm.num_workers} workers")
        if dm.decoder is not None:
            report["fallbacks"][path] = dict(dm.decoder.stats)
        gen.close()

    # 2. the compiled step on one batch already on the device, then fed by each path
    if time.time() < args.deadline:
        step = build_step(args, folder["classes"], device)
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(args.batch, 3, args.size, args.size, device=device, generator=g).to(xdtype)
        x = x.contiguous(memory_format=torch.channels_last) if device.type == "cuda" else x
        y = torch.randint(0, folder["classes"], (args.batch,), device=device, generator=g)
        t0 = time.perf_counter()
        step(x, y)
        sync(device)
        compile_s = time.perf_counter() - t0
        seconds = timed(lambda: step(x, y), max(10, args.batches // 2) if not args.quick else 2, 3, device)
        report["step_images_per_s"] = add("step/synthetic", "synthetic", seconds, f"first call {compile_s:.0f} s")
        fed_cases = [(p, True) for p in args.paths] + [("gpu", False)] * ("gpu" in args.paths)
        for path, ahead in fed_cases:
            if time.time() > args.deadline:
                break
            dm, gen, host, warmup, n = stream(path, ahead)

            def fed(gen=gen):
                xb, yb = next(gen)
                step(xb, yb)

            name = path if ahead or path == "cpu" else f"{path}-in-loop"
            decoder = dm.decoder
            if decoder is not None:  # host seconds of each batch's decode, in whichever thread runs it
                decode, spent = decoder.decode, {"s": 0.0}

                def timed_decode(*a, decode=decode, spent=spent):
                    t = time.perf_counter()
                    try:
                        return decode(*a)
                    finally:
                        spent["s"] += time.perf_counter() - t

                decoder.decode = timed_decode
            report["fed"][name] = add("loader+step", name, timed(fed, n, warmup, device))
            if decoder is not None:
                report["host_ms"][f"fed-{name}"] = per_batch_ms(
                    {"fetch": host["fetch"], "wait_for_decode": host["decode"], "decode_call": spent["s"]},
                    host["batches"])
            if args.profile and name == "gpu" and device.type == "cuda":
                profile_fed(fed, args.profile, device, out)
            gen.close()

    # 3. the real training loop
    if args.train_runs:
        report["train_runs"] = train_runs(args, root, folder, out, device)

    # targets (the GPU machine): GPU path alone >= 1.2x the compiled step; training from JPEGs >= 0.9x synthetic
    step_rate = report.get("step_images_per_s")
    if step_rate and "gpu" in report["alone"]:
        report["gpu_alone_over_step"] = round(report["alone"]["gpu"] / step_rate, 3)
        report["gpu_fed_over_step"] = round(report["fed"].get("gpu", 0.0) / step_rate, 3)
    runs = {r["run"]: r for r in report.get("train_runs", [])}
    if runs.get("synthetic", {}).get("images_per_s"):
        for path in args.paths:
            if runs.get(path, {}).get("images_per_s"):
                report[f"train_run_{path}_over_synthetic"] = round(
                    runs[path]["images_per_s"] / runs["synthetic"]["images_per_s"], 3)
    report["seconds"] = round(time.time() - start, 1)
    copy_gbps = bench_utils.copy_bandwidth(1 << 28) if device.type == "cuda" else 0.0
    bench_utils.finish(rows, copy_gbps, out, "bench_loader", "Image-folder loading")
    _csv, jsonl = bench_utils.write_rows([report], out, "bench_loader_run")
    print(json.dumps({k: v for k, v in report.items() if k not in ("args", "folder")}, indent=1))
    print(f"run: {jsonl}  ({report['seconds']} s)")


if __name__ == "__main__":
    main()
