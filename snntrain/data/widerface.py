"""WIDER FACE in its official layout.

Expected under ``root`` (unpack WIDER_train.zip, WIDER_val.zip and wider_face_split.zip there)::

    root/WIDER_train/images/<event>/<name>.jpg
    root/WIDER_val/images/<event>/<name>.jpg
    root/wider_face_split/wider_face_train_bbx_gt.txt
    root/wider_face_split/wider_face_val_bbx_gt.txt
    root/eval_tools/ground_truth/wider_{easy,medium,hard}_val.mat     (optional, from eval_tools.zip)

Annotation format (``wider_face_*_bbx_gt.txt``): repeated records of an image path relative to
``WIDER_<split>/images``, a line with the face count ``n``, then ``n`` lines of ten integers
``x1 y1 w h blur expression illumination invalid occlusion pose``. An image with no face has count 0
followed by one placeholder line of ten zeros, which is consumed and gives no box. Parsing is strict:
anything else raises ``ValueError`` naming the file and line.

Boxes kept as training/validation targets: every annotated box except those flagged ``invalid`` and
those with ``w <= 0`` or ``h <= 0``; a kept box is clipped to the image. A kept box that lies wholly
outside its image is an error naming the annotation file and line (``bad_boxes="skip"``: it is
dropped, counted and logged). An image that cannot be decoded is an error naming the file.
Every record also keeps *all* annotated boxes with their attributes, since the official easy / medium /
hard protocol matches detections against all of them and counts only the boxes its ``gt_list`` names.

The official test split has no public boxes; ``test_dataloader`` gives the validation set, which is the
benchmark split of WIDER FACE.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..validation import one_of
from .common import BadDataError, positive_int
from .detection import DetectionDataModule, SquareCropTransform, TrainTransform, fit_long_side, make_target, read_rgb

URL = "http://shuoyang1213.me/WIDERFACE/"
SPLITS = ("train", "val")
DIFFICULTIES = ("easy", "medium", "hard")
#: Column names of the ten integers of an annotation line.
ATTRIBUTES = ("x1", "y1", "w", "h", "blur", "expression", "illumination", "invalid", "occlusion", "pose")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
#: What to do with an annotated box that lies wholly outside its image.
BAD_BOXES = ("error", "skip")

log = logging.getLogger(__name__)


def missing_message(root: Path, missing: Path) -> str:
    """The error text for an incomplete WIDER FACE folder: what is missing, what to download, where."""
    return (
        f"WIDER FACE is not complete in {root}: {missing} does not exist. Download WIDER_train.zip, "
        f"WIDER_val.zip and wider_face_split.zip from {URL} and unpack all three into {root}, so that it "
        "holds WIDER_train/images/<event>/*.jpg, WIDER_val/images/<event>/*.jpg and "
        "wider_face_split/wider_face_train_bbx_gt.txt + wider_face_val_bbx_gt.txt; or point data.root "
        "at a folder that has them. Optional, for the easy/medium/hard protocol: unpack eval_tools.zip "
        "there too, so that eval_tools/ground_truth/wider_easy_val.mat etc. exist."
    )


@dataclass(frozen=True)
class WiderFaceRecord:
    """One annotated image.

    ``path``: relative to ``WIDER_<split>/images`` (``"<event>/<name>.jpg"``). ``boxes``: float32
    ``[n, 4]`` xyxy of *all* annotated faces in original pixels (``x1, y1, x1 + w, y1 + h``), in file
    order. ``attributes``: int64 ``[n, 6]`` = blur, expression, illumination, invalid, occlusion, pose.
    ``keep``: bool ``[n]``, the boxes used as targets (not invalid, ``w > 0`` and ``h > 0``).
    ``difficulty``: ``None``, or per level (``"easy"``, ``"medium"``, ``"hard"``) a bool ``[n]`` marking
    the boxes that the official evaluation counts at that level. ``line``: 1-based line of ``path``.
    """

    path: str
    boxes: np.ndarray
    attributes: np.ndarray
    keep: np.ndarray
    line: int
    difficulty: dict[str, np.ndarray] | None = field(default=None, compare=False)

    @property
    def event(self) -> str:
        """The event folder, e.g. ``"0--Parade"``."""
        return self.path.rsplit("/", 1)[0] if "/" in self.path else ""

    @property
    def name(self) -> str:
        """The file name without extension, as the official evaluation lists it."""
        return Path(self.path).stem

    @property
    def invalid(self) -> np.ndarray:
        """bool ``[n]``: the official ``invalid`` flag of each box."""
        return self.attributes[:, 3] == 1


def parse_annotations(path: str | Path) -> list[WiderFaceRecord]:
    """Parse a ``wider_face_{train,val}_bbx_gt.txt`` file exactly (see the module docstring).

    Raises ``FileNotFoundError`` when the file is missing and ``ValueError`` naming the file and the
    1-based line number for anything that does not follow the format.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"WIDER FACE annotation file {path} does not exist")
    lines = path.read_text(encoding="utf-8").splitlines()
    # Trailing blank lines are tolerated; blank lines inside are not.
    while lines and not lines[-1].strip():
        lines.pop()
    records: list[WiderFaceRecord] = []
    i = 0

    def fail(line_no: int, why: str) -> ValueError:
        return ValueError(f"{path}, line {line_no}: {why}")

    def ints(line_no: int, what: str) -> list[int]:
        if line_no > len(lines):
            raise fail(line_no, f"the file ends where {what} was expected")
        parts = lines[line_no - 1].split()
        if len(parts) != 10:
            raise fail(line_no, f"expected {what} (10 integers: {' '.join(ATTRIBUTES)}), got {lines[line_no - 1]!r}")
        try:
            return [int(p) for p in parts]
        except ValueError:
            raise fail(line_no, f"expected {what} (10 integers), got {lines[line_no - 1]!r}") from None

    while i < len(lines):
        line_no = i + 1
        rel = lines[i].strip()
        if not rel:
            raise fail(line_no, "blank line where an image path was expected")
        if not rel.lower().endswith(_IMAGE_SUFFIXES) or rel.startswith("/") or ".." in rel.split("/"):
            raise fail(line_no, f"expected an image path relative to WIDER_<split>/images "
                                f"(<event>/<name>.jpg), got {rel!r}")
        if i + 1 >= len(lines):
            raise fail(line_no + 1, f"the file ends where the face count of {rel!r} was expected")
        count_text = lines[i + 1].strip()
        try:
            count = int(count_text)
        except ValueError:
            raise fail(line_no + 1, f"expected the face count of {rel!r} (an integer >= 0), "
                                    f"got {count_text!r}") from None
        if count < 0:
            raise fail(line_no + 1, f"face count {count} of {rel!r} is negative")
        first = line_no + 2
        if count == 0:
            values = ints(first, f"the placeholder line of ten zeros that follows a count of 0 for {rel!r}")
            if any(values):
                raise fail(first, f"{rel!r} has 0 faces, so this line must be ten zeros, got {lines[first - 1]!r}")
            rows: list[list[int]] = []
            i += 3
        else:
            rows = [ints(first + k, f"box {k + 1} of {count} of {rel!r}") for k in range(count)]
            i += 2 + count
        arr = np.asarray(rows, dtype=np.int64).reshape(-1, 10)
        for k, row in enumerate(arr):
            if row[7] not in (0, 1):
                raise fail(first + k, f"invalid flag must be 0 or 1, got {row[7]}")
        x, y, w, h = (arr[:, c].astype(np.float32) for c in range(4))
        boxes = np.stack([x, y, x + w, y + h], axis=1).reshape(-1, 4)
        keep = (arr[:, 7] == 0) & (arr[:, 2] > 0) & (arr[:, 3] > 0)
        records.append(WiderFaceRecord(rel, boxes, arr[:, 4:].copy(), keep, line_no))
    return records


