"""Event-camera datasets as multi-step frames, through tonic.

An event stream (a structured numpy array with fields ``x``, ``y``, ``t`` in µs and
``p`` in {0, 1}, tonic's format) becomes ``[T, 2, H, W]`` float32 frames of event
counts: tonic's ``ToFrame`` splits the recording into T bins of equal duration
(``frame_split: time``) or of equal event count (``frame_split: number``, SpikingJelly's
``split_by='number'``, which the SEW-ResNet paper used). Optionally tonic's ``Denoise``
runs first, and ``Downsample`` shrinks the sensor to ``image_size``.

Frames are cached to disk in a first pass before training (one compressed ``.npz`` per
sample; small splits also stay in memory) in a folder named by a hash of everything that shapes a
frame, so a changed T or split never reads stale frames. Batches are time-first:
``[T, B, 2, H, W]``, the layout the models take.

Augmentation (training split only): on the frames (after the cache), a horizontal flip
and a random crop of a zero-padded frame, the same for all T steps; on the events,
through tonic, ``DropEvent`` and ``TimeJitter``. Event-level augmentation is drawn
anew for every access, so with it the training frames are built on the fly (no cache).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from ..errors import UnavailableError
from ..validation import number, one_of
from .common import (
    check_fraction,
    check_num_workers,
    eval_loader,
    loader_workers,
    positive_int,
    split_indices,
    train_loader,
)

log = logging.getLogger(__name__)

FRAME_SPLITS = ("time", "number")
#: What a frame pixel holds: the events of its bin (tonic's ``ToFrame``), their log(1 + count), or 1 if any.
FRAME_VALUES = ("count", "log", "binary")
#: Bump when the frame pipeline changes meaning, so old caches are not reused.
CACHE_VERSION = 1
#: A split whose frames take at most this many bytes is also kept in memory once read.
MEMORY_CACHE_BYTES = 256 * 2**20


def _nonneg(name: str, value: object, upper: float | None = None) -> float:
    v = number(name, value)
    if v < 0 or (upper is not None and v > upper):
        bound = f"between 0 and {upper}" if upper is not None else ">= 0"
        raise ValueError(f"{name}={value!r} must be {bound}")
    return v


def frame_transform(sensor_size: Sequence[int], T: int, frame_split: str = "time", denoise_us: float | None = None,
                    image_size: int | None = None, event_transforms: Sequence[Callable] = (),
                    values: str = "count") -> Callable:
    """Events -> ``[T, 2, H, W]`` float32 frames: tonic transforms, then ``ToFrame`` with T bins.

    ``sensor_size`` is tonic's ``(W, H, P)``; ``image_size`` (square side, or None for the
    sensor's size) downsamples the events spatially first. ``values`` (:data:`FRAME_VALUES`):
    ``count`` keeps the number of events per pixel and bin, ``log`` is ``log(1 + count)``
    (a pixel that fires many times weighs less against the rest) and ``binary`` is 1 where
    any event fell.
    """
    values = one_of("frame_values", values, FRAME_VALUES)
    import tonic.transforms as tt

    sensor = tuple(int(s) for s in sensor_size)
    steps: list[Callable] = []
    if denoise_us is not None:
        steps.append(tt.Denoise(filter_time=float(denoise_us)))
    steps += list(event_transforms)
    if image_size is not None and (image_size, image_size) != sensor[:2]:
        steps.append(tt.Downsample(spatial_factor=(image_size / sensor[0], image_size / sensor[1])))
        sensor = (image_size, image_size, sensor[2])
    bins = {"n_time_bins": T} if frame_split == "time" else {"n_event_bins": T}
    to_frame = tt.ToFrame(sensor_size=sensor, **bins)
    w, h, p = sensor

    def transform(events: np.ndarray) -> np.ndarray:
        for step in steps:
            events = step(events)
        # events off the (downsampled) sensor are dropped, as a camera would not see them
        keep = (events["x"] >= 0) & (events["x"] < w) & (events["y"] >= 0) & (events["y"] < h)
        events = events[keep]
        if len(events) == 0:  # an empty recording is T empty frames
            return np.zeros((T, p, h, w), np.float32)
        frames = to_frame(events)
        if frames.shape[0] < T:  # fewer events than bins (frame_split=number): pad with empty frames
            frames = np.concatenate([frames, np.zeros((T - frames.shape[0], *frames.shape[1:]), frames.dtype)])
        frames = frames.astype(np.float32)
        if values == "log":
            frames = np.log1p(frames)
        elif values == "binary":
            frames = (frames > 0).astype(np.float32)
        return frames

    return transform


class EventFrames(Dataset):
    """``(frames [T, 2, H, W] float32, label)`` from a tonic-format event dataset.

    With ``cache_dir``, the frames and label of sample ``i`` are kept in ``cache_dir/i.npz`` (compressed,
    written under a temporary name and renamed); :meth:`fill_cache` makes the first pass.
    With ``in_memory``, frames once read stay in memory too. ``frame_augment`` runs on every access.
    """

    def __init__(self, events: Any, to_frames: Callable, cache_dir: Path | None = None,
                 frame_augment: Callable | None = None, label_map: Callable | None = None,
                 in_memory: bool = False) -> None:
        self.events = events
        self.to_frames = to_frames
        self.cache_dir = cache_dir
        self.frame_augment = frame_augment
        self.label_map = label_map
        self.in_memory = in_memory
        self._memory: dict[int, tuple[np.ndarray, Any]] = {}

    def __len__(self) -> int:
        return len(self.events)

    def _path(self, index: int) -> Path:
        return self.cache_dir / f"{index}.npz"

    def _build(self, index: int) -> tuple[np.ndarray, Any]:
        ev, label = self.events[index]
        return self.to_frames(ev), label

    def frames(self, index: int) -> tuple[np.ndarray, Any]:
        """The un-augmented frames and label of sample ``index`` (from the cache when there)."""
        if index in self._memory:
            return self._memory[index]
        if self.cache_dir is None:
            item = self._build(index)
        else:
            path = self._path(index)
            try:
                with np.load(path, allow_pickle=False) as f:
                    item = (f["frames"], f["label"])
            except (FileNotFoundError, OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):  # unreadable: rebuild
                item = self._build(index)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
                np.savez_compressed(tmp, frames=item[0], label=np.asarray(item[1]))
                os.replace(tmp, path)
        if self.in_memory:
            self._memory[index] = item
        return item

    def missing(self) -> list[int]:
        """Indices whose frames are not in the disk cache yet."""
        if self.cache_dir is None:
            return []
        return [i for i in range(len(self)) if not self._path(i).is_file()]

    def fill_cache(self, num_workers: int = 0, desc: str = "frames") -> int:
        """Build and store the frames of every sample not cached yet (in index order, so generators that
        make recordings in blocks stay fast); returns how many were built."""
        todo = self.missing()
        if not todo:
            return 0
        from tqdm.auto import tqdm

        loader = DataLoader(Subset(_CacheFiller(self), todo), batch_size=None, num_workers=num_workers)
        for _ in tqdm(loader, total=len(todo), desc=f"caching {desc}", leave=False):
            pass
        return len(todo)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        frames, label = self.frames(index)
        x = torch.from_numpy(np.array(frames, dtype=np.float32))
        if self.frame_augment is not None:
            x = self.frame_augment(x)
        label = int(np.asarray(label)) if self.label_map is None else self.label_map(label)
        return x, label


class _CacheFiller:
    """Writes one sample's frames to the cache; returns nothing (for :meth:`EventFrames.fill_cache`)."""

    def __init__(self, frames: EventFrames) -> None:
        self.frames = frames

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, index: int) -> int:
        self.frames.frames(index)
        return index


