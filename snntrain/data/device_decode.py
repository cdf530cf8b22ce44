"""Image batches decoded and augmented where they are trained: the GPU path of ``data=image_folder``.

The loader's worker processes only read each file's bytes, parse its header (:func:`jpeg_info`)
and draw its augmentation (a crop box and a flip, from ``(seed, epoch, index)`` as on the CPU
path); a batch travels as an :class:`EncodedBatch`: the JPEG bytes of the batch in one buffer,
the boxes, flips and labels, and, for the few images the GPU decoder does not read, their pixels
decoded in the worker (:data:`FALLBACKS`). Where the batch reaches its device (the datamodule's
``on_after_batch_transfer``) a :class:`DeviceDecoder` turns it into ``(images, labels)``:

* ``engine="nvjpeg"``: ``torchvision.io.decode_jpeg`` on the list of encoded images (nvJPEG, batched,
  with the GPU's hardware JPEG decoder where it has one; on a CPU device the same call decodes with
  libjpeg-turbo), then one kernel (:mod:`snntrain.kernels.resized_crop`) crops, resizes, flips and
  normalises every image (on a CPU device: :func:`resized_crop_reference`, the same computation);
* ``engine="dali"``: an NVIDIA DALI pipeline fed with the same bytes, boxes and flips (decode,
  resize of the box, mirror, normalise), so order, augmentation and resume stay ours.

A batch that the GPU decoder refuses is decoded again image by image to find the file; a file that
PIL cannot read either raises :class:`~snntrain.data.common.BadDataError` naming it, one that PIL
reads is used as decoded by PIL and counted like the other fallbacks.
"""

from __future__ import annotations

import logging
import queue
import threading
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import UnavailableError

log = logging.getLogger(__name__)

#: why an image is decoded on the CPU (in the loader's worker) instead of by nvJPEG
FALLBACKS = ("progressive JPEG", "CMYK JPEG", "other JPEG", "not a JPEG", "rejected by nvJPEG")
ENGINES = ("nvjpeg", "dali")


# ------------------------------------------------------------------------------------------ headers


@dataclass(frozen=True)
class JpegInfo:
    """What the header of a JPEG says: size, components, and whether nvJPEG's batched decoder reads it."""

    height: int
    width: int
    components: int
    #: None when nvJPEG reads the file; else the reason (one of :data:`FALLBACKS`) to decode it with PIL
    fallback: str | None
    #: False when no end-of-image marker follows the scan: a truncated file
    complete: bool


_SOF_SEQUENTIAL = (0xC0, 0xC1)  # baseline and extended sequential, Huffman-coded
_SOF_PROGRESSIVE = 0xC2
_SOF_OTHER = (0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)  # lossless, hierarchical, arithmetic


