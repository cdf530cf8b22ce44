"""Offline event-camera digits: scikit-learn's bundled digits recorded by a simulated DVS.

N-MNIST was made by showing MNIST digits on a monitor to an event camera that moved in
three small saccades. This does the same in simulation, so the event path works on a
machine without data or network: each 8x8 digit is upsampled to ``digit_size`` pixels,
placed on a sensor with ``saccade`` pixels of margin on each side and moved along a
triangle (three straight saccades of ``saccade_ms`` each). Every pixel keeps the log
intensity at which it last fired; when the current log intensity differs from it by
more than its contrast threshold, the pixel emits one ON (``p=1``) or OFF (``p=0``)
event per threshold crossed, timestamped within the step. Thresholds vary from pixel
to pixel (``threshold_mismatch``) and uniform background noise events are added
(``noise_rate_hz`` per pixel), as in a real sensor.

Events are in tonic's format (a structured array with ``x``, ``y``, ``t`` in µs and
``p``), so tonic's transforms apply unchanged. Recording ``i`` is a pure function of
``(seed, i)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..validation import number
from .common import check_fraction, positive_int
from .events import EventDataModule

EVENT_DTYPE = np.dtype([("x", np.int16), ("y", np.int16), ("t", np.int64), ("p", np.int8)])


def _on_sensor(images: np.ndarray, size: int, path: np.ndarray) -> np.ndarray:
    """``images`` ``[N, h, w]`` placed on a ``size`` x ``size`` black sensor with their top-left corner at each
    offset ``(dx, dy)`` of ``path`` ``[K, 2]`` (bilinear at sub-pixel offsets): ``[K, N, size, size]``."""
    n, h, w = images.shape
    padded = np.zeros((n, h + 2, w + 2), np.float32)  # a black border: samples off the digit read 0
    padded[:, 1:-1, 1:-1] = images
    grid = np.arange(size, dtype=np.float32)
    out = np.empty((len(path), n, size, size), np.float32)
    for k, (dx, dy) in enumerate(path):
        u, v = grid - dx, grid - dy  # digit coordinates of the sensor's columns and rows
        u0, v0 = np.floor(u), np.floor(v)
        fu, fv = u - u0, v - v0
        iu, iv = u0.astype(np.int64) + 1, v0.astype(np.int64) + 1  # +1: the border
        iu1, iv1 = np.clip(iu + 1, 0, w + 1), np.clip(iv + 1, 0, h + 1)
        iu, iv = np.clip(iu, 0, w + 1), np.clip(iv, 0, h + 1)
        row0, row1 = padded[:, iv, :], padded[:, iv1, :]
        top = row0[:, :, iu] * (1 - fu) + row0[:, :, iu1] * fu
        bottom = row1[:, :, iu] * (1 - fu) + row1[:, :, iu1] * fu
        out[k] = top * (1 - fv)[:, None] + bottom * fv[:, None]
    return out


class DigitsDVS:
    """The simulated recordings, one per digit image; tonic's dataset interface.

    ``dataset[i]`` is ``(events, label)``; ``sensor_size`` is ``(W, H, 2)``.
    """

    dtype = EVENT_DTYPE
    ordering = EVENT_DTYPE.names
    classes = [str(i) for i in range(10)]
    #: The recording settings (the keyword arguments besides ``seed`` and ``transform``).
    SETTINGS = ("digit_size", "saccade", "saccade_ms", "steps_per_saccade", "threshold", "threshold_mismatch",
                "noise_rate_hz")
    BLOCK = 128  # recordings simulated together
    KEEP_BLOCKS = 16  # blocks kept in memory (all of them: the train and validation passes share blocks)

    def __init__(
        self,
        digit_size: int = 12,
        saccade: int = 2,
        saccade_ms: float = 100.0,
        steps_per_saccade: int = 12,
        threshold: float = 0.25,
        threshold_mismatch: float = 0.03,
        noise_rate_hz: float = 0.5,
        seed: int = 0,
        transform: Any = None,
    ) -> None:
        from sklearn.datasets import load_digits

        #: the settings as given, which name the frame cache of a datamodule built on these recordings
        self.settings = {"digit_size": digit_size, "saccade": saccade, "saccade_ms": saccade_ms,
                         "steps_per_saccade": steps_per_saccade, "threshold": threshold,
                         "threshold_mismatch": threshold_mismatch, "noise_rate_hz": noise_rate_hz}
        self.digit_size = positive_int("digit_size", digit_size)
        self.saccade = positive_int("saccade", saccade)
        self.saccade_ms = number("saccade_ms", saccade_ms)
        self.steps = positive_int("steps_per_saccade", steps_per_saccade)
        self.threshold = number("threshold", threshold)
        self.mismatch = number("threshold_mismatch", threshold_mismatch)
        self.noise_rate = number("noise_rate_hz", noise_rate_hz)
        if self.saccade_ms <= 0 or self.threshold <= 0 or self.mismatch < 0 or self.noise_rate < 0:
            raise ValueError(
                f"saccade_ms={saccade_ms!r} and threshold={threshold!r} must be > 0, threshold_mismatch="
                f"{threshold_mismatch!r} and noise_rate_hz={noise_rate_hz!r} >= 0")
        self.seed = int(seed)
        self.transform = transform
        digits = load_digits()
        self.images = digits.images.astype(np.float32) / 16.0  # [N, 8, 8] in [0, 1]
        self.targets = digits.target.astype(np.int64)
        self.size = self.digit_size + 2 * self.saccade
        self.sensor_size = (self.size, self.size, 2)
        self._blocks: dict[int, list[np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.targets)

    def _upsampled(self, indices: list[int]) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        img = torch.from_numpy(self.images[np.asarray(indices, np.int64)])[:, None]
        img = F.interpolate(img, size=self.digit_size, mode="bilinear", align_corners=False)
        return img[:, 0].clamp(0, 1).numpy()

    def path(self) -> np.ndarray:
        """Sensor offsets ``[3 * steps + 1, 2]`` (x, y) of the digit along the three saccades."""
        a = self.saccade
        corners = np.array([[a, a], [2 * a, 2 * a], [0, 2 * a], [a, a]], np.float32)  # a triangle, back to start
        # start from the centre: the first saccade goes down-right, the second left, the third back up-right
        pts = [corners[0]]
        for k in range(3):
            f = np.arange(1, self.steps + 1, dtype=np.float32)[:, None] / np.float32(self.steps)
            pts.extend(corners[k] + f * (corners[k + 1] - corners[k]))
        return np.stack(pts)

    def record(self, index: int) -> np.ndarray:
        """The event stream of digit ``index``, sorted by time."""
        return self.record_many([index])[0]

    def record_many(self, indices: list[int]) -> list[np.ndarray]:
        """The event streams of several digits, simulated together (each depends only on ``(seed, index)``)."""
        rngs = [np.random.default_rng([self.seed, int(i)]) for i in indices]
        s, n = self.size, len(indices)
        thr = np.stack([np.clip(self.threshold + self.mismatch * r.standard_normal((s, s), np.float32), 0.05, None)
                        for r in rngs])
        path = self.path()
        log_i = np.log(_on_sensor(self._upsampled(indices), s, path) + np.float32(0.1))  # a dim screen: black is not zero light
        ref = log_i[0].copy()
        found = []  # per step: (sample, y, x, count, on)
        for k in range(1, len(path)):
            diff = log_i[k] - ref
            cnt = np.floor(np.abs(diff) / thr).astype(np.int64)
            b, yy, xx = np.nonzero(cnt)
            c = cnt[b, yy, xx]
            on = diff[b, yy, xx] > 0
            ref[b, yy, xx] += np.where(on, 1, -1).astype(np.float32) * c * thr[b, yy, xx]
            found.append((np.full(len(b), k - 1), b, yy, xx, c, on))
        step_ = np.concatenate([f[0] for f in found])
        b_, y_, x_, c_, on_ = (np.concatenate([f[i] for f in found]) for i in range(1, 6))
        order = np.argsort(b_, kind="stable")  # by sample, steps in order within each
        step_, b_, y_, x_, c_, on_ = step_[order], b_[order], y_[order], x_[order], c_[order], on_[order]
        bounds = np.searchsorted(b_, np.arange(n + 1))
        step_us = self.saccade_ms * 1000.0 / self.steps
        duration_us = 3 * self.saccade_ms * 1000.0
        out = []
        for j, rng in enumerate(rngs):
            sl = slice(bounds[j], bounds[j + 1])
            counts = c_[sl]
            m = int(counts.sum())
            t = (np.repeat(step_[sl], counts) + rng.random(m)) * step_us
            n_noise = rng.poisson(self.noise_rate * s * s * duration_us * 1e-6)
            x = np.concatenate([np.repeat(x_[sl], counts), rng.integers(0, s, n_noise)])
            y = np.concatenate([np.repeat(y_[sl], counts), rng.integers(0, s, n_noise)])
            p = np.concatenate([np.repeat(on_[sl], counts).astype(np.int8), rng.integers(0, 2, n_noise).astype(np.int8)])
            t = np.concatenate([t, rng.random(n_noise) * duration_us])
            o = np.argsort(t, kind="stable")
            events = np.empty(len(t), EVENT_DTYPE)
            events["x"], events["y"], events["t"], events["p"] = x[o], y[o], t[o].astype(np.int64), p[o]
            out.append(events)
        return out

    def release(self) -> None:
        """Forget the recordings kept in memory (they are made again when asked for)."""
        self._blocks.clear()

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        block = index // self.BLOCK
        if block not in self._blocks:  # simulate a block of recordings at once: far faster than one by one
            lo = block * self.BLOCK
            if len(self._blocks) >= self.KEEP_BLOCKS:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[block] = self.record_many(list(range(lo, min(lo + self.BLOCK, len(self)))))
        events = self._blocks[block][index % self.BLOCK]
        if self.transform is not None:
            events = self.transform(events)
        return events, int(self.targets[index])


class _Indexed:
    """A subset of a dataset (picklable, for loader workers)."""

    def __init__(self, dataset: Any, indices: np.ndarray) -> None:
        self.dataset, self.indices = dataset, [int(i) for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.dataset[self.indices[i]]


class DigitsDVSDataModule(EventDataModule):
    """Simulated DVS recordings of the bundled digits (offline): stratified train/validation split.

    ``root`` holds only the frame cache. The generator's settings (:attr:`DigitsDVS.SETTINGS`) are
    keyword arguments of :class:`DigitsDVS`, with its defaults; the other keyword arguments are those of
    :class:`EventDataModule`. ``max_recordings`` keeps only the first N digits (quick checks).
    """

    num_classes = 10
    classes = [str(i) for i in range(10)]

    def __init__(
        self,
        root: str = "data/digits_dvs",
        val_fraction: float = 0.2,
        max_recordings: int | None = None,
        **kwargs: Any,
    ) -> None:
        settings = {k: kwargs.pop(k) for k in DigitsDVS.SETTINGS if k in kwargs}
        super().__init__(root=root, **kwargs)
        self.max_recordings = None if max_recordings is None else positive_int("max_recordings", max_recordings)
        self.dataset = DigitsDVS(**settings, seed=self.seed)  # validates the settings
        self.generator = self.dataset.settings
        self.sensor_size = self.dataset.sensor_size
        self.val_fraction = check_fraction("val_fraction", val_fraction)

    def _identity(self) -> dict[str, Any]:
        return {"generator": self.generator, "seed": self.seed, "val_fraction": self.val_fraction,
                "max_recordings": self.max_recordings}

    def _splits(self) -> tuple[Any, Any]:
        from sklearn.model_selection import train_test_split

        n = len(self.dataset) if self.max_recordings is None else min(self.max_recordings, len(self.dataset))
        train_idx, val_idx = train_test_split(np.arange(n), test_size=self.val_fraction, random_state=self.seed,
                                              stratify=self.dataset.targets[:n])
        return _Indexed(self.dataset, np.sort(train_idx)), _Indexed(self.dataset, np.sort(val_idx))

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        self.dataset.release()  # the recordings are framed and cached now