# --------------------------------------------------------------------------------------------------
# Official difficulty lists (eval_tools/ground_truth/wider_{easy,medium,hard}_val.mat)
# --------------------------------------------------------------------------------------------------


def _mat_text(value: object) -> str:
    """Unwrap a MATLAB string as ``scipy.io.loadmat`` returns it (nested 1-element arrays)."""
    while isinstance(value, np.ndarray):
        if value.dtype.kind == "U":
            return "".join(str(v) for v in value.ravel())
        if value.size != 1:
            raise ValueError(f"expected a string, got an array of shape {value.shape}")
        value = value.ravel()[0]
    return str(value)


def _mat_cells(value: object) -> list[object]:
    """The elements of a MATLAB cell array (any shape), in MATLAB's column-major order."""
    arr = np.asarray(value, dtype=object)
    return list(arr.ravel(order="F"))


def load_difficulty_lists(ground_truth: str | Path) -> dict[str, dict[tuple[str, str], np.ndarray]] | None:
    """Read the official ``wider_{easy,medium,hard}_val.mat`` files, if all three exist.

    Returns ``{level: {(event, name): 0-based indices}}``: for each validation image (event folder and
    file name without extension), the indices into that image's annotated boxes (file order, all boxes)
    that count at ``level`` -- the official ``gt_list`` (1-based in the file). ``None`` when the files
    are absent. Each file must hold ``gt_list`` (per event a cell with one index array per image) and
    the ``event_list`` / ``file_list`` it follows, as eval_tools ships them; where those two are
    missing they are read from ``wider_face_val.mat`` in the same folder.
    """
    folder = Path(ground_truth)
    files = {level: folder / f"wider_{level}_val.mat" for level in DIFFICULTIES}
    if not all(f.is_file() for f in files.values()):
        return None
    from scipy.io import loadmat

    shared: dict[str, object] | None = None
    out: dict[str, dict[tuple[str, str], np.ndarray]] = {}
    for level, file in files.items():
        mat = loadmat(str(file))
        if "gt_list" not in mat:
            raise ValueError(f"{file} has no 'gt_list'; expected the official eval_tools ground truth")
        if "event_list" not in mat or "file_list" not in mat:
            if shared is None:
                names_file = folder / "wider_face_val.mat"
                if not names_file.is_file():
                    raise ValueError(f"{file} has no event_list/file_list and {names_file} does not exist")
                shared = loadmat(str(names_file))
                if "event_list" not in shared or "file_list" not in shared:
                    raise ValueError(f"{names_file} has no event_list/file_list")
            mat = {**mat, "event_list": shared["event_list"], "file_list": shared["file_list"]}
        events, file_lists, gt_lists = (_mat_cells(mat[k]) for k in ("event_list", "file_list", "gt_list"))
        if not len(events) == len(file_lists) == len(gt_lists):
            raise ValueError(f"{file}: event_list, file_list and gt_list have different lengths")
        table: dict[tuple[str, str], np.ndarray] = {}
        for event, names, gts in zip(events, file_lists, gt_lists):
            event_name = _mat_text(event)
            names, gts = _mat_cells(names), _mat_cells(gts)
            if len(names) != len(gts):
                raise ValueError(
                    f"{file}: event {event_name!r} lists {len(names)} files but {len(gts)} gt_list cells"
                )
            for name, gt in zip(names, gts):
                idx = np.asarray(gt, dtype=np.float64).ravel()
                if idx.size and (np.any(idx < 1) or np.any(idx != np.round(idx))):
                    raise ValueError(
                        f"{file}: gt_list of {event_name}/{_mat_text(name)} holds indices that are not 1-based"
                    )
                table[(event_name, _mat_text(name))] = np.sort(idx.astype(np.int64) - 1)
        out[level] = table
    return out