class FrameAugment:
    """Horizontal flip (probability ``flip``) and random crop of a frame padded by ``crop_padding``
    pixels, identical for all T steps of a sample; draws from torch's global generator."""

    def __init__(self, flip: float = 0.5, crop_padding: int = 0) -> None:
        self.flip = _nonneg("flip", flip, 1.0)
        if isinstance(crop_padding, bool) or not isinstance(crop_padding, int) or crop_padding < 0:
            raise ValueError(f"crop_padding={crop_padding!r} must be an integer >= 0")
        self.pad = crop_padding

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, P, H, W]
        if self.flip and float(torch.rand(())) < self.flip:
            x = x.flip(-1)
        if self.pad:
            h, w = x.shape[-2:]
            padded = torch.nn.functional.pad(x, (self.pad,) * 4)
            i, j = (int(v) for v in torch.randint(0, 2 * self.pad + 1, (2,)))
            x = padded[..., i:i + h, j:j + w].contiguous()
        return x


def collate_time_first(batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, B, 2, H, W]`` frames and ``[B]`` labels."""
    frames = torch.stack([b[0] for b in batch], dim=1)
    labels = torch.tensor([b[1] for b in batch], dtype=torch.long)
    return frames, labels


class EventDataModule(L.LightningDataModule):
    """Common parts of the event datamodules: framing, caching, augmentation, loaders.

    A subclass sets ``num_classes``, ``classes``, ``sensor_size`` (tonic's ``(W, H, 2)``)
    and implements :meth:`_splits` (the train and validation event datasets) and
    :meth:`_identity` (what, besides the frame settings, names its cache).

    Args:
        root: where the dataset lives (and the frame cache, under ``root/frames``).
        T: time bins per sample (the model's T).
        frame_split: ``time`` (equal duration) or ``number`` (equal event count) bins.
        frame_values: ``count``, ``log`` or ``binary`` (:func:`frame_transform`).
        denoise_us: tonic ``Denoise`` filter time in µs, or None.
        image_size: square frame side after downsampling the sensor, or None for the sensor's size.
        cache: keep frames on disk after the first pass.
        augment: training augmentation on; then ``flip``, ``crop_padding`` (frames) and
            ``drop_event``, ``time_jitter_us`` (events, via tonic) apply.
    """

    in_channels = 2
    num_classes = 0
    classes: list[str] = []
    sensor_size: tuple[int, int, int] = (0, 0, 2)

    def __init__(
        self,
        root: str = "data",
        T: int = 4,
        frame_split: str = "time",
        frame_values: str = "count",
        denoise_us: float | None = None,
        image_size: int | None = None,
        batch_size: int = 32,
        num_workers: int | str = 0,
        cache: bool = True,
        augment: bool = True,
        flip: float = 0.5,
        crop_padding: int = 0,
        drop_event: float = 0.0,
        time_jitter_us: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.root = Path(root).expanduser()
        self.T = positive_int("T", T)
        self.frame_split = one_of("frame_split", frame_split, FRAME_SPLITS)
        self.frame_values = one_of("frame_values", frame_values, FRAME_VALUES)
        self.denoise_us = None if denoise_us is None else _nonneg("denoise_us", denoise_us)
        self.image_size = None if image_size is None else positive_int("image_size", image_size)
        self.batch_size = positive_int("batch_size", batch_size)
        self.num_workers = check_num_workers(num_workers)
        self.cache = bool(cache)
        self.augment = bool(augment)
        self.frame_augment = FrameAugment(flip, crop_padding) if self.augment else None
        self.drop_event = _nonneg("drop_event", drop_event, 1.0)
        self.time_jitter_us = _nonneg("time_jitter_us", time_jitter_us)
        self.seed = int(seed)
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    # -- for subclasses
    def _splits(self) -> tuple[Any, Any]:
        raise NotImplementedError

    def _identity(self) -> dict[str, Any]:
        return {}

    def _label_map(self) -> Callable | None:
        return None

    # -- shared
    @property
    def frame_shape(self) -> tuple[int, int, int, int]:
        """``(T, 2, H, W)`` of one sample."""
        w, h, p = self.sensor_size
        if self.image_size is not None:
            w = h = self.image_size
        return (self.T, p, h, w)

    def _event_augment(self) -> list[Callable]:
        if not self.augment:
            return []
        import tonic.transforms as tt

        steps: list[Callable] = []
        if self.drop_event > 0:
            steps.append(tt.DropEvent(p=self.drop_event))
        if self.time_jitter_us > 0:
            steps.append(tt.TimeJitter(std=self.time_jitter_us, clip_negative=True, sort_timestamps=True))
        return steps

    def cache_dir(self, split: str) -> Path:
        """The frame cache of ``split``: ``root/frames/<name>-<hash of the frame settings>/<split>``."""
        key = {"version": CACHE_VERSION, "dataset": type(self).__name__, "T": self.T, "frame_split": self.frame_split,
               "frame_values": self.frame_values,
               "denoise_us": self.denoise_us, "image_size": self.image_size, "sensor_size": list(self.sensor_size),
               **self._identity()}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        return self.root / "frames" / f"{type(self).__name__.lower()}-{digest}" / split

    def _framed(self, events: Any, split: str, train: bool) -> EventFrames:
        ev_aug = self._event_augment() if train else []
        to_frames = frame_transform(self.sensor_size, self.T, self.frame_split, self.denoise_us, self.image_size,
                                    ev_aug, self.frame_values)
        cache = self.cache_dir(split) if self.cache and not ev_aug else None
        # small splits (the offline digits) also stay in memory once read
        in_memory = cache is not None and len(events) * np.prod(self.frame_shape) * 4 <= MEMORY_CACHE_BYTES
        return EventFrames(events, to_frames, cache, self.frame_augment if train else None, self._label_map(),
                           in_memory=in_memory)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train, val = self._splits()
        self.train_set = self._framed(train, "train", train=True)
        self.val_set = self._framed(val, "val", train=False)
        for name, split in (("train", self.train_set), ("val", self.val_set)):
            built = split.fill_cache(loader_workers(self), desc=f"{type(self).__name__} {name}")
            if built:
                log.info("snntrain: cached the frames of %d %s recordings in %s", built, name, split.cache_dir)

    def train_dataloader(self) -> DataLoader:
        workers = loader_workers(self)
        return train_loader(self, self.train_set, self.batch_size, self.seed, num_workers=workers,
                            persistent_workers=workers > 0, collate_fn=collate_time_first)

    def val_dataloader(self) -> DataLoader:
        return eval_loader(self, self.val_set, self.batch_size, num_workers=loader_workers(self),
                           collate_fn=collate_time_first)


# ----------------------------------------------------------------------------- recorded datasets


class TonicDataModule(EventDataModule):
    """A recorded dataset from tonic's classes (``tonic_name``), downloaded into ``root`` where allowed.

    ``expected`` describes, for the error when the data is missing, the files to place.
    Datasets without an official test split are split by ``val_fraction`` (deterministic by seed).
    """

    tonic_name = ""
    expected = ""
    has_test_split = True

    def __init__(self, root: str = "data", download: bool = True, val_fraction: float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(root=root, **kwargs)
        self.download = bool(download)
        if val_fraction is None and not self.has_test_split:
            val_fraction = 0.1
        self.val_fraction = None if val_fraction is None else check_fraction("val_fraction", val_fraction)

    @property
    def folder(self) -> Path:
        """Where tonic keeps this dataset: ``root/<tonic class name>``."""
        return self.root / self.tonic_name

    def _missing(self, why: str) -> str:
        return (f"{self.tonic_name} is not in {self.folder} ({why}). Place there {self.expected}; "
                "or point data.root at a folder that holds the "
                f"{self.tonic_name}/ folder.")

    def _open(self, **kwargs: Any) -> Any:
        import tonic.datasets

        cls = getattr(tonic.datasets, self.tonic_name)
        if not self.download:
            def refuse(_self: Any) -> None:
                raise _NotThere()

            # tonic names the dataset folder after the class, so the subclass keeps the name
            cls = type(cls.__name__, (cls,), {"download": refuse})
        try:
            return cls(save_to=str(self.root), **kwargs)
        except _NotThere:
            raise UnavailableError(self._missing("download=false")) from None
        except Exception as err:  # no network, proxy refusal, partial archive...
            raise UnavailableError(self._missing(f"download failed: {type(err).__name__}: {err}")) from err

    def prepare_data(self) -> None:
        self._splits()

    def _splits(self) -> tuple[Any, Any]:
        if self.has_test_split and self.val_fraction is None:
            return self._open(train=True), self._open(train=False)
        full = self._open(train=True) if self.has_test_split else self._open()
        train_idx, val_idx = split_indices(len(full), self.val_fraction, self.seed)
        return Subset(full, train_idx), Subset(full, val_idx)

    def _identity(self) -> dict[str, Any]:
        return {"val_fraction": self.val_fraction, "seed": self.seed if self.val_fraction is not None else None}


class _NotThere(Exception):
    pass


class NMNISTDataModule(TonicDataModule):
    """N-MNIST (Orchard et al. 2015): MNIST digits recorded by an ATIS camera in three saccades, 34x34."""

    tonic_name = "NMNIST"
    num_classes = 10
    classes = [str(i) for i in range(10)]
    sensor_size = (34, 34, 2)
    expected = ("train.zip and test.zip (https://www.garrickorchard.com/datasets/n-mnist) and their contents "
                "extracted beside them: Train/<digit>/*.bin and Test/<digit>/*.bin")


class DVSGestureDataModule(TonicDataModule):
    """DVS128 Gesture (Amir et al. 2017): 11 hand and arm gestures, 128x128 DVS recordings."""

    tonic_name = "DVSGesture"
    num_classes = 11
    classes = ["hand clapping", "right hand wave", "left hand wave", "right arm cw", "right arm ccw", "left arm cw",
               "left arm ccw", "arm roll", "air drums", "air guitar", "other gestures"]
    sensor_size = (128, 128, 2)
    expected = ("ibmGestureTrain.tar.gz and ibmGestureTest.tar.gz (tonic's preprocessed DVS128 Gesture) and their "
                "contents extracted beside them: ibmGestureTrain/user*/<class>.npy and ibmGestureTest/user*/<class>.npy")


class CIFAR10DVSDataModule(TonicDataModule):
    """CIFAR10-DVS (Li et al. 2017): 10,000 CIFAR-10 images recorded by a DVS, 128x128; no official
    test split, so ``val_fraction`` (default 0.1) is held out, deterministic by seed."""

    tonic_name = "CIFAR10DVS"
    has_test_split = False
    num_classes = 10
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    sensor_size = (128, 128, 2)
    expected = ("CIFAR10DVS.zip, the ten class archives it holds (airplane.zip ... truck.zip) and their contents "
                "extracted beside them: <class>/*.aedat4")


class NCaltech101DataModule(TonicDataModule):
    """N-Caltech101 (Orchard et al. 2015): Caltech101 images recorded by an ATIS camera in saccades, 100 object
    categories and a background class.
    Recordings differ in size; events are kept on a 240x180 sensor (``image_size`` downsamples it to a
    square). No official test split: ``val_fraction`` (default 0.1) is held out, deterministic by seed."""

    tonic_name = "NCALTECH101"
    has_test_split = False
    sensor_size = (240, 180, 2)
    expected = ("N-Caltech101-archive.zip, the Caltech101.zip it holds and its contents extracted beside them: "
                "Caltech101/<class>/*.bin")
    # the 100 object categories and the background class, as the folders of Caltech101/ are named
    classes = sorted("""BACKGROUND_Google Faces_easy Leopards Motorbikes accordion airplanes anchor ant barrel bass
    beaver binocular bonsai brain brontosaurus buddha butterfly camera cannon car_side ceiling_fan cellphone chair
    chandelier cougar_body cougar_face crab crayfish crocodile crocodile_head cup dalmatian dollar_bill dolphin
    dragonfly electric_guitar elephant emu euphonium ewer ferry flamingo flamingo_head garfield gerenuk gramophone
    grand_piano hawksbill headphone hedgehog helicopter ibis inline_skate joshua_tree kangaroo ketch lamp laptop
    llama lobster lotus mandolin mayfly menorah metronome minaret nautilus octopus okapi pagoda panda pigeon pizza
    platypus pyramid revolver rhino rooster saxophone schooner scissors scorpion sea_horse snoopy soccer_ball
    stapler starfish stegosaurus stop_sign strawberry sunflower tick trilobite umbrella watch water_lilly
    wheelchair wild_cat windsor_chair wrench yin_yang""".split())
    num_classes = len(classes)

    def _label_map(self) -> Callable:
        index = {c: i for i, c in enumerate(self.classes)}

        def label(name: Any) -> int:
            if isinstance(name, np.ndarray):  # read back from the frame cache
                name = name.item()
            if isinstance(name, bytes):
                name = name.decode()
            if name not in index:
                raise ValueError(f"N-Caltech101 class folder {name!r} is not one of the 100 categories or the background")
            return index[name]

        return label