def jpeg_info(data: bytes) -> JpegInfo | None:
    """Parse a JPEG's markers up to its first scan; None when ``data`` is not a JPEG (or its header is
    broken: then PIL, which reads it next, says what is wrong with it)."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i, sof, adobe_transform = 2, None, None
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan
            if sof is None or marker == 0xD9:
                return None
            kind, precision, height, width, comps = sof
            if kind == "other" or precision != 8 or height == 0 or comps not in (1, 3):
                reason = "CMYK JPEG" if comps == 4 else "other JPEG"
            elif kind == "progressive":
                reason = "progressive JPEG"
            elif comps == 3 and adobe_transform == 0:  # colour stored as RGB, not YCbCr
                reason = "other JPEG"
            else:
                reason = None
            # entropy-coded data never holds an end-of-image marker (a 0xFF byte there is followed by 0x00
            # or a restart marker), so one after the scan's start says the file is complete
            return JpegInfo(height, width, comps, reason, complete=data.rfind(b"\xff\xd9", i) >= 0)
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            return None
        if marker in _SOF_SEQUENTIAL or marker == _SOF_PROGRESSIVE or marker in _SOF_OTHER:
            if i + 10 > n:
                return None
            kind = ("sequential" if marker in _SOF_SEQUENTIAL else
                    "progressive" if marker == _SOF_PROGRESSIVE else "other")
            sof = (kind, data[i + 4], (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8], data[i + 9])
        elif marker == 0xEE and i + 16 <= n and data[i + 4:i + 9] == b"Adobe":
            adobe_transform = data[i + 15]
        i += 2 + length
    return None


# ------------------------------------------------------------------------------------------ batches


class EncodedBatch:
    """A batch on its way to the device: encoded images plus what the device needs to augment them.

    ``data`` holds the encoded files of the positions in ``encoded`` back to back (``sizes`` bytes
    each); the positions in ``decoded`` come as ``pixels`` (uint8 ``[C, H, W]``, decoded by PIL in the
    worker for the reason in ``reasons``). ``boxes`` ``[B, 4]`` (top, left, height, width in the
    source image) and ``flips`` ``[B]`` stay on the CPU; ``labels`` move to the device with :meth:`to`,
    which leaves the encoded bytes where the decoders read them (host memory).
    """

    def __init__(self, data: torch.Tensor, sizes: list[int], encoded: list[int], pixels: list[torch.Tensor],
                 decoded: list[int], reasons: list[str], boxes: torch.Tensor, flips: torch.Tensor,
                 labels: torch.Tensor, paths: list[str]) -> None:
        self.data, self.sizes, self.encoded = data, sizes, encoded
        self.pixels, self.decoded, self.reasons = pixels, decoded, reasons
        self.boxes, self.flips, self.labels, self.paths = boxes, flips, labels, paths
        #: the result of :class:`DecodeAhead`, once it has taken the batch (never pickled: set in the main process)
        self.pending: Future | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getstate__(self) -> dict[str, Any]:
        # from a loader process: each tensor would travel as a shared-memory segment of its own, received
        # through a socket and mapped (about 0.7 ms each, holding up the training process's threads); only
        # the encoded bytes take that path, the small per-image arrays travel inside the pickle
        state = dict(self.__dict__, pending=None)
        for key in ("boxes", "flips", "labels"):
            state[key] = state[key].numpy()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in ("boxes", "flips", "labels"):
            state[key] = torch.from_numpy(state[key])
        self.__dict__.update(state)

    @property
    def device(self) -> torch.device:
        return self.labels.device

    def to(self, device: torch.device | str, non_blocking: bool = True) -> EncodedBatch:
        # non-blocking by default (Lightning's transfer passes no arguments to a batch's own ``to``): a
        # blocking copy would wait for the step in flight on the device
        self.labels = self.labels.to(device, non_blocking=non_blocking)
        return self

    def parts(self) -> list[torch.Tensor]:
        """The encoded files, each a 1-D uint8 view of :attr:`data`."""
        return list(self.data.split(self.sizes)) if self.sizes else []


@dataclass
class EncodedItem:
    """One sample as a worker prepares it (see :class:`EncodedBatch`)."""

    data: bytes | None
    pixels: torch.Tensor | None
    reason: str | None
    box: tuple[int, int, int, int]
    flip: bool
    label: int
    path: str


def collate_encoded(items: Sequence[EncodedItem]) -> EncodedBatch:
    """Gather items into one :class:`EncodedBatch`; the encoded bytes are copied once, into one buffer."""
    encoded = [k for k, it in enumerate(items) if it.data is not None]
    sizes = [len(items[k].data) for k in encoded]  # type: ignore[arg-type]
    data = torch.empty(sum(sizes), dtype=torch.uint8)
    view, at = data.numpy(), 0
    for k, size in zip(encoded, sizes):
        view[at:at + size] = np.frombuffer(items[k].data, dtype=np.uint8)  # type: ignore[arg-type]
        at += size
    decoded = [k for k, it in enumerate(items) if it.data is None]
    return EncodedBatch(
        data=data, sizes=sizes, encoded=encoded,
        pixels=[items[k].pixels for k in decoded], decoded=decoded,  # type: ignore[misc]
        reasons=[items[k].reason or "" for k in decoded],
        boxes=torch.tensor([it.box for it in items], dtype=torch.int64).reshape(len(items), 4),
        flips=torch.tensor([it.flip for it in items], dtype=torch.bool),
        labels=torch.tensor([it.label for it in items], dtype=torch.int64),
        paths=[it.path for it in items])


# ------------------------------------------------------------------------------------------ augmentation


def normalisation(mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``[C, 2]`` float32 ``(mul, add)`` with ``pixel * mul + add == (pixel / 255 - mean) / std``."""
    mean_t, std_t = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
    return torch.stack([1.0 / (255.0 * std_t), -mean_t / std_t], dim=1).float()