def attach_difficulty(
    records: Sequence[WiderFaceRecord], lists: dict[str, dict[tuple[str, str], np.ndarray]], source: str
) -> list[WiderFaceRecord]:
    """Return copies of ``records`` with ``difficulty`` masks built from :func:`load_difficulty_lists`.

    Every image of the lists must be among ``records`` and every index must name one of its boxes;
    otherwise the annotation and evaluation files do not belong together and ``ValueError`` says so.
    Images of ``records`` absent from the lists count for no level (all-False masks).
    """
    by_key = {(r.event, r.name): j for j, r in enumerate(records)}
    masks = [{level: np.zeros(len(r.boxes), dtype=bool) for level in lists} for r in records]
    for level, table in lists.items():
        for key, idx in table.items():
            j = by_key.get(key)
            if j is None:
                raise ValueError(f"{source}: {level} list names {key[0]}/{key[1]}, which the annotation file lacks")
            n = len(records[j].boxes)
            if idx.size and idx.max() >= n:
                raise ValueError(
                    f"{source}: {level} list refers to box {int(idx.max()) + 1} of {key[0]}/{key[1]}, "
                    f"which has {n} annotated boxes"
                )
            masks[j][level][idx] = True
    from dataclasses import replace

    return [replace(r, difficulty=m) for r, m in zip(records, masks)]


