"""Event-camera data: the simulated DVS digits, framing through tonic, the frame cache, augmentation,
time-first batches, the tonic datasets' missing-data errors, and a short training run through the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from snntrain.data import build_datamodule
from snntrain.data.digits_dvs import DigitsDVS, DigitsDVSDataModule
from snntrain.data.events import (
    CIFAR10DVSDataModule,
    DVSGestureDataModule,
    EventFrames,
    FrameAugment,
    NCaltech101DataModule,
    NMNISTDataModule,
    collate_time_first,
    frame_transform,
)


@pytest.fixture(scope="module")
def dvs() -> DigitsDVS:
    return DigitsDVS(seed=3)


def test_recordings_are_tonic_events_and_deterministic(dvs):
    events, label = dvs[5]
    assert events.dtype.names == ("x", "y", "t", "p") and label == int(dvs.targets[5])
    w, h, p = dvs.sensor_size
    assert (w, h, p) == (16, 16, 2)
    assert events["x"].min() >= 0 and events["x"].max() < w and events["y"].min() >= 0 and events["y"].max() < h
    assert set(np.unique(events["p"])) == {0, 1}
    assert np.all(np.diff(events["t"]) >= 0) and events["t"].max() < 3 * dvs.saccade_ms * 1000
    # a pure function of (seed, index): alone, in a block, in another instance; another seed differs
    assert np.array_equal(dvs.record(5), events)
    assert np.array_equal(DigitsDVS(seed=3).record_many([4, 5])[1], events)
    assert not np.array_equal(DigitsDVS(seed=4).record(5), events)
    # the digit's edges fire: far more events than the background noise alone would give
    assert len(events) > 20 * dvs.noise_rate * w * h * 0.3


def test_tonic_transforms_apply(dvs):
    import tonic.transforms as tt

    events, _ = dvs[0]
    dropped = tt.DropEvent(p=0.5)(events)
    assert 0.3 * len(events) < len(dropped) < 0.7 * len(events)
    assert len(tt.Denoise(filter_time=1000)(events)) < len(events)


@pytest.mark.parametrize("split", ["time", "number"])
def test_frames_shape_dtype_and_counts(dvs, split):
    events, _ = dvs[1]
    frames = frame_transform(dvs.sensor_size, 5, split)(events)
    assert frames.shape == (5, 2, 16, 16) and frames.dtype == np.float32
    assert len(events) - 1 <= frames.sum() <= len(events)  # every event in one bin (tonic may drop the last)
    per_bin = frames.sum(axis=(1, 2, 3))
    if split == "number":
        assert per_bin.max() - per_bin.min() <= 1
    on = frames[:, 1].sum()
    assert (events["p"] == 1).sum() - 1 <= on <= (events["p"] == 1).sum()
    small = frame_transform(dvs.sensor_size, 3, "time", image_size=8)(events)
    assert small.shape == (3, 2, 8, 8) and len(events) - 1 <= small.sum() <= len(events)
    empty = frame_transform(dvs.sensor_size, 3)(events[:0])
    assert empty.shape == (3, 2, 16, 16) and not empty.any()


def test_frame_values(dvs):
    events, _ = dvs[1]
    counts = frame_transform(dvs.sensor_size, 4)(events)
    assert counts.max() > 1  # several events of a pixel in one bin
    log = frame_transform(dvs.sensor_size, 4, values="log")(events)
    binary = frame_transform(dvs.sensor_size, 4, values="binary")(events)
    assert log.dtype == binary.dtype == np.float32
    np.testing.assert_allclose(log, np.log1p(counts), rtol=1e-6)
    assert set(np.unique(binary)) == {0.0, 1.0} and np.array_equal(binary > 0, counts > 0)
    with pytest.raises(ValueError, match="frame_values='bits' is not valid; choose one of count, log, binary"):
        frame_transform(dvs.sensor_size, 4, values="bits")


def test_frame_cache_and_memory(dvs, tmp_path):
    from snntrain.data.digits_dvs import _Indexed

    subset = _Indexed(dvs, np.arange(6))
    frames = EventFrames(subset, frame_transform(dvs.sensor_size, 4), tmp_path / "c")
    assert frames.missing() == list(range(6))
    assert frames.fill_cache() == 6 and frames.missing() == [] and frames.fill_cache() == 0
    x, y = frames[2]
    assert x.shape == (4, 2, 16, 16) and x.dtype == torch.float32 and y == int(dvs.targets[2])
    # read back from disk, not rebuilt: a broken frame builder is never called
    cached = EventFrames(subset, lambda ev: 1 / 0, tmp_path / "c")
    assert torch.equal(cached[2][0], x)
    # a file cut short (a crash while writing) is rebuilt
    (tmp_path / "c" / "3.npz").write_bytes(b"PK\x03\x04 truncated")
    rebuilt = EventFrames(subset, frame_transform(dvs.sensor_size, 4), tmp_path / "c")
    assert torch.equal(rebuilt[3][0], frames[3][0])


def test_augment_and_time_first_batches():
    x = torch.arange(2 * 2 * 4 * 4, dtype=torch.float32).view(2, 2, 4, 4)
    torch.manual_seed(0)
    flipped = FrameAugment(flip=1.0)(x)
    assert torch.equal(flipped, x.flip(-1))
    shifted = FrameAugment(flip=0.0, crop_padding=1)(x)
    assert shifted.shape == x.shape and shifted.sum() <= x.sum()
    frames, labels = collate_time_first([(x, 1), (x + 1, 2), (x + 2, 3)])
    assert frames.shape == (2, 3, 2, 4, 4) and torch.equal(frames[:, 1], x + 1) and labels.tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="flip=1.5"):
        FrameAugment(flip=1.5)
    with pytest.raises(ValueError, match="crop_padding=-1"):
        FrameAugment(crop_padding=-1)


@pytest.fixture(scope="module")
def digits_dm(tmp_path_factory) -> DigitsDVSDataModule:
    dm = build_datamodule({"name": "digits_dvs", "root": str(tmp_path_factory.mktemp("dvs")), "T": 3,
                           "batch_size": 16, "num_classes": 10, "in_channels": 2, "image_size": 16,
                           "max_recordings": 300}, seed=0)
    dm.setup("fit")
    return dm


def test_digits_dvs_datamodule(digits_dm):
    dm = digits_dm
    assert len(dm.train_set) + len(dm.val_set) == 300 and len(dm.val_set) == 60
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (3, 16, 2, 16, 16) and x.dtype == torch.float32 and y.shape == (16,) and y.dtype == torch.long
    xv, _ = next(iter(dm.val_dataloader()))
    assert xv.shape == (3, 16, 2, 16, 16)
    cache = dm.cache_dir("train")
    assert len(list(cache.glob("*.npz"))) == len(dm.train_set)
    # frames for another T (or split) live in another folder: no stale frames
    other = DigitsDVSDataModule(root=str(dm.root), T=4, max_recordings=300)
    assert other.cache_dir("train") != cache and other.frame_shape == (4, 2, 16, 16)


def test_event_level_augmentation_bypasses_cache(digits_dm):
    dm = DigitsDVSDataModule(root=str(digits_dm.root), T=3, drop_event=0.3, time_jitter_us=100.0, max_recordings=300)
    dm.setup("fit")
    assert dm.train_set.cache_dir is None and dm.val_set.cache_dir is not None
    torch.manual_seed(0)
    np.random.seed(0)
    a, b = dm.train_set[0][0], dm.train_set[0][0]
    assert a.shape == (3, 2, 16, 16) and not torch.equal(a, b)  # drawn anew on every access


def test_event_training_loader_resumes_exactly(digits_dm):
    """The training loader is the resumable one: order and tonic's event augmentation (NumPy's random
    state) depend only on (seed, epoch, position), so a resumed run sees the same batches."""
    from snntrain.data.common import ResumableLoader

    def loader():
        dm = DigitsDVSDataModule(root=str(digits_dm.root), T=3, drop_event=0.3, time_jitter_us=100.0,
                                 max_recordings=300, batch_size=16, seed=5)
        dm.setup("fit")
        return dm.train_dataloader()

    first = loader()
    assert isinstance(first, ResumableLoader)
    np.random.seed(1)
    torch.manual_seed(1)
    batches = [batch for batch, _ in zip(first, range(3))]
    assert np.array_equal(np.random.get_state()[1], np.random.RandomState(1).get_state()[1])  # left as it was
    resumed = loader()
    resumed.load_state_dict({**first.state_dict(), "epoch": 0, "batches_done": 2})
    np.random.seed(2)  # other global states: the same batches all the same
    x, y = next(iter(resumed))
    assert torch.equal(x, batches[2][0])
    assert torch.equal(y, batches[2][1])


@pytest.mark.parametrize("cls,files", [
    (NMNISTDataModule, "train.zip"), (DVSGestureDataModule, "ibmGestureTrain.tar.gz"),
    (CIFAR10DVSDataModule, "CIFAR10DVS.zip"), (NCaltech101DataModule, "Caltech101.zip"),
])
def test_missing_dataset_names_folder_and_files(cls, files, tmp_path):
    dm = cls(root=str(tmp_path), download=False, T=4)
    with pytest.raises(RuntimeError) as err:
        dm.setup("fit")
    msg = str(err.value)
    assert str(tmp_path / cls.tonic_name) in msg and files in msg and "download=false" in msg
    assert not (tmp_path / cls.tonic_name).exists() or not any((tmp_path / cls.tonic_name).iterdir())


def test_tonic_datasets_build_from_config():
    for name, classes, frame in [("nmnist", 10, (8, 2, 34, 34)), ("dvs_gesture", 11, (8, 2, 128, 128)),
                                 ("cifar10_dvs", 10, (8, 2, 64, 64)), ("ncaltech101", 101, (8, 2, 180, 240))]:
        size = {"cifar10_dvs": 64, "ncaltech101": None}.get(name, frame[-1])
        dm = build_datamodule({"name": name, "root": "unused", "T": 8, "image_size": size, "download": False})
        assert dm.num_classes == classes == len(dm.classes) and dm.frame_shape == frame
    with pytest.raises(ValueError, match="frame_split='bins'"):
        build_datamodule({"name": "nmnist", "frame_split": "bins"})
    with pytest.raises(ValueError, match="frame_values='raw'"):
        build_datamodule({"name": "dvs_gesture", "frame_values": "raw"})
    # the frame values name the cache: frames of one setting are never read as another's
    a, b = (build_datamodule({"name": "nmnist", "root": "unused", "download": False, "frame_values": v})
            for v in ("count", "binary"))
    assert a.cache_dir("train") != b.cache_dir("train")


@pytest.mark.slow
def test_cli_trains_on_offline_events_and_exports_nir(tmp_path, compose_run):
    """A short run through the CLI on data=digits_dvs at T=3, then task=export to NIR from its checkpoint: the
    export records the T the model trained with (the data's frames)."""
    import nir

    from snntrain import load_nir
    from snntrain.cli import run

    common = ["debug=tiny", f"paths.data_dir={tmp_path / 'data'}"]
    out = tmp_path / "run"
    run(compose_run(out, *common, "data=digits_dvs", "T=3"))
    ckpt = out / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    config = torch.load(ckpt, map_location="cpu", weights_only=True)["hyper_parameters"]["config"]
    assert config["data"]["T"] == config["model"]["T"] == 3
    export_dir = tmp_path / "export"
    run(compose_run(tmp_path / "exp", *common, "task=export", f"ckpt_path={ckpt}", f"export.dir={export_dir}",
                    "export.formats=[nir]"))
    graph = nir.read(str(export_dir / "model.nir"))
    assert graph.metadata["T"] == 3 and list(graph.nodes["input"].input_type["input"]) == [2, 16, 16]
    import json

    card = json.loads((export_dir / "model_card.json").read_text())
    assert card["nir_max_abs_diff"] < 1e-4 and "model.nir" in card["files"] and card["T"] == 3
    net = load_nir(export_dir / "model.nir")
    assert net(torch.zeros(2, 3, 2, 16, 16)).shape == (3, 10)


@pytest.mark.parametrize("preset,data,classes", [("dvs_gesture_sew", "dvs_gesture", 11),
                                                 ("cifar10_dvs_sew", "cifar10_dvs", 10)])
def test_sew_event_presets(preset, data, classes, tmp_path):
    """The SEW-ResNet paper's event settings: T=16 frames by event count, PLIF, ADD; the model builds."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from snntrain.models import build_model

    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={preset}", f"paths.output_dir={tmp_path}"])
    c = OmegaConf.to_container(cfg.data, resolve=True)
    assert cfg.T == 16 and c["T"] == 16 and c["name"] == data and c["frame_split"] == "number"
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    assert model_cfg["T"] == 16 and model_cfg["num_classes"] == classes and model_cfg["in_channels"] == 2
    model = build_model(model_cfg, backend="torch")
    assert type(model.sn1.neuron).__name__ == "PLIF" and model.layer1[0].connect == "ADD"
    dm = build_datamodule(c)
    assert dm.frame_shape == (16, 2, 128, 128)
