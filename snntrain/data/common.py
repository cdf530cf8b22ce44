"""Helpers shared by the datamodules, and the resumable training loader they all use.

Training batches come from :func:`train_loader`: a :class:`ResumableLoader` whose sampler
(:class:`EpochSampler`) shuffles by ``(seed, epoch)`` and whose dataset wrapper
(:class:`SeededDataset`) seeds the random augmentation of each sample from
``(seed, epoch, index)``. Data order and augmentation therefore depend only on the seed, the
epoch and the position in the epoch -- not on worker processes, global random state or how
many times the run was interrupted -- and the loader's ``state_dict`` (saved by Lightning in
every checkpoint) lets a resumed run continue an epoch where the checkpoint left it.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from ..distributed import eval_sampler, process_group_shape
from ..validation import positive_int

__all__ = ["BadDataError", "DeviceLoader", "EpochSampler", "ResumableLoader", "SeededDataset", "check_fraction",
           "derive_seed", "eval_loader", "eval_sampler", "loader_device", "loader_workers", "loader_generator", "open_image", "positive_int", "prefetch_to_device",
           "item_generator", "reads_numpy_random", "split_indices", "train_loader"]


class BadDataError(ValueError):
    """A data file is unreadable or breaks its format; the message names the file (and the line)."""


def open_image(path, mode: str = "RGB", draft: tuple[int, int] | None = None, with_size: bool = False):
    """Read an image file completely into a PIL image of ``mode`` (with ``with_size``: and the file's
    full ``(height, width)``).

    A truncated, corrupt or non-image file raises :class:`BadDataError` naming it (PIL's messages
    for a truncated file do not). ``draft`` = ``(w, h)`` lets a JPEG decode at a power-of-two
    reduction that keeps at least that size.
    """
    from PIL import Image

    try:
        with Image.open(path) as img:
            size = (img.height, img.width)
            if draft is not None:
                img.draft(mode, draft)
            out = img.convert(mode)
            out.load()
    except FileNotFoundError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise BadDataError(
            f"image {path} cannot be read ({type(err).__name__}: {err}): the file is truncated, corrupt or not "
            "an image; replace or remove it"
        ) from err
    return (out, size) if with_size else out


def check_fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"{name}={value!r} must be a number strictly between 0 and 1")
    return float(value)


def check_num_workers(value: object) -> int | str:
    """``data.num_workers``: an integer >= 0, or ``auto`` (:func:`resolve_num_workers`)."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"data.num_workers={value!r} must be an integer >= 0 or auto (loader processes per "
                         "training process on a GPU, none on the CPU)")
    return value


