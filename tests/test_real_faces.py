"""scripts/real_faces.py: the annotated real photographs and the scores it reports."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "real_faces.py"


@pytest.fixture(scope="module")
def real_faces():
    spec = importlib.util.spec_from_file_location("real_faces", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_annotated_photos_are_installed_and_boxes_lie_on_them(real_faces):
    photos, missing = real_faces.load_photos()
    names = {p["name"] for p in photos}
    # the dev extra installs the packages that ship the group photograph and the portraits
    assert {"group", "astronaut", "camera"} <= names, f"not installed: {missing} (pip install -e '.[dev]')"
    group = next(p for p in photos if p["name"] == "group")
    assert len(group["faces"]) == 6
    for photo in photos:
        w, h = Image.open(photo["path"]).size
        faces = photo["faces"]
        assert (faces[:, 0] >= 0).all() and (faces[:, 2] <= w).all() and (faces[:, 1] >= 0).all()
        assert (faces[:, 3] <= h).all()
        sides = faces[:, 2:] - faces[:, :2]
        assert (sides >= 60).all() and (sides <= 250).all(), photo["name"]


def test_match_counts_each_face_once(real_faces):
    faces = np.array([[0, 0, 10, 10], [20, 0, 30, 10]], float)
    boxes = np.array([[0, 0, 10, 10], [1, 0, 10, 10], [20, 0, 30, 10], [50, 50, 60, 60], [21, 0, 30, 10]], float)
    scores = np.array([0.9, 0.8, 0.4, 0.7, 0.6])
    found, elsewhere, best = real_faces.match(faces, boxes, scores, 0.5)
    # at 0.5: the first face, a duplicate on it, a box on nothing, and a box on the second face
    assert (found, elsewhere) == (2, 2) and best == [1.0, 1.0]
    assert real_faces.match(faces, boxes, scores, 0.95)[:2] == (0, 0)


class StubDetector(nn.Module):
    """Answers the annotated photos, in order, each with its faces at score 0.9, one box elsewhere at 0.8
    and one at 0.2."""

    def __init__(self, photos):
        super().__init__()
        self.config = {"data": {"name": "faces", "image_size": 64, "face_size": [10, 48]}}
        self.photos = list(photos)
        self.calls = []

    def forward(self, images, scales=None):
        photo = self.photos[len(self.calls) % len(self.photos)]
        self.calls.append(scales)
        w, h = Image.open(photo["path"]).size
        assert tuple(images.shape[-2:]) == (h, w)  # the photo at its own resolution, unpadded
        faces = torch.as_tensor(photo["faces"], dtype=torch.float32)
        boxes = torch.cat([faces, torch.tensor([[0.0, 0.0, 30.0, 30.0], [5.0, 5.0, 40.0, 40.0]])])
        scores = torch.cat([torch.full((len(faces),), 0.9), torch.tensor([0.8, 0.2])])
        return [{"boxes": boxes, "scores": scores, "labels": torch.zeros(len(boxes), dtype=torch.long)}]


def test_evaluate_photos_reports_recall_boxes_elsewhere_and_ap(real_faces, tmp_path):
    photos, _ = real_faces.load_photos()
    stub = StubDetector(photos)
    result = real_faces.evaluate_photos(stub, photos, 0.5, "auto", out=tmp_path)
    assert stub.calls == ["auto"] * len(photos)  # the pyramid asked for
    assert result["found"] == result["faces"] == sum(len(p["faces"]) for p in photos) and result["recall"] == 1.0
    assert result["elsewhere"] == len(photos)  # the 0.8 box on each photo; the 0.2 box is under the threshold
    assert result["ap50"] == pytest.approx(1.0)  # every face outranks every box elsewhere
    assert all(r["seconds_per_megapixel"] >= 0 for r in result["photos"])
    assert sorted(f.name for f in (tmp_path / "images").iterdir()) == sorted(f"{p['name']}.png" for p in photos)
    strict = real_faces.evaluate_photos(stub, photos, 0.95, "auto")
    assert strict["found"] == 0 and strict["elsewhere"] == 0 and strict["ap50"] == pytest.approx(1.0)


def test_detect_files_sends_the_images_to_the_models_device(real_faces):
    """Without ``device``, :func:`snntrain.predict.detect_files` feeds the images to the device the model's
    parameters are on (a detector moved to a GPU; here the meta device stands for it), and returns CPU boxes."""
    from snntrain.predict import detect_files

    photos, _ = real_faces.load_photos()

    class Placed(StubDetector):
        def __init__(self, photos):
            super().__init__(photos)
            self.weight = nn.Parameter(torch.zeros(1, device="meta"))
            self.devices = []

        def forward(self, images, scales=None):
            self.devices.append(images.device.type)
            return super().forward(images, scales)

    model = Placed(photos[:1])
    (_, _, det), = detect_files(model, [photos[0]["path"]])
    assert model.devices == ["meta"] and det["boxes"].device.type == "cpu" and len(det["boxes"]) >= 1