# --------------------------------------------------------------------------------------------------
# Dataset and DataModule
# --------------------------------------------------------------------------------------------------


class WiderFaceDataset(Dataset):
    """One split of WIDER FACE as detection samples (format of :mod:`snntrain.data.detection`).

    Without ``transform`` an image keeps its aspect ratio and its original resolution, its longer side
    shrunk to at most ``eval_max_side`` when that is set (:func:`~snntrain.data.detection.fit_long_side`;
    ``scale``/``pad`` recorded, so predictions map back to the file's pixels). With a transform
    (:class:`~snntrain.data.detection.SquareCropTransform` or
    :class:`~snntrain.data.detection.TrainTransform`) it is randomly augmented to ``image_size`` instead.
    """

    #: items draw only from torch's generator and generators of their own (see SeededDataset)
    reads_numpy_random = False

    def __init__(
        self,
        root: str | Path,
        split: str,
        image_size: int,
        transform: SquareCropTransform | TrainTransform | None = None,
        difficulty: bool = True,
        eval_max_side: int | None = None,
        bad_boxes: str = "error",
    ) -> None:
        one_of("split", split, SPLITS)
        one_of("bad_boxes", bad_boxes, BAD_BOXES)
        self.bad_boxes = bad_boxes
        self.skipped_boxes = 0  # boxes dropped by bad_boxes="skip" (in this process)
        self._skipped: set[int] = set()
        self.root = Path(root).expanduser()
        self.split = split
        self.image_size = int(image_size)
        self.transform = transform
        self.eval_max_side = None if eval_max_side is None else positive_int("eval_max_side", eval_max_side)
        self.image_dir = self.root / f"WIDER_{split}" / "images"
        self.annotation_file = self.root / "wider_face_split" / f"wider_face_{split}_bbx_gt.txt"
        for needed in (self.image_dir, self.annotation_file):
            if not needed.exists():
                raise FileNotFoundError(missing_message(self.root, needed))
        records = parse_annotations(self.annotation_file)
        for r in records:
            if not (self.image_dir / r.path).is_file():
                raise FileNotFoundError(missing_message(self.root, self.image_dir / r.path))
        if split == "val" and difficulty:
            gt_dir = self.root / "eval_tools" / "ground_truth"
            lists = load_difficulty_lists(gt_dir)
            if lists is not None:
                records = attach_difficulty(records, lists, str(gt_dir))
        self.records: list[WiderFaceRecord] = records

    def __len__(self) -> int:
        return len(self.records)

    def _outside_boxes(self, index: int, outside: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """Boxes (of the kept ones) that lie wholly outside their image: an error naming the annotation
        line, or with ``bad_boxes="skip"`` dropped, counted in ``skipped_boxes`` and logged."""
        record = self.records[index]
        kept = np.flatnonzero(record.keep)
        lines = [record.line + 2 + int(kept[k]) for k in torch.nonzero(outside).flatten().tolist()]
        what = (f"{self.annotation_file}, line(s) {', '.join(map(str, lines))}: box(es) of {record.path} lie wholly "
                f"outside the {size[1]}x{size[0]} image")
        if self.bad_boxes == "error":
            raise BadDataError(f"{what}; fix the annotation, or set data.bad_boxes=skip to drop such boxes")
        if index not in self._skipped:
            self._skipped.add(index)
            self.skipped_boxes += len(lines)
            log.warning("%s; dropped (data.bad_boxes=skip, %d so far)", what, self.skipped_boxes)
        return outside

    def image_path(self, index: int) -> Path:
        """Full path of image ``index``."""
        return self.image_dir / self.records[index].path

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict]:
        record = self.records[index]
        # A reduced JPEG decode keeps enough pixels for the evaluation size or a resized crop; square crops
        # may enlarge a small part of the image, so they read every pixel.
        if self.transform is None:
            min_side = self.eval_max_side
        elif isinstance(self.transform, SquareCropTransform):
            min_side = None
        else:
            min_side = self.image_size * 2
        image, (h, w) = read_rgb(self.image_path(index), min_side=min_side)
        boxes = torch.from_numpy(record.boxes[record.keep]).clone()
        outside = (boxes[:, 0] >= w) | (boxes[:, 1] >= h) | (boxes[:, 2] <= 0) | (boxes[:, 3] <= 0)
        if outside.any():
            boxes = boxes[~self._outside_boxes(index, outside, (h, w))]
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
        boxes = boxes[(boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])]
        if self.transform is None:
            out, scale, pad = fit_long_side(image, self.eval_max_side, orig_size=(h, w))
            return out, make_target(boxes * scale.repeat(2), index, (h, w), scale, pad)
        dh, dw = image.shape[-2:]
        if (dh, dw) != (h, w):  # reduced decode: move the boxes to its pixels
            boxes = boxes * torch.tensor([dw / w, dh / h, dw / w, dh / h], dtype=torch.float32)
        labels = torch.zeros(boxes.shape[0], dtype=torch.int64)
        out, boxes, labels = self.transform(image, boxes, labels)
        return out, make_target(boxes, index, (h, w), labels=labels)