def resized_crop_reference(images: Sequence[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, size: int,
                           norm: torch.Tensor, dtype: torch.dtype = torch.float32,
                           memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """What :func:`snntrain.kernels.resized_crop.resized_crop` computes, in PyTorch: each uint8
    ``[C, H, W]`` image's box resized to ``size x size`` (antialiased bilinear), mirrored where
    ``flips`` is set, normalised with ``norm`` (:func:`normalisation`)."""
    out = []
    for image, (top, left, h, w), flip in zip(images, boxes.tolist(), flips.tolist()):
        box = image[:, top:top + h, left:left + w].float()[None]
        x = F.interpolate(box, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        out.append(x.flip(-1) if flip else x)
    x = torch.cat(out)
    norm = norm.to(x.device)
    x = x * norm[:, 0].view(1, -1, 1, 1) + norm[:, 1].view(1, -1, 1, 1)
    return x.to(dtype).contiguous(memory_format=memory_format)


def resized_crop(images: Sequence[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, size: int,
                 norm: torch.Tensor, dtype: torch.dtype = torch.float32,
                 memory_format: torch.memory_format = torch.contiguous_format, backend: str = "auto") -> torch.Tensor:
    """Crop ``boxes`` (CPU ``[B, 4]`` int64: top, left, height, width) of uint8 ``[C, H, W]`` ``images`` (all
    on one device), resize to ``size``, mirror where ``flips`` (CPU ``[B]`` bool), normalise: ``[B, C, size,
    size]`` in ``dtype`` and ``memory_format``. ``backend``: ``triton`` (the kernel; on a CPU device only under
    ``TRITON_INTERPRET=1``), ``torch`` (:func:`resized_crop_reference`) or ``auto`` (the kernel on CUDA)."""
    from ..backend import use_triton

    if not images:
        raise ValueError("resized_crop needs at least one image")
    first = images[0]
    C = first.shape[0]
    sizes = [tuple(im.shape) for im in images]
    if any(len(s) != 3 or s[0] != C for s in sizes):
        raise ValueError(f"images must all be [C, H, W] with the same C; got shapes {sizes}")
    b = boxes.tolist()
    for (top, left, h, w), (_, H, W), path_k in zip(b, sizes, range(len(b))):
        if not (0 <= top and 0 <= left and h >= 1 and w >= 1 and top + h <= H and left + w <= W):
            raise ValueError(f"box {(top, left, h, w)} of image {path_k} lies outside its {H}x{W} pixels")
    if not use_triton(backend, first):
        return resized_crop_reference(images, boxes, flips, size, norm, dtype, memory_format)
    from ..kernels.resized_crop import resized_crop as launch

    device = first.device
    src = torch.cat([im.reshape(-1) for im in images]) if len(images) > 1 else first.reshape(-1)
    offsets = np.cumsum([0] + [C * H * W for _, H, W in sizes[:-1]])
    meta = torch.tensor([[int(o), H, W, top, left, h, w, int(f)]
                         for o, (_, H, W), (top, left, h, w), f in zip(offsets, sizes, b, flips.tolist())],
                        dtype=torch.int64)
    out = torch.empty((len(images), C, size, size), dtype=dtype, device=device, memory_format=memory_format)
    return launch(src, meta.to(device, non_blocking=True), norm.to(device), out)


# ------------------------------------------------------------------------------------------ decoders


def _decode_jpeg(data: list[torch.Tensor], channels: int, device: torch.device) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():  # torchvision >= 0.29 marks its decoders deprecated (in favour of TorchCodec)
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode_jpeg(data, mode=ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY, device=device)


def check_nvjpeg(device: torch.device) -> None:
    """Decode a small JPEG on ``device``: raises RuntimeError where torchvision cannot decode there (a build
    without nvJPEG, say); also creates the decoder before the first batch."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 8), (200, 30, 90)).save(buf, "JPEG")
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    image = _decode_jpeg([data], 3, device)[0]
    if tuple(image.shape) != (3, 8, 16):
        raise RuntimeError(f"decoding a 16x8 JPEG on {device} gave shape {tuple(image.shape)}")


def pil_pixels(path: str, channels: int) -> torch.Tensor:
    """The file decoded by PIL as a uint8 ``[channels, H, W]`` tensor (RGB or grey); a file PIL cannot read
    raises :class:`~snntrain.data.common.BadDataError` naming it."""
    from .common import open_image

    image = np.array(open_image(path, "RGB" if channels == 3 else "L"))
    return torch.from_numpy(image.reshape(image.shape[0], image.shape[1], -1)).permute(2, 0, 1).contiguous()


class DeviceDecoder:
    """Turns :class:`EncodedBatch` es into ``(images, labels)`` on the batch's device.

    ``size``: output side; ``channels``: 3 (RGB) or 1 (grey); ``mean`` / ``std``: per channel, for
    pixels scaled to [0, 1]; ``dtype``: float32 or bfloat16; ``channels_last``: NHWC output strides.
    ``engine``: :data:`ENGINES`. ``threads``: DALI's CPU threads; ``batch_size``: the largest batch DALI's
    pipeline is built for (a larger one rebuilds it). :attr:`stats` counts the images
    decoded on the CPU by reason (:data:`FALLBACKS`) and all images decoded (``"images"``).
    """

    def __init__(self, size: int, channels: int, mean: Sequence[float], std: Sequence[float],
                 engine: str = "nvjpeg", dtype: torch.dtype = torch.float32, channels_last: bool = False,
                 threads: int = 2, batch_size: int = 1, backend: str = "auto") -> None:
        from ..validation import one_of

        self.engine = one_of("data.decode engine", engine, ENGINES)
        self.size, self.channels = int(size), int(channels)
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(f"mean={self.mean} and std={self.std} need one value per channel ({self.channels})")
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype={dtype} is not valid; choose torch.float32 or torch.bfloat16")
        self.dtype, self.channels_last = dtype, bool(channels_last)
        self.threads, self.batch_size, self.backend = max(1, int(threads)), int(batch_size), backend
        self.norm = normalisation(self.mean, self.std)
        self._norms: dict[torch.device, torch.Tensor] = {}  # self.norm on each device used
        self.stats: Counter[str] = Counter()
        self._dali: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._done: dict[torch.device, torch.cuda.Event] = {}

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)`` on the device of the batch's labels (where Lightning's transfer put them), ready
        for the current stream; a batch that :class:`DecodeAhead` has taken is waited for instead."""
        if batch.pending is not None:
            images, labels, done = batch.pending.result()
        else:
            images, labels, done = self.decode(batch, batch.device, batch.labels)
        if done is not None:  # made on the decoder's stream: the current stream waits for them, and owns them
            stream = torch.cuda.current_stream(images.device)
            stream.wait_event(done)
            images.record_stream(stream)
            labels.record_stream(stream)
        return images, labels

    def decode(self, batch: EncodedBatch, device: torch.device,
               labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]:
        """The batch's images decoded and augmented on ``device``, its labels there, and on CUDA the event
        after which both are ready (they are made on the decoder's own stream).

        On CUDA every batch runs on one stream of the decoder's, and waits first until the previous batch's
        work on it is done: nvJPEG writes its output on a stream of its own, into memory the caching allocator
        hands out as free on the current stream, which may be the previous batch's images still being read."""
        device = torch.device(device)
        with self._lock:  # one batch at a time (training and validation batches may overlap)
            if device.type != "cuda":
                return self._images(batch, device), labels.to(device), None
            if device not in self._streams:
                self._streams[device] = torch.cuda.Stream(device, priority=-1)
            stream = self._streams[device]
            with torch.cuda.device(device), torch.cuda.stream(stream):
                if device in self._done:
                    self._done[device].synchronize()
                images = self._images(batch, device)
                labels = labels.to(device, non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
                self._done[device] = done
            return images, labels, done

    def _images(self, batch: EncodedBatch, device: torch.device) -> torch.Tensor:
        self._count(batch)
        if self.engine == "dali":
            return self._dali_run(batch, device)
        return self._nvjpeg_run(batch, device)

    def _count(self, batch: EncodedBatch) -> None:
        self.stats["images"] += len(batch)
        for reason, k in zip(batch.reasons, batch.decoded):
            self._fallback(reason, batch.paths[k])

    def _fallback(self, reason: str, path: str) -> None:
        if self.stats[reason] == 0:
            log.warning("snntrain: %s (%s) is decoded on the CPU, not by %s; further such images are only counted",
                        path, reason, self.engine)
        self.stats[reason] += 1

    def summary(self) -> str:
        """One line: how many images were decoded, and how many of them on the CPU, by reason."""
        total = self.stats["images"]
        cpu = {k: v for k, v in self.stats.items() if k != "images" and v}
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(cpu.items())) or "none"
        return f"{total} images, {sum(cpu.values())} of them decoded on the CPU instead of by {self.engine} ({detail})"

    # ---------------------------------------------------------------- nvJPEG (torchvision) + our kernel

    def _nvjpeg_run(self, batch: EncodedBatch, device: torch.device) -> torch.Tensor:
        images: list[torch.Tensor | None] = [None] * len(batch)
        parts = batch.parts()
        if parts:
            for k, image in zip(batch.encoded, self._decode(parts, [batch.paths[k] for k in batch.encoded], device)):
                images[k] = image
        for k, pixels in zip(batch.decoded, batch.pixels):
            images[k] = pixels.to(device, non_blocking=True)
        if device not in self._norms:
            self._norms[device] = self.norm.to(device)
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        return resized_crop(images, batch.boxes, batch.flips, self.size, self._norms[device],  # type: ignore[arg-type]
                            self.dtype, memory_format, self.backend)

    def _decode(self, parts: list[torch.Tensor], paths: list[str], device: torch.device) -> list[torch.Tensor]:
        try:
            return _decode_jpeg(parts, self.channels, device)
        except RuntimeError:
            pass
        out = []  # find the file(s) the decoder refuses: one by one, then PIL (which names a broken file)
        for part, path in zip(parts, paths):
            try:
                out.append(_decode_jpeg([part], self.channels, device)[0])
            except RuntimeError:
                pixels = pil_pixels(path, self.channels)  # BadDataError naming the file if PIL fails too
                self._fallback("rejected by nvJPEG", path)
                out.append(pixels.to(device))
        return out

    # ---------------------------------------------------------------- DALI

    def _dali_pipeline(self, device: torch.device, n: int):
        """The pipeline for ``device``, built once for batches of up to ``max(n, batch_size)`` images."""
        built = self._dali.get(device)
        if built is None or built[0] < n:
            most = max(n, self.batch_size)
            self._dali = {device: (most, build_dali_pipeline(most, self.size, self.channels, self.mean, self.std,
                                                             device, self.threads))}
        return self._dali[device][1]

    def _dali_run(self, batch: EncodedBatch, device: torch.device) -> torch.Tensor:
        if batch.pixels:
            raise ValueError("the DALI engine reads every image itself: its batches carry no decoded pixels "
                             f"(got {len(batch.pixels)}; build the dataset with engine='dali')")
        pipe = self._dali_pipeline(device, len(batch))
        boxes = batch.boxes.numpy().astype(np.float32)
        start = boxes[:, :2]
        end = start + boxes[:, 2:]
        pipe.feed_input("encoded", [p.numpy() for p in batch.parts()])
        pipe.feed_input("roi_start", list(start))
        pipe.feed_input("roi_end", list(end))
        pipe.feed_input("mirror", list(batch.flips.numpy().astype(np.int32)))
        try:
            (out,) = pipe.run()
        except Exception:
            self._dali = {}  # rebuilt for the next batch
            for path in batch.paths:  # name the file DALI could not read, if PIL cannot read it either
                pil_pixels(path, self.channels)
            raise
        from nvidia.dali.plugin.pytorch import feed_ndarray

        images = torch.empty((len(batch), self.channels, self.size, self.size), dtype=torch.float32, device=device)
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        feed_ndarray(out.as_tensor(), images, cuda_stream=stream)
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        return images.to(self.dtype).contiguous(memory_format=memory_format)


class DecodeAhead:
    """Takes the host work of image batches off the training loop's thread: a fetch thread per epoch takes
    each batch from the loader (receiving it from the worker processes and unpickling it, about 3 ms for
    a batch of 32 ImageNet-size JPEGs) and hands it to one decode thread, which starts nvJPEG and the crop
    kernel on ``device`` at once, so that both overlap the step in flight instead of holding up the loop
    (which fetches one batch ahead and launches the step's kernels from the same thread).
    :meth:`wrap` wraps a loader's iterator; :class:`DeviceDecoder` then hands over the finished batch.

    Batches, their order and their results are the same as decoding in the training loop; the fetch thread
    runs at most ``depth`` batches ahead of the loop, and an error of the loader (a broken file) is raised
    in the loop at the batch where it occurred."""

    _END = object()

    def __init__(self, decoder: DeviceDecoder, device: torch.device, depth: int = 2) -> None:
        self.decoder, self.device = decoder, torch.device(device)
        self.depth = int(depth)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="snntrain-decode")
        self._stops: list[threading.Event] = []  # one per epoch's fetch thread still running

    def _submit(self, batch: Any) -> Any:
        if isinstance(batch, EncodedBatch):
            batch.pending = self.pool.submit(self.decoder.decode, batch, self.device, batch.labels)
        return batch

    def _fetch(self, batches: Iterator[Any], out: queue.Queue, stop: threading.Event) -> None:
        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch in batches:
                if not put((self._submit(batch), None)):
                    return
            put((self._END, None))
        except BaseException as err:  # noqa: BLE001 - raised in the training loop's thread
            put((self._END, err))
        finally:  # a generator over the loader is closed here; the loader's iterator goes with this thread
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def wrap(self, batches: Iterator[Any]) -> Iterator[Any]:
        out: queue.Queue = queue.Queue(maxsize=max(1, self.depth))
        stop = threading.Event()
        self._stops.append(stop)
        thread = threading.Thread(target=self._fetch, args=(batches, out, stop), name="snntrain-fetch", daemon=True)
        del batches
        thread.start()
        try:
            while True:
                batch, err = out.get()
                if err is not None:
                    raise err
                if batch is self._END:
                    return
                yield batch
        finally:  # the epoch ended, or the loop stopped taking batches (a batch limit, an error)
            stop.set()
            thread.join()
            self._stops.remove(stop)

    def close(self) -> None:
        for stop in list(self._stops):
            stop.set()
        self.pool.shutdown(wait=True)


DALI_MISSING = ("data.decode=dali needs NVIDIA DALI, which is not installed: pip install \".[dali]\" (the "
                "nvidia-dali-cuda130 wheel, for CUDA 13; for another CUDA install the matching "
                "nvidia-dali-cudaXXX), or choose data.decode=gpu or cpu")


def dali_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no 'nvidia' namespace at all
        return False


def build_dali_pipeline(batch_size: int, size: int, channels: int, mean: Sequence[float], std: Sequence[float],
                        device: torch.device, threads: int):
    """A DALI pipeline fed per batch (external sources ``encoded``, ``roi_start``, ``roi_end`` (y, x) and
    ``mirror``): decode (``mixed``, nvJPEG, on a CUDA device; libjpeg-turbo and friends on the CPU), resize
    the box to ``size`` (antialiased linear), mirror, normalise, CHW float32. EXIF orientation is ignored,
    as on the other paths, so the boxes drawn from the header's size fit."""
    try:
        from nvidia.dali import fn, pipeline_def, types
    except ImportError as err:
        raise UnavailableError(DALI_MISSING) from err

    cuda = device.type == "cuda"

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=(device.index or 0) if cuda else None,
                  exec_async=False, exec_pipelined=False, prefetch_queue_depth=1)
    def pipeline():
        encoded = fn.external_source(name="encoded", dtype=types.UINT8)
        roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT)
        roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT)
        mirror = fn.external_source(name="mirror", dtype=types.INT32)
        images = fn.decoders.image(encoded, device="mixed" if cuda else "cpu",
                                   output_type=types.RGB if channels == 3 else types.GRAY,
                                   adjust_orientation=False, jpeg_fancy_upsampling=True)
        images = fn.resize(images, size=[size, size], roi_start=roi_start, roi_end=roi_end, roi_relative=False,
                           antialias=True, interp_type=types.INTERP_LINEAR)
        return fn.crop_mirror_normalize(images, mirror=mirror, mean=[255.0 * m for m in mean],
                                        std=[255.0 * s for s in std], dtype=types.FLOAT, output_layout="CHW")

    pipe = pipeline()
    pipe.build()
    return pipe
