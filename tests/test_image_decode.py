"""data=image_folder's paths: CPU (PIL in the workers) and device decoding (nvJPEG or DALI + one resized-crop
kernel), which must draw the same boxes and flips from (seed, epoch, index), agree on the pixels up to the
decoder, resume exactly, shard over processes, count the images they decode on the CPU and name bad files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from snntrain.data import build_datamodule
from snntrain.data import device_decode as dd
from snntrain.data.common import BadDataError, derive_seed
from snntrain.data.device_decode import (
    DecodeAhead,
    DeviceDecoder,
    EncodedBatch,
    jpeg_info,
    normalisation,
    resized_crop,
    resized_crop_reference,
)
from snntrain.data.image_folder import RATIO, Augment, center_box, draw_resized_crop

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def picture(h: int, w: int, seed: int, grey: bool = False) -> np.ndarray:
    """Smooth structure (another box gives other pixels) plus a little noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    planes = [128 + 100 * np.sin(x / (3 + k + seed % 3) + y / (5 + k)) for k in range(1 if grey else 3)]
    img = (np.stack(planes, -1) + rng.normal(0, 4, (h, w, len(planes)))).clip(0, 255).astype(np.uint8)
    return img[..., 0] if grey else img


def encode(img: np.ndarray, fmt: str = "JPEG", cmyk: bool = False, **kw) -> bytes:
    buf = io.BytesIO()
    pil = Image.fromarray(img)
    (pil.convert("CMYK") if cmyk else pil).save(buf, fmt, **kw)
    return buf.getvalue()


def make_folder(root: Path, n: int = 6, odd: bool = True) -> Path:
    """Two classes of JPEGs of different sizes; with ``odd`` also a progressive JPEG, a CMYK JPEG and a PNG."""
    rng = np.random.default_rng(1)
    k = 0
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            h, w = (int(v) for v in rng.integers(18, 40, 2))
            (root / cls / f"{i}.jpg").write_bytes(encode(picture(h, w, k), quality=95))
            k += 1
    if odd:
        (root / "a" / "prog.jpg").write_bytes(encode(picture(30, 26, 50), quality=95, progressive=True))
        (root / "b" / "cmyk.jpg").write_bytes(encode(picture(22, 34, 51), cmyk=True, quality=95))
        (root / "b" / "png.png").write_bytes(encode(picture(25, 21, 52), "PNG"))
    return root


def modules(root: Path, decodes=("cpu", "gpu"), **kw) -> dict:
    cfg = {"name": "image_folder", "root": str(root), "image_size": 12, "batch_size": 4, "num_workers": 0,
           "val_fraction": 0.25, "crop_scale": [0.2, 1.0], **kw}
    out = {}
    for d in decodes:
        dm = build_datamodule({**cfg, "decode": d}, seed=7)
        dm.setup("fit")
        out[d] = dm
    return out