def resolve_num_workers(value: int | str, device: torch.device | None) -> int:
    """``auto``: loader processes only where the training step runs on a GPU, whose host would otherwise
    prepare each batch while the GPU waits; there ``min(4, cores / processes on this machine - 1)``. On the
    CPU the step itself uses every core, and the batches are prepared in the training process (0)."""
    if value != "auto":
        return int(value)
    if device is None or device.type != "cuda":
        return 0
    local = max(1, torch.cuda.device_count()) if process_group_shape()[0] > 1 else 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(4, cores // local - 1))


def loader_workers(datamodule: Any) -> int:
    """The loader processes of ``datamodule``'s loaders: its ``num_workers`` resolved for the device its
    trainer trains on (:func:`resolve_num_workers`)."""
    return resolve_num_workers(datamodule.num_workers, loader_device(datamodule))


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A deterministic shuffled split of ``range(n)`` into train and validation indices."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, round(n * val_fraction))
    return sorted(perm[n_val:]), sorted(perm[:n_val])


def loader_generator(seed: int) -> torch.Generator:
    """A generator for DataLoader shuffling, so the batch order depends only on the seed."""
    return torch.Generator().manual_seed(seed)


def derive_seed(*keys: int) -> int:
    """A 63-bit seed that is a pure function of the integers ``keys`` (negative values wrap mod 2**64)."""
    seq = np.random.SeedSequence([int(k) % (1 << 64) for k in keys])
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


class EpochSampler(DistributedSampler):
    """Shuffles ``range(size)`` with a permutation drawn from ``(seed, epoch)``; yields ``(epoch, index)``.

    With ``W`` processes (``num_replicas``; by default the initialised process group's size) process
    ``rank`` takes every ``W``-th entry of the epoch's permutation from position ``rank``, after the
    permutation is padded with its own first entries to a multiple of ``W`` (as torch's
    ``DistributedSampler`` does), so every process runs the same number of steps and the processes
    together read every sample of the epoch (a few twice when ``W`` does not divide ``size``).
    Subclassing ``DistributedSampler`` tells Lightning that the loader is already sharded.

    Lightning calls :meth:`set_epoch` at the start of every training epoch. :meth:`resume_at`
    makes the next iteration start ``start`` samples into this process's share of the epoch (once);
    the iterations after it start at 0. The epoch travels with each index so that
    :class:`SeededDataset` can seed the sample's augmentation, in any worker process.
    """

    def __init__(self, size: int, seed: int, num_replicas: int | None = None, rank: int | None = None) -> None:
        self.size = positive_int("dataset size", size)
        if num_replicas is None:
            num_replicas, rank = process_group_shape()
        # sets num_samples (this process's share, ceil(size / W)), total_size, seed and epoch 0
        super().__init__(range(self.size), num_replicas=num_replicas, rank=0 if rank is None else rank,
                         shuffle=False, seed=int(seed), drop_last=False)
        self._start = 0

    def resume_at(self, epoch: int, start: int) -> None:
        if not 0 <= start <= self.num_samples:
            raise ValueError(f"cannot resume {start} samples into an epoch of {self.num_samples}")
        self.epoch, self._start = int(epoch), int(start)

    def permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
        return torch.randperm(self.size, generator=generator)

    def shard(self, epoch: int) -> list[int]:
        """This process's samples of ``epoch``, in order."""
        perm = self.permutation(epoch).tolist()
        perm += (perm * math.ceil(self.total_size / self.size))[: self.total_size - self.size]
        return perm[self.rank::self.num_replicas]

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, start = self.epoch, self._start
        self._start = 0
        for index in self.shard(epoch)[start:]:
            yield epoch, index


#: The item generators of the items being read, per thread (:func:`item_generator`).
_ITEM = threading.local()
#: Held while an item is drawn from a process-wide random state (torch's global CPU generator, NumPy's global
#: state): threads that read items at once (a loader's fetch thread beside the training loop's) take turns.
_GLOBAL_RANDOM = threading.RLock()


def item_generator() -> torch.Generator | None:
    """The generator that :class:`SeededDataset` seeded from ``(seed, epoch, index)`` for the item this thread is
    reading, for a dataset that declares ``reads_global_torch_random = False`` (its draws take this generator);
    None elsewhere (draw from torch's global generator)."""
    return getattr(_ITEM, "generator", None)


class SeededDataset(Dataset):
    """Wraps a dataset so that item ``(epoch, index)`` is drawn from random states seeded by ``(seed, epoch,
    index)``: torch's CPU generator and NumPy's global random state (torchvision's random transforms read the
    first, tonic's the second); the caller's random states are left as they were. Plain integer indices read
    the wrapped dataset as it is.

    Only the CPU generator is seeded: ``torch.manual_seed`` would also reseed every CUDA generator
    (the training process's, when the loader runs in it) and queue seeding calls for the other
    device types, which cost about a millisecond per sample. NumPy's global state is left alone for
    a dataset that declares ``reads_numpy_random = False`` (saving, seeding and restoring it costs
    about 50 us a sample): one whose items, transforms included, draw only from torch's generator or
    from generators of their own.

    Global states are one per process, and a loader may read items on a thread of its own (the image folder's
    GPU path fetches batches beside the training loop): a dataset that declares ``reads_global_torch_random =
    False`` draws from a generator of its own item instead (:func:`item_generator`, the same numbers as the
    global generator seeded alike), which threads never share; items drawn from global states are read one
    thread at a time."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = int(seed)
        self.numpy_random = reads_numpy_random(dataset)
        self.global_torch_random = _declares(dataset, "reads_global_torch_random")

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> Any:
        if not isinstance(key, tuple):
            return self.dataset[key]
        epoch, index = key
        seed = derive_seed(self.seed, epoch, index)
        if not self.global_torch_random:
            previous = getattr(_ITEM, "generator", None)
            _ITEM.generator = torch.Generator().manual_seed(seed)
            try:
                if not self.numpy_random:  # no process-wide state: threads read such items at once
                    return self.dataset[index]
                with _GLOBAL_RANDOM:
                    return self._numpy_seeded(index, seed)
            finally:
                _ITEM.generator = previous
        with _GLOBAL_RANDOM, torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            if not self.numpy_random:
                return self.dataset[index]
            return self._numpy_seeded(index, seed)

    def _numpy_seeded(self, index: int, seed: int) -> Any:
        """Item ``index`` with NumPy's global random state seeded by ``seed``, and restored after."""
        np_state = np.random.get_state()
        try:
            np.random.seed(seed % 2**32)
            return self.dataset[index]
        finally:
            np.random.set_state(np_state)


def _declares(dataset: Any, name: str) -> bool:
    """False when ``dataset`` (or, through ``Subset`` s, the dataset it takes its items from) sets ``name`` to
    False; True otherwise (the safe assumption)."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return bool(getattr(dataset, name, True))


def reads_numpy_random(dataset: Any) -> bool:
    """False when ``dataset`` (or, through ``Subset`` s, the dataset it takes its items from) declares
    ``reads_numpy_random = False``; True otherwise (the safe assumption)."""
    return _declares(dataset, "reads_numpy_random")


def _to_device(batch: Any, device: torch.device, stream: Any) -> Any:
    """``batch`` (tensors in tuples, lists and dicts) copied to ``device`` on the current stream, each copy
    marked as used by ``stream`` (the consumer's) so that the caching allocator keeps its memory until that
    stream's work on it is done."""
    if torch.is_tensor(batch):
        out = batch.to(device, non_blocking=True)
        out.record_stream(stream)
        return out
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(_to_device(b, device, stream) for b in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(b, device, stream) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, stream) for k, v in batch.items()}
    return batch


def prefetch_to_device(batches: Any, device: torch.device) -> Iterator[Any]:
    """Yield the batches of ``batches`` on the CUDA ``device``, each copied one batch ahead on a side stream.

    While the consumer computes with batch ``k`` (its kernels on the current stream), batch ``k + 1`` is
    already on its way to the device on the copy engine. When batch ``k`` is handed out, the current stream
    is made to wait for its copy (an event, no host synchronisation), so it is safe to use at once whatever
    the consumer does. Copies are asynchronous when the host tensors are pinned (the loaders pin them on
    CUDA); from pageable memory they still work, staged by the driver.
    """
    device = torch.device(device)
    side = torch.cuda.Stream(device)
    consumer = torch.cuda.current_stream(device)
    pending: Any = None

    def issue(batch: Any) -> tuple[Any, Any]:
        with torch.cuda.stream(side):
            moved = _to_device(batch, device, consumer)
            ready = torch.cuda.Event()
            ready.record(side)
        return moved, ready

    for batch in batches:
        nxt = issue(batch)
        if pending is not None:
            consumer.wait_event(pending[1])
            yield pending[0]
        pending = nxt
    if pending is not None:
        consumer.wait_event(pending[1])
        yield pending[0]


def loader_device(datamodule: Any) -> torch.device | None:
    """The device the datamodule's trainer trains on (None without a trainer)."""
    trainer = getattr(datamodule, "trainer", None)
    if trainer is None:
        return None
    try:
        return torch.device(trainer.strategy.root_device)
    except (AttributeError, RuntimeError):
        return None


#: Tensors of at most this many bytes leave a loader process inside the batch's pickle (:class:`InlineSmallTensors`):
#: copying a megabyte through the pipe costs less than handing over a shared-memory segment (a batch of 16
#: 64x64 RGB uint8 images is 192 KiB); a batch of 32 224x224 images (4.6 MiB) still travels as shared memory.
INLINE_BYTES = 1 << 20
_NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16,
                           torch.int32, torch.int64, torch.bool})


