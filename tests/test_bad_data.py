"""Bad data never trains silently: unreadable images and impossible boxes raise errors naming the
file (and the annotation line), or, where a setting allows it, are skipped and counted."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from snntrain.data.common import BadDataError, open_image
from snntrain.data.detection import read_rgb
from snntrain.data.image_folder import ImageFolderDataModule
from snntrain.data.widerface import WiderFaceDataset


def jpeg_bytes(h: int = 24, w: int = 20) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("content, what", [(lambda b: b[: len(b) // 2], "truncated"),
                                           (lambda b: b"not an image at all", "not an image")])
def test_unreadable_image_names_the_file(tmp_path, content, what):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(content(jpeg_bytes()))
    for read in (open_image, read_rgb, lambda p: read_rgb(p, min_side=8)):
        with pytest.raises(BadDataError, match=rf"image {bad} cannot be read.*truncated, corrupt or not an image"):
            read(bad)
    with pytest.raises(FileNotFoundError):
        open_image(tmp_path / "missing.jpg")


def test_image_folder_with_a_truncated_file(tmp_path):
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            (tmp_path / cls / f"{i}.jpg").write_bytes(jpeg_bytes())
    bad = tmp_path / "dog" / "1.jpg"
    bad.write_bytes(jpeg_bytes()[:300])
    dm = ImageFolderDataModule(root=str(tmp_path), image_size=8, batch_size=2, val_fraction=0.5, num_workers=0)
    dm.setup()
    with pytest.raises(BadDataError, match=rf"image {bad} cannot be read"):
        for loader in (dm.train_dataloader(), dm.val_dataloader()):
            for _ in loader:
                pass


def wider_root(tmp_path: Path, box_line: str) -> Path:
    """One training image (20 high, 30 wide) with two faces; the second face's line is ``box_line``."""
    images = tmp_path / "WIDER_train" / "images" / "0--Parade"
    images.mkdir(parents=True)
    Image.fromarray(np.full((20, 30, 3), 40, np.uint8)).save(images / "a.jpg")
    (tmp_path / "wider_face_split").mkdir()
    (tmp_path / "wider_face_split" / "wider_face_train_bbx_gt.txt").write_text(
        f"0--Parade/a.jpg\n2\n2 2 6 6 0 0 0 0 0 0\n{box_line}\n")
    return tmp_path


def test_box_outside_its_image_names_the_line(tmp_path):
    root = wider_root(tmp_path, "40 5 6 6 0 0 0 0 0 0")  # x1 = 40 in a 30-wide image
    data = WiderFaceDataset(root, "train", 16)
    with pytest.raises(BadDataError, match=r"wider_face_train_bbx_gt.txt, line\(s\) 4: .*0--Parade/a.jpg lie wholly "
                                           r"outside the 30x20 image.*bad_boxes=skip"):
        data[0]
    skip = WiderFaceDataset(root, "train", 16, bad_boxes="skip")
    _, target = skip[0]
    _, target = skip[0]  # counted once per image
    assert target["boxes"].shape == (1, 4) and skip.skipped_boxes == 1
    with pytest.raises(ValueError, match="bad_boxes='drop' is not valid; choose one of error, skip"):
        WiderFaceDataset(root, "train", 16, bad_boxes="drop")


def test_box_partly_outside_is_clipped_and_invalid_boxes_are_ignored(tmp_path):
    root = wider_root(tmp_path, "25 5 10 6 0 0 0 0 0 0")  # reaches x = 35 > 30: clipped, kept
    _, target = WiderFaceDataset(root, "train", 30)[0]
    assert target["boxes"].shape == (2, 4)
    assert float(target["boxes"][:, 2].max()) <= 30.0 + 1e-4
    root2 = wider_root(tmp_path / "b", "40 5 6 6 0 0 0 1 0 0")  # flagged invalid: never a target
    _, target = WiderFaceDataset(root2, "train", 30)[0]
    assert target["boxes"].shape == (1, 4)
    assert torch.isfinite(target["boxes"]).all()