def decoded(dm, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    assert isinstance(batch, EncodedBatch)
    return dm.on_after_batch_transfer(batch.to("cpu"), 0)


# ------------------------------------------------------------------------------------------ pieces


def test_jpeg_header_gives_size_and_whether_nvjpeg_reads_it():
    img = picture(24, 20, 0)
    info = jpeg_info(encode(img))
    assert (info.height, info.width, info.components, info.fallback, info.complete) == (24, 20, 3, None, True)
    assert jpeg_info(encode(picture(24, 20, 0, grey=True))).components == 1
    assert jpeg_info(encode(img, progressive=True)).fallback == "progressive JPEG"
    assert jpeg_info(encode(img, cmyk=True)).fallback == "CMYK JPEG"
    assert jpeg_info(encode(img, "PNG")) is None and jpeg_info(b"not an image") is None
    data = encode(img)
    assert jpeg_info(data[: len(data) - 40]).complete is False  # cut inside the scan: no end marker
    assert jpeg_info(data[:100]) is None  # cut inside the header


def test_random_boxes_follow_torchvision_and_depend_only_on_the_generator():
    torch.manual_seed(0)
    for h, w in [(30, 40), (375, 500), (17, 3), (1, 90)]:
        for _ in range(50):
            top, left, bh, bw = draw_resized_crop(h, w, (0.08, 1.0))
            assert 0 <= top and 0 <= left and bh >= 1 and bw >= 1 and top + bh <= h and left + bw <= w
    # a 1x90 strip admits no 3/4..4/3 box of 8-100% of its area: the central box of the nearest ratio
    assert draw_resized_crop(1, 90, (0.08, 1.0)) == (0, 44, 1, 1)
    stats = []
    for _ in range(400):
        _, _, bh, bw = draw_resized_crop(375, 500, (0.25, 1.0))
        stats.append((bh * bw / (375 * 500), bw / bh))
    area, ratio = np.array(stats).T
    assert 0.24 <= area.min() and area.max() <= 1.0 and 0.5 < area.mean() < 0.7
    assert RATIO[0] - 0.02 <= ratio.min() and ratio.max() <= RATIO[1] + 0.02
    state = torch.Generator().manual_seed(5).get_state()
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.set_state(state)
        a = [Augment(12, True, (0.2, 1.0), 12)(30, 40) for _ in range(3)]
        torch.default_generator.set_state(state)
        b = [Augment(12, True, (0.2, 1.0), 12)(30, 40) for _ in range(3)]
    assert a == b and len(set(a)) == 3
    assert center_box(375, 500, 224, 256) == (23, 86, 328, 328) and center_box(20, 30, 12, 12) == (0, 5, 20, 20)


def _images(channels: int, device) -> list[torch.Tensor]:
    rng = np.random.default_rng(3)
    return [torch.from_numpy(rng.integers(0, 256, (channels, h, w), dtype=np.uint8)).to(device)
            for h, w in [(17, 23), (30, 11), (9, 9), (40, 50)]]


BOXES = torch.tensor([[0, 0, 17, 23], [3, 2, 20, 7], [4, 4, 1, 1], [5, 10, 33, 31]])  # down, tall, 1 px, down
FLIPS = torch.tensor([False, True, False, True])


@pytest.mark.parametrize("channels", [3, 1])
def test_resized_crop_kernel_matches_the_reference(channels, device):
    """The Triton kernel (the CPU interpreter here, CUDA on the GPU machine) against PyTorch's antialiased
    interpolation of each box: downscaling, upscaling, flips, a 1-pixel box, fp32 and bf16, NCHW and NHWC."""
    images = _images(channels, device)
    norm = normalisation(MEAN[:channels], STD[:channels])
    ref = resized_crop_reference([im.cpu() for im in images], BOXES, FLIPS, 8, norm)
    out = resized_crop(images, BOXES, FLIPS, 8, norm, backend="triton")
    assert out.shape == (4, channels, 8, 8) and out.device.type == device.type
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    half = resized_crop(images, BOXES, FLIPS, 8, norm, torch.bfloat16, torch.channels_last, backend="triton")
    assert half.dtype == torch.bfloat16 and half.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(half.cpu().float(), ref, rtol=1e-2, atol=2e-2)
    # the reference is torchvision's resized crop of the box (float), then normalisation
    from torchvision.transforms.v2 import functional as TF

    top, left, h, w = BOXES[1].tolist()
    tv = TF.horizontal_flip(TF.resized_crop(images[1].cpu().float(), top, left, h, w, [8, 8], antialias=True))
    torch.testing.assert_close(ref[1], tv * norm[:, :1, None] + norm[:, 1:, None], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"box \(5, 10, 33, 41\) of image 3 lies outside its 40x50 pixels"):
        resized_crop(images, torch.tensor([[0, 0, 1, 1]] * 3 + [[5, 10, 33, 41]]), FLIPS, 8, norm, backend="torch")


# ------------------------------------------------------------------------------------------ the datamodule's paths


def test_cpu_and_device_paths_draw_the_same_boxes_and_agree_on_pixels(tmp_path):
    root = make_folder(tmp_path)
    dms = modules(root)
    cpu, gpu = dms["cpu"], dms["gpu"]
    assert (cpu.path, gpu.path) == ("cpu", "gpu")
    for split in ("train", "val"):
        lc, lg = getattr(cpu, f"{split}_dataloader")(), getattr(gpu, f"{split}_dataloader")()
        if split == "train":
            lc.sampler.set_epoch(3)
            lg.sampler.set_epoch(3)
            order = lg.sampler.shard(3)
        n = 0
        for (xc, yc), batch in zip(lc, lg):
            if split == "train":  # each box and flip is the one drawn from (seed, epoch, index)
                for k, index in enumerate(order[n:n + len(batch)]):
                    path = gpu.train_set.dataset.samples[gpu.train_set.indices[index]][0]
                    with Image.open(path) as im:
                        h, w = im.height, im.width
                    with torch.random.fork_rng(devices=[]):
                        torch.default_generator.manual_seed(derive_seed(7, 3, index))
                        box, flip = Augment(12, True, (0.2, 1.0), 12)(h, w)
                    assert tuple(batch.boxes[k].tolist()) == box and bool(batch.flips[k]) == flip
            xg, yg = decoded(gpu, batch)
            n += len(batch)
            assert torch.equal(yc, yg) and xg.shape == xc.shape == (len(yc), 3, 12, 12)
            diff = (xc - xg).abs()  # normalised units: 0.02 is about one grey level
            assert diff.mean() < 0.02 and diff.max() < 0.25, (split, diff.mean(), diff.max())
        assert n == len(getattr(gpu, f"{split}_set"))
    stats = gpu.decoder.stats
    assert stats["images"] == 15 and stats["progressive JPEG"] == 1 and stats["CMYK JPEG"] == 1
    assert stats["not a JPEG"] == 1 and "3 of them decoded on the CPU" in gpu.decoder.summary()


def test_device_path_resumes_mid_epoch_with_the_same_batches(tmp_path):
    dm = modules(make_folder(tmp_path, n=8, odd=False), decodes=("gpu",), batch_size=3)["gpu"]
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(2)
    full = [decoded(dm, b) for b in loader]
    taken = {"n": 2}
    loader.progress = lambda: (taken["n"], len(full))
    state = loader.state_dict()
    fresh = modules(tmp_path, decodes=("gpu",), batch_size=3)["gpu"].train_dataloader()
    fresh.load_state_dict(state)
    rest = [decoded(dm, b) for b in fresh]
    assert len(rest) == len(full) - 2
    for (xa, ya), (xb, yb) in zip(full[2:], rest):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_decoding_ahead_gives_the_same_batches(tmp_path):
    """With a trainer, the training loader starts decoding each batch in a background thread as it arrives;
    the hook then hands over the finished batch: the same tensors as decoding in the loop."""
    from types import SimpleNamespace

    dm = modules(make_folder(tmp_path, n=5), decodes=("gpu",))["gpu"]
    plain = [decoded(dm, b) for b in dm.train_dataloader()]
    dm.trainer = SimpleNamespace(precision="32-true", strategy=SimpleNamespace(root_device=torch.device("cpu")))
    loader = dm.train_dataloader()
    assert loader.wrap is not None
    batches = list(loader)  # all submitted before any is consumed
    assert all(b.pending is not None for b in batches)
    ahead = [decoded(dm, b) for b in batches]
    assert len(ahead) == len(plain)
    for (xa, ya), (xb, yb) in zip(plain, ahead):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    dm.teardown("fit")
    assert dm._ahead is None


def test_decoding_ahead_beside_another_loader_draws_the_same_boxes(tmp_path):
    """The fetch thread reads the training items while the loop's thread reads others (another loader's, as the
    GPU test below does with the CPU path's): every batch's boxes and flips are those drawn with no other thread
    reading. Both read items seeded per (seed, epoch, index); drawn from torch's one global generator, one
    thread's seeding came between the other's seeding and its draw."""
    from types import SimpleNamespace

    dms = modules(make_folder(tmp_path, n=12), image_size=24, batch_size=4)
    cpu, gpu = dms["cpu"], dms["gpu"]

    def draws(loader, epoch: int) -> list:
        loader.sampler.set_epoch(epoch)
        return [(b.boxes.tolist(), b.flips.tolist()) for b in loader]

    alone = [draws(gpu.train_dataloader(), epoch) for epoch in range(3)]
    gpu.trainer = SimpleNamespace(precision="32-true", strategy=SimpleNamespace(root_device=torch.device("cpu")))
    for epoch in range(3):
        lc, lg = cpu.train_dataloader(), gpu.train_dataloader()
        assert lg.wrap is not None
        lc.sampler.set_epoch(epoch)
        lg.sampler.set_epoch(epoch)
        got = []
        for _, batch in zip(lc, lg):
            got.append((batch.boxes.tolist(), batch.flips.tolist()))
            gpu.on_after_batch_transfer(batch, 0)
        assert got == alone[epoch], epoch
    gpu.teardown("fit")


def test_fetching_ahead_keeps_order_and_raises_in_the_loop():
    """The fetch thread passes every batch on in order, runs at most ``depth`` batches ahead, raises a
    loader's error in the loop at the batch where it occurred, and stops (closing the loader's iterator)
    when the loop stops taking batches."""
    import threading

    ahead = DecodeAhead(DeviceDecoder(8, 3, MEAN, STD), torch.device("cpu"), depth=2)
    assert list(ahead.wrap(iter(range(7)))) == list(range(7))

    taken, closed = [], threading.Event()

    def source():
        try:
            for i in range(100):
                taken.append(i)
                yield i
        finally:
            closed.set()

    it = ahead.wrap(source())
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert closed.is_set() and len(taken) <= 3 + 2 + 1  # the loop's 3, the queue's 2, one blocked in put

    def broken():
        yield 0
        yield 1
        raise BadDataError("image 2 is broken")

    got = []
    with pytest.raises(BadDataError, match="image 2 is broken"):
        for b in ahead.wrap(broken()):
            got.append(b)
    assert got == [0, 1] and not ahead._stops
    ahead.close()


def test_batches_from_loader_processes_are_the_same(tmp_path):
    """Batches made in two loader processes (the per-image arrays travel inside the pickle, the encoded bytes
    in shared memory) decode to the same tensors as batches made in this process."""
    root = make_folder(tmp_path, n=5)
    here_dm = modules(root, decodes=("gpu",))["gpu"]
    here = [decoded(here_dm, b) for b in here_dm.train_dataloader()]
    there_dm = modules(root, decodes=("gpu",), num_workers=2)["gpu"]
    batches = list(there_dm.train_dataloader())
    assert all(b.boxes.dtype == torch.int64 and b.flips.dtype == torch.bool and b.pending is None for b in batches)
    there = [decoded(there_dm, b) for b in batches]
    assert len(here) == len(there)
    for (xa, ya), (xb, yb) in zip(here, there):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_device_path_shards_epochs_over_processes(tmp_path, monkeypatch):
    import snntrain.data.common as common

    root = make_folder(tmp_path, n=7, odd=False)  # 14 images: 10 for training, 5 per process
    single = modules(root, decodes=("gpu",))["gpu"].train_dataloader()
    single.sampler.set_epoch(1)
    boxes = {}
    for batch in single:
        for path, box in zip(batch.paths, batch.boxes.tolist()):
            boxes[path] = box
    seen = []
    for rank in (0, 1):
        monkeypatch.setattr(common, "process_group_shape", lambda r=rank: (2, r))
        loader = modules(root, decodes=("gpu",))["gpu"].train_dataloader()
        loader.sampler.set_epoch(1)
        mine = [(p, b) for batch in loader for p, b in zip(batch.paths, batch.boxes.tolist())]
        assert len(mine) == 5 and all(boxes[p] == b for p, b in mine)  # the same augmentation as one process
        seen += [p for p, _ in mine]
    assert sorted(seen) == sorted(boxes)  # the two processes together read the epoch once


def test_device_batches_follow_the_trainer_precision_and_layout(tmp_path):
    from types import SimpleNamespace

    dm = modules(make_folder(tmp_path, n=3, odd=False), decodes=("gpu",), dtype="auto", channels_last=True)["gpu"]
    dm.trainer = SimpleNamespace(precision="bf16-mixed", strategy=SimpleNamespace(root_device=torch.device("cpu")))
    dm.decoder = None  # rebuilt for this trainer at the next batch
    x, _ = decoded(dm, next(iter(dm.train_dataloader())))
    assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="dtype='half' is not valid; choose one of auto, float32, bfloat16"):
        modules(tmp_path, decodes=("gpu",), dtype="half")
    with pytest.raises(ValueError, match="decode='nvjpeg' is not valid; choose one of auto, cpu, gpu, dali"):
        modules(tmp_path, decodes=("nvjpeg",))
    with pytest.raises(ValueError, match=r"crop_scale=\[0.5, 1.5\] must be two numbers"):
        modules(tmp_path, decodes=("cpu",), crop_scale=[0.5, 1.5])
    with pytest.raises(ValueError, match="val_resize=8 must be at least image_size=12"):
        modules(tmp_path, decodes=("cpu",), val_resize=8)