class WiderFaceDataModule(DetectionDataModule):
    """``data=widerface``: WIDER FACE train / val from ``root`` in the official layout (no download).

    Training (``augment``): the RetinaFace / SCRFD recipe, :class:`~snntrain.data.detection.SquareCropTransform`
    (random squares of ``crop_scale`` times the short side resized to ``image_size``, flip, photometric
    jitter); without ``augment`` training images are used like evaluation images. Validation and test
    (= val): each image at its original resolution, or with its longer side shrunk to ``eval_max_side``,
    batched by padding at the bottom and right to a multiple of ``size_divisor``. Training batches hold
    ``max_boxes`` rows (an image with more faces keeps its largest); evaluation batches never drop a box.
    ``val_set.records`` holds every image's path, all annotated boxes and, when eval_tools is present,
    the official difficulty masks.
    """

    def __init__(
        self,
        root: str | None = None,
        image_size: int = 640,
        augment: bool = True,
        crop_scale: Sequence[float] = (0.3, 1.0),
        hflip: float = 0.5,
        photometric: bool = True,
        min_box_size: float = 2.0,
        eval_max_side: int | None = None,
        size_divisor: int = 32,
        batch_size: int = 16,
        num_workers: int | str = 4,
        max_boxes: int | None = 256,
        seed: int = 0,
        bad_boxes: str = "error",
    ) -> None:
        super().__init__(image_size, batch_size, num_workers, max_boxes, seed)
        self.bad_boxes = one_of("bad_boxes", bad_boxes, BAD_BOXES)
        if root is None:
            raise ValueError(f"data=widerface needs data.root=<folder with WIDER FACE from {URL}>")
        self.root = Path(root).expanduser()
        self.augment = bool(augment)
        self.eval_max_side = None if eval_max_side is None else positive_int("eval_max_side", eval_max_side)
        self.size_divisor = positive_int("size_divisor", size_divisor)
        self.train_transform = (
            SquareCropTransform(self.image_size, crop_scale, hflip, photometric, min_box_size)
            if self.augment
            else None
        )

    def prepare_data(self) -> None:
        """Check that the files are in place (nothing is downloaded: WIDER FACE needs a manual download)."""
        for needed in (
            self.root / "WIDER_train" / "images",
            self.root / "WIDER_val" / "images",
            self.root / "wider_face_split" / "wider_face_train_bbx_gt.txt",
            self.root / "wider_face_split" / "wider_face_val_bbx_gt.txt",
        ):
            if not needed.exists():
                raise FileNotFoundError(missing_message(self.root, needed))

    def setup(self, stage: str | None = None) -> None:
        """Parse the annotations and check every image file (idempotent)."""
        if self.val_set is not None:
            return
        self.prepare_data()
        self.train_set = WiderFaceDataset(self.root, "train", self.image_size, self.train_transform,
                                          eval_max_side=self.eval_max_side, bad_boxes=self.bad_boxes)
        self.val_set = WiderFaceDataset(self.root, "val", self.image_size, None, eval_max_side=self.eval_max_side,
                                        bad_boxes=self.bad_boxes)
        self.test_set = self.val_set


__all__ = [
    "ATTRIBUTES",
    "DIFFICULTIES",
    "URL",
    "WiderFaceDataModule",
    "WiderFaceDataset",
    "WiderFaceRecord",
    "attach_difficulty",
    "load_difficulty_lists",
    "missing_message",
    "parse_annotations",
]