class _Array:
    """A small tensor's values inside a pickled batch (a NumPy array travels by value)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self):
        return _Array, (self.array,)


def _map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied to every leaf of a batch's tuples, named tuples, lists and dicts."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(_map_leaves(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_leaves(o, fn) for o in obj)
    if type(obj) is dict:
        return {k: _map_leaves(v, fn) for k, v in obj.items()}
    return fn(obj)


def _pack(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.nbytes <= INLINE_BYTES \
            and obj.dtype in _NUMPY_DTYPES and not obj.requires_grad:
        return _Array(obj.numpy())
    return obj


def _unpack(obj: Any) -> Any:
    return torch.from_numpy(obj.array) if isinstance(obj, _Array) else obj


def _unpack_batch(batch: Any) -> Any:
    return _map_leaves(batch, _unpack)


class _PackedBatch:
    """A batch on its way out of a loader process; unpickled, it is the batch again (tuples, lists, dicts)."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __reduce__(self):
        return _unpack_batch, (_map_leaves(self.batch, _pack),)


class InlineSmallTensors:
    """A ``collate_fn`` for loader processes: each tensor of a batch would otherwise leave the process as a
    shared-memory segment of its own, handed over through a socket and mapped by the training process's
    threads (about 1 ms each, holding the interpreter lock the training loop needs); a detection batch has
    eight. Tensors up to :data:`INLINE_BYTES` travel inside the batch's pickle instead (as NumPy arrays),
    larger ones (large images) as before. In the training process (``num_workers=0``) nothing changes."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> Any:
        from torch.utils.data import get_worker_info

        batch = self.collate_fn(samples)
        return _PackedBatch(batch) if get_worker_info() is not None else batch


class DeviceLoader(DataLoader):
    """A DataLoader that, given a CUDA ``device``, pins its batches and hands them out already on the
    device, copied one batch ahead on a side stream (:func:`prefetch_to_device`): the host never waits
    for a copy, and the copy of the next batch overlaps the current step. Without a CUDA device it is a
    plain DataLoader. ``device_transform(batch)``, if given, is applied to every batch where it lands (on
    the device, after the copy; on the host without one): work better done there than in the workers.
    With loader processes, small tensors leave them inside the batch's pickle (:class:`InlineSmallTensors`)."""

    def __init__(self, *args: Any, device: torch.device | str | None = None,
                 device_transform: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        device = None if device is None else torch.device(device)
        self.device = device if device is not None and device.type == "cuda" else None
        self.device_transform = device_transform
        if self.device is not None:
            kwargs.setdefault("pin_memory", True)
        if kwargs.get("num_workers", 0) > 0 and not isinstance(kwargs.get("collate_fn"), InlineSmallTensors):
            from torch.utils.data import default_collate, default_convert

            batched = kwargs.get("batch_size", 1) is not None or kwargs.get("batch_sampler") is not None
            kwargs["collate_fn"] = InlineSmallTensors(kwargs.get("collate_fn")
                                                      or (default_collate if batched else default_convert))
        super().__init__(*args, **kwargs)

    def __iter__(self):
        batches = super().__iter__()
        if self.device is not None:
            batches = prefetch_to_device(batches, self.device)
        return batches if self.device_transform is None else map(self.device_transform, batches)


class ResumableLoader(DeviceLoader):
    """A training DataLoader over an :class:`EpochSampler` that Lightning can checkpoint mid-epoch.

    ``state_dict()`` records the epoch and how many batches of it the trainer has taken
    (``progress``, a callable the datamodule binds to the trainer, returns that count and the
    number of batches the trainer runs per epoch; batches a prefetcher has read ahead do not
    count). ``load_state_dict()`` makes the next iteration continue that epoch
    with the following batch, in the same order and with the same augmentation; a state taken at
    the end of an epoch continues with the next epoch. With several processes each one continues its
    own share of the epoch (see :class:`EpochSampler`). A state from another seed, batch size, dataset
    size or number of processes cannot be continued exactly inside an epoch: it warns and starts the
    saved epoch afresh (at an epoch boundary that is exact, and nothing is said).
    """

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, drop_last: bool = False, num_workers: int = 0,
                 collate_fn: Callable | None = None, persistent_workers: bool = False,
                 progress: Callable[[], tuple[int, float]] | None = None, **kwargs: Any) -> None:
        sampler = kwargs.pop("sampler", None)
        if not isinstance(sampler, EpochSampler):
            sampler = EpochSampler(len(dataset), seed)  # type: ignore[arg-type]
        if not isinstance(dataset, SeededDataset):
            dataset = SeededDataset(dataset, seed)
        kwargs.pop("shuffle", None)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                         num_workers=num_workers, collate_fn=collate_fn,
                         persistent_workers=persistent_workers and num_workers > 0, **kwargs)  # device: in kwargs
        self.seed = int(seed)
        self.progress = progress
        #: optional ``f(batches) -> batches`` over the batches as they reach this process, which must pass on
        #: every batch in order (the image folder's GPU path starts decoding each one there)
        self.wrap: Callable[[Iterator[Any]], Iterator[Any]] | None = None

    def __iter__(self) -> Iterator[Any]:
        batches = super().__iter__()
        return batches if self.wrap is None else self.wrap(batches)

    def batches_per_epoch(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def state_dict(self) -> dict[str, int]:
        done, per_epoch = self.progress() if self.progress is not None else (0, self.batches_per_epoch())
        epoch = self.sampler.epoch  # type: ignore[attr-defined]
        if done >= min(per_epoch, self.batches_per_epoch()):
            epoch, done = epoch + 1, 0
        sampler: EpochSampler = self.sampler  # type: ignore[assignment]
        return {"seed": self.seed, "epoch": epoch, "batches_done": done, "batch_size": int(self.batch_size),
                "size": sampler.size, "processes": sampler.num_replicas}

    def load_state_dict(self, state: dict[str, int]) -> None:
        sampler: EpochSampler = self.sampler  # type: ignore[assignment]
        mine = {"seed": self.seed, "batch_size": int(self.batch_size), "size": sampler.size,
                "processes": sampler.num_replicas}
        saved = {"processes": 1, **state}  # states written before processes were recorded: one process
        differs = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k) != v}
        done = int(state["batches_done"])
        if differs and done:  # at an epoch boundary (done 0) starting the epoch is exact anyway
            warnings.warn(
                "the checkpoint's training data differs from this run's ("
                + ", ".join(f"{k} was {a!r}, is {b!r}" for k, (a, b) in differs.items())
                + f"): epoch {state['epoch']} starts from its beginning instead of continuing exactly",
                stacklevel=2)
            done = 0
        sampler.resume_at(int(state["epoch"]), done * int(self.batch_size))


