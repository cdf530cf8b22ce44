"""``data=faces``: the offline synthetic face-detection datasets and their datamodule. How each image is
composed (faces, distractors, clutter, backgrounds, the exact boxes) is :mod:`snntrain.data.face_composer`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..validation import one_of
from .common import loader_workers, positive_int
from .detection import DetectionCollate, DetectionDataModule, TrainTransform, make_target, normalize_image
from .detection.resident import check_on_device
from .detection.settings import int_range
from .face_composer import (
    BACKGROUND_KINDS,
    LFW_FACES,
    PHOTOS,
    SPLITS,
    Composite,
    FaceComposer,
    background_photos,
    lfw_crops,
    split_rng,
)


class SyntheticFaces(Dataset):
    """``size`` composite images of one split, rendered lazily (and kept when ``cache``).

    Items are ``(image, target)`` in the format of :mod:`snntrain.data.detection`. Without ``transform``
    the image is the rendering itself (``scale`` (1, 1), ``pad`` (0, 0)); with a :class:`TrainTransform`
    it is randomly augmented on each access.
    """

    #: items draw only from torch's generator and generators of their own (see SeededDataset)
    reads_numpy_random = False

    def __init__(
        self,
        composer: FaceComposer,
        split: str,
        size: int,
        seed: int = 0,
        transform: TrainTransform | None = None,
        cache: bool = True,
    ) -> None:
        one_of("split", split, SPLITS)
        self.composer = composer
        self.split = split
        self.size = positive_int(f"number of {split} images", size)
        self.seed = int(seed)
        self.transform = transform
        self._cache: list[tuple[torch.Tensor, torch.Tensor] | None] | None = [None] * self.size if cache else None

    def __len__(self) -> int:
        return self.size

    def render(self, index: int) -> Composite:
        """Render image ``index`` (with its label map); a pure function of ``(seed, split, index)``."""
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} is out of range for {self.size} {self.split} images")
        return self.composer.render(split_rng(self.seed, self.split, index))

    def _raw(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cache is not None and self._cache[index] is not None:
            return self._cache[index]  # type: ignore[return-value]
        comp = self.render(index)
        item = (torch.from_numpy(comp.image).permute(2, 0, 1).contiguous(), torch.from_numpy(comp.boxes))
        if self._cache is not None:
            self._cache[index] = item
        return item

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict]:
        image, boxes = self._raw(index)
        s = self.composer.image_size
        labels = torch.zeros(boxes.shape[0], dtype=torch.int64)
        if self.transform is None:
            one, zero = torch.ones(2), torch.zeros(2)
            return normalize_image(image), make_target(boxes, index, (s, s), one, zero, labels)
        image, boxes, labels = self.transform(image, boxes, labels)
        return image, make_target(boxes, index, (s, s), labels=labels)


class _Rendered(Dataset):
    """Item ``i``: training image ``i`` of ``faces`` as rendered (uint8 ``[3, S, S]``, not augmented or
    normalised) and its target, for :func:`~snntrain.data.detection.collate_detection`."""

    def __init__(self, faces: SyntheticFaces) -> None:
        self.faces = faces

    def __len__(self) -> int:
        return len(self.faces)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict]:
        image, boxes = self.faces._raw(index)
        return image, make_target(boxes, index, tuple(image.shape[-2:]))


class FacesDataModule(DetectionDataModule):
    """``data=faces``: synthetic face detection from scikit-image's LFW crops, fully offline.

    ``num_train``/``num_val``/``num_test`` images of ``image_size`` x ``image_size`` (RGB), composed as
    the module docstring describes (``skin_tones``, ``context``, ``lighting``, ``occlusion`` and ``blur``
    are probabilities; ``clutter_per_image`` a ``[min, max]`` count). Training images are augmented (when
    ``augment``) with
    :class:`~snntrain.data.detection.TrainTransform` (``hflip``, ``zoom_out``, ``crop_scale``,
    ``min_visibility``, ``min_box_size``). ``max_boxes=None`` pads every batch to the most faces an
    image can hold (``faces_per_image[1]``), so batch shapes are fixed and nothing is dropped.
    """

    def __init__(
        self,
        num_train: int = 2000,
        num_val: int = 300,
        num_test: int = 300,
        image_size: int = 64,
        faces_per_image: Sequence[int] = (1, 3),
        face_size: Sequence[int] = (10, 48),
        distractors_per_image: Sequence[int] = (0, 2),
        max_overlap: float = 0.25,
        held_out_faces: int = 20,
        backgrounds: Sequence[str] = ("tiles", "photos", "textures"),
        skin_tones: float = 0.8,
        context: float = 0.5,
        lighting: float = 0.5,
        occlusion: float = 0.25,
        blur: float = 0.3,
        clutter_per_image: Sequence[int] = (0, 0),
        augment: bool = True,
        hflip: float = 0.5,
        zoom_out: float = 1.5,
        crop_scale: Sequence[float] = (0.5, 1.0),
        min_visibility: float = 0.5,
        min_box_size: float = 2.0,
        batch_size: int = 32,
        num_workers: int | str = 0,
        max_boxes: int | None = None,
        cache: bool = True,
        on_device: bool | str = "auto",
        seed: int = 0,
    ) -> None:
        fpi = int_range("faces_per_image", faces_per_image, minimum=0)
        self.on_device = check_on_device(on_device)
        rows = max_boxes if max_boxes is not None else max(1, fpi[1])
        super().__init__(image_size, batch_size, num_workers, rows, seed)
        self.num_train = positive_int("num_train", num_train)
        self.num_val = positive_int("num_val", num_val)
        self.num_test = positive_int("num_test", num_test)
        if (isinstance(held_out_faces, bool) or not isinstance(held_out_faces, int)
                or not 0 <= held_out_faces < LFW_FACES):
            raise ValueError(f"held_out_faces={held_out_faces!r} must be an integer in [0, {LFW_FACES - 1}]")
        self.held_out_faces = held_out_faces
        self.augment = bool(augment)
        self.cache = bool(cache)
        self._composer_args = dict(
            image_size=self.image_size,
            faces_per_image=fpi,
            face_size=face_size,
            distractors_per_image=distractors_per_image,
            max_overlap=max_overlap,
            backgrounds=tuple(backgrounds) if not isinstance(backgrounds, str) else (backgrounds,),
            skin_tones=skin_tones,
            context=context,
            lighting=lighting,
            occlusion=occlusion,
            blur=blur,
            clutter_per_image=clutter_per_image,
        )
        # Validate every setting now (no crops needed for that), not at the first batch.
        dummy = np.zeros((1, 2, 2), dtype=np.float32)
        FaceComposer(dummy, dummy, photos=(np.zeros((2, 2, 3), np.uint8),), **self._composer_args)
        self.train_transform = (
            TrainTransform(self.image_size, hflip, zoom_out, crop_scale, min_visibility=min_visibility,
                           min_box_size=min_box_size)
            if self.augment
            else None
        )

    def composer(self, split: str) -> FaceComposer:
        """The renderer of ``split``: train draws from the first crops, val/test from the held-out ones."""
        faces, non_faces = lfw_crops()
        k = self.held_out_faces
        if k == 0:
            pool = (faces, non_faces)
        elif split == "train":
            pool = (faces[:-k], non_faces[:-k])
        else:
            pool = (faces[-k:], non_faces[-k:])
        photos = background_photos() if "photos" in self._composer_args["backgrounds"] else ()
        return FaceComposer(pool[0], pool[1], photos=photos, **self._composer_args)

    def resident_bytes(self) -> int:
        return self.num_train * 3 * self.image_size * self.image_size

    def resident_transform(self) -> TrainTransform | None:
        return self.train_transform

    def resident_arrays(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every training image rendered once (by the loader processes :func:`loader_workers` gives, in order),
        with its boxes padded to ``max_boxes`` rows (an image with more keeps its largest)."""
        if self.train_set is None:
            raise RuntimeError("FacesDataModule.setup() must run before its training set is rendered")
        loader = DataLoader(_Rendered(self.train_set), batch_size=64, shuffle=False, num_workers=loader_workers(self),
                            collate_fn=DetectionCollate(self.max_boxes, drop=True))
        parts = [(images, t["boxes"], t["labels"], t["num_boxes"]) for images, t in loader]
        return tuple(torch.cat(column) for column in zip(*parts))  # type: ignore[return-value]

    def setup(self, stage: str | None = None) -> None:
        """Create the three splits (idempotent; images are rendered on first access)."""
        if self.train_set is not None:
            return
        self.train_set = SyntheticFaces(self.composer("train"), "train", self.num_train, self.seed,
                                        self.train_transform, self.cache)
        self.val_set = SyntheticFaces(self.composer("val"), "val", self.num_val, self.seed, None, self.cache)
        self.test_set = SyntheticFaces(self.composer("test"), "test", self.num_test, self.seed, None, self.cache)


__all__ = [
    "BACKGROUND_KINDS",
    "PHOTOS",
    "Composite",
    "FaceComposer",
    "FacesDataModule",
    "SyntheticFaces",
    "background_photos",
    "lfw_crops",
    "split_rng",
]