def test_a_torchvision_that_cannot_decode_on_the_gpu(tmp_path, monkeypatch, caplog):
    """decode=auto falls back to the CPU path with a warning; decode=gpu stops with the advice."""
    from types import SimpleNamespace

    root = make_folder(tmp_path, n=2, odd=False)

    def broken(parts, channels, device):
        raise RuntimeError("decode_jpegs_cuda: torchvision not compiled with nvJPEG support")

    monkeypatch.setattr(dd, "_decode_jpeg", broken)
    cuda = SimpleNamespace(precision="32-true", strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    for decode in ("auto", "gpu"):
        dm = build_datamodule({"name": "image_folder", "root": str(root), "decode": decode}, seed=0)
        dm.trainer = cuda
        if decode == "gpu":
            with pytest.raises(RuntimeError, match=r"data.decode=gpu: torchvision cannot decode JPEGs on cuda:0 "
                                                   r"\(.*nvJPEG support\); use data.decode=cpu"):
                dm.setup("fit")
        else:
            dm.setup("fit")
            assert dm.path == "cpu" and "torchvision cannot decode JPEGs on cuda:0" in caplog.text
    monkeypatch.undo()
    dd.check_nvjpeg(torch.device("cpu"))  # the real decoder passes the check


def test_truncated_file_is_named_and_a_refused_batch_is_decoded_file_by_file(tmp_path, monkeypatch, caplog):
    root = make_folder(tmp_path, n=3, odd=False)
    bad = root / "b" / "1.jpg"
    bad.write_bytes(bad.read_bytes()[:-60])
    dm = modules(root, decodes=("gpu",), val_fraction=0.5)["gpu"]
    with pytest.raises(BadDataError, match=rf"image {bad} cannot be read"):
        for loader in (dm.train_dataloader(), dm.val_dataloader()):
            for batch in loader:
                decoded(dm, batch)
    bad.unlink()

    # nvJPEG refusing a batch: each file again alone; the one it refuses comes from PIL, counted
    dm = modules(root, decodes=("gpu",), val_fraction=0.5)["gpu"]
    refused = Path(dm.train_set.dataset.samples[dm.train_set.indices[0]][0])
    tail = refused.read_bytes()[-200:]
    real = dd._decode_jpeg

    def picky(parts, channels, device):
        if any(bytes(p[-200:].numpy()) == tail for p in parts):
            raise RuntimeError("Error while decoding JPEG images: simulated")
        return real(parts, channels, device)

    monkeypatch.setattr(dd, "_decode_jpeg", picky)
    n = sum(len(decoded(dm, b)[1]) for b in dm.train_dataloader())
    assert dm.decoder.stats["rejected by nvJPEG"] == 1 and n == len(dm.train_set)
    assert f"{refused} (rejected by nvJPEG) is decoded on the CPU" in caplog.text


def test_dali_path_needs_the_extra_and_matches_the_cpu_path(tmp_path, monkeypatch):
    root = make_folder(tmp_path, n=3)
    with monkeypatch.context() as m:
        m.setattr("snntrain.data.image_folder.dali_available", lambda: False)
        with pytest.raises(RuntimeError, match=r'needs NVIDIA DALI.*pip install "\.\[dali\]".*nvidia-dali-cuda130'):
            modules(root, decodes=("dali",))
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (the optional dali extra)")
    dms = modules(root, decodes=("cpu", "dali"))
    for split in ("train", "val"):
        for (xc, yc), batch in zip(getattr(dms["cpu"], f"{split}_dataloader")(),
                                   getattr(dms["dali"], f"{split}_dataloader")()):
            assert not batch.pixels  # DALI decodes PNG, progressive and CMYK JPEGs itself
            xd, yd = decoded(dms["dali"], batch)
            assert torch.equal(yc, yd)
            diff = (xc - xd).abs()
            assert diff.mean() < 0.03 and diff.max() < 0.5, (split, diff.mean(), diff.max())


@pytest.mark.gpu
def test_nvjpeg_path_on_the_gpu_matches_the_cpu_path(tmp_path):
    """On CUDA: nvJPEG, the kernel, decoding ahead on a background thread and the hand-over between streams,
    with a long step queued on the current stream after every batch (as in training), against the CPU path."""
    from types import SimpleNamespace

    dms = modules(make_folder(tmp_path, n=12), image_size=24, batch_size=4)
    dev = torch.device("cuda")
    gpu = dms["gpu"]
    gpu.trainer = SimpleNamespace(precision="32-true", strategy=SimpleNamespace(root_device=dev))
    gpu.decoder = None  # rebuilt for this trainer: channels-last float32 on CUDA
    busy = torch.randn(2048, 2048, device=dev)
    got, want = [], []
    for epoch in (0, 1):
        lc, lg = dms["cpu"].train_dataloader(), gpu.train_dataloader()
        assert lg.wrap is not None
        lc.sampler.set_epoch(epoch)
        lg.sampler.set_epoch(epoch)
        for (xc, yc), batch in zip(lc, lg):
            got.append(gpu.on_after_batch_transfer(batch.to(dev), 0))
            want.append((xc, yc))
            for _ in range(10):  # a step in flight while the next batches are decoded
                busy = torch.tanh(busy @ busy)
    for (xc, yc), batch in zip(dms["cpu"].val_dataloader(), gpu.val_dataloader()):
        got.append(gpu.on_after_batch_transfer(batch.to(dev), 0))
        want.append((xc, yc))
    assert len(got) == 2 * -(-len(gpu.train_set) // 4) + -(-len(gpu.val_set) // 4)
    for i, ((xg, yg), (xc, yc)) in enumerate(zip(got, want)):
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last) and torch.equal(yc, yg.cpu())
        # nvJPEG against libjpeg-turbo (IDCT and chroma upsampling differ): a few grey levels on average, in
        # normalised units (H100, torchvision 0.26: mean 0.051, max 0.38)
        diff = (xc - xg.cpu()).abs()
        per_image = [round(float(d), 3) for d in diff.flatten(1).mean(1)]  # one wrong image stands out here
        assert diff.mean() < 0.08 and diff.max() < 0.6, (f"batch {i}", diff.mean(), diff.max(), per_image)
    stats = gpu.decoder.stats
    assert stats["progressive JPEG"] >= 1 and stats["CMYK JPEG"] >= 1 and stats["not a JPEG"] >= 1
    gpu.teardown("fit")


def test_decoder_settings_are_checked():
    with pytest.raises(ValueError, match="data.decode engine='pil' is not valid; choose one of nvjpeg, dali"):
        DeviceDecoder(8, 3, MEAN, STD, engine="pil")
    with pytest.raises(ValueError, match="need one value per channel"):
        DeviceDecoder(8, 1, MEAN, STD)


# ------------------------------------------------------------------------------------------ training


@pytest.mark.slow
def test_training_from_jpegs_on_both_paths(tmp_path, caplog):
    """A short run per path on the same folder: validation accuracy within noise, and the device path's
    CPU-decoded images counted in the log (its hooks also feed precise batch norm)."""
    import logging

    from hydra import compose, initialize_config_module

    from snntrain.cli import train

    root = tmp_path / "images"
    for c, cls in enumerate(("dark", "light")):
        (root / cls).mkdir(parents=True)
        for i in range(16):
            img = (picture(20, 24, 100 * c + i).astype(np.float32) * 0.4 + 140 * c).clip(0, 255).astype(np.uint8)
            (root / cls / f"{i}.jpg").write_bytes(encode(img, quality=90, progressive=i == 0))
    acc = {}
    caplog.set_level(logging.INFO, logger="snntrain")
    for decode in ("cpu", "gpu"):
        with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=[
                "data=image_folder", f"data.root={root}", f"data.decode={decode}", "data.image_size=12",
                "data.batch_size=8", "data.num_workers=0", "backend=torch", "T=2", "model.width=4",
                "trainer.accelerator=cpu", "trainer.max_epochs=2", "trainer.enable_progress_bar=false", "logger=none",
                "callbacks.precise_bn.num_batches=2", "callbacks.checkpoint.every_n_minutes=null", f"paths.output_dir={tmp_path / decode}"])
        acc[decode] = train(cfg)["val/acc"]
    assert abs(acc["cpu"] - acc["gpu"]) <= 0.34, acc  # 6 validation images: within two of them
    assert "of them decoded on the CPU instead of by nvjpeg (progressive JPEG: " in caplog.text