def eval_loader(datamodule: Any, dataset: Dataset, batch_size: int, **kwargs: Any) -> DeviceLoader:
    """The evaluation (validation, test) loader of ``datamodule``: ``dataset`` in order, in contiguous shards
    when several processes evaluate together (:func:`eval_sampler`). On a CUDA trainer its batches arrive on
    the device, pinned and copied one batch ahead (:class:`DeviceLoader`), as training batches do: a batch
    copied from pageable memory when the step asks for it makes the host wait for the device once per batch,
    so that the host's work and the device's add up instead of overlapping."""
    kwargs.setdefault("device", loader_device(datamodule))
    kwargs.setdefault("sampler", eval_sampler(dataset))
    kwargs.setdefault("shuffle", False)
    workers = kwargs.get("num_workers", 0)
    kwargs.setdefault("persistent_workers", workers > 0)
    return DeviceLoader(dataset, batch_size=batch_size, **kwargs)


def train_loader(datamodule: Any, dataset: Dataset, batch_size: int, seed: int, **kwargs: Any) -> ResumableLoader:
    """The training loader of ``datamodule`` (see :class:`ResumableLoader`); its position is its trainer's
    count of batches taken in the current epoch, out of the trainer's batches per epoch (which
    ``limit_train_batches`` may make fewer than the loader's). On a CUDA trainer its batches arrive on the
    device, pinned and copied one batch ahead (:class:`DeviceLoader`)."""
    kwargs.setdefault("device", loader_device(datamodule))

    def progress() -> tuple[int, float]:
        trainer = getattr(datamodule, "trainer", None)
        if trainer is None:
            return 0, float("inf")
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.ready), trainer.num_training_batches

    return ResumableLoader(dataset, batch_size, seed, progress=progress, **kwargs)
