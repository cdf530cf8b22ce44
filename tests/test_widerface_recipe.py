"""The WIDER FACE recipe: square-crop training transform, full-resolution padded evaluation batches, the
official easy/medium/hard metric through a real run, and task=predict's thresholds, geometry and drawing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from snntrain.cli import run, train
from snntrain.data.detection import (
    SquareCropTransform,
    boxes_to_original,
    collate_detection,
    denormalize_image,
    fit_long_side,
    load_image_for_detection,
)
from snntrain.data.widerface import WiderFaceDataModule
from snntrain.predict import detection_geometry, draw_boxes, predict
from snntrain.wider_eval import evaluate
from test_detection_data import SIZES, extent, iou, make_widerface  # noqa: E402  (tests folder on sys.path)


def _image(h: int, w: int, boxes) -> torch.Tensor:
    img = torch.zeros(3, h, w, dtype=torch.uint8)
    for x1, y1, x2, y2 in boxes:
        img[:, y1:y2, x1:x2] = 255
    return img


# ------------------------------------------------------------------ square crops


def test_square_crop_keeps_boxes_on_the_pixels():
    torch.manual_seed(0)
    faces = [(10, 10, 40, 44), (80, 30, 110, 60), (150, 70, 190, 110)]
    img = _image(120, 200, faces)
    aug = SquareCropTransform(64, crop_scale=(0.3, 1.6), hflip=0.5, photometric=False, min_box_size=6.0)
    seen = 0
    for _ in range(40):
        out, boxes, labels = aug(img, torch.tensor(faces, dtype=torch.float32), torch.zeros(3, dtype=torch.int64))
        assert out.shape == (3, 64, 64) and boxes.shape[0] == labels.shape[0] >= 1
        bright = denormalize_image(out)[0].numpy() > 0.75  # grey fill of a square past the image is 0.5
        for x1, y1, x2, y2 in boxes.tolist():
            assert 0 <= x1 < x2 <= 64 and 0 <= y1 < y2 <= 64
            a, b = max(0, int(x1) - 2), max(0, int(y1) - 2)
            region = np.zeros_like(bright)
            region[b:int(y2) + 3, a:int(x2) + 3] = bright[b:int(y2) + 3, a:int(x2) + 3]
            assert iou(extent(region), [x1, y1, x2, y2]) > 0.8
            seen += 1
    assert seen > 40


def test_square_crop_keeps_faces_whose_centre_is_inside():
    torch.manual_seed(1)
    # side 50 of a 100x100 image, resized to 64: factor 1.28. Face A's centre is (15, 15).
    aug = SquareCropTransform(64, crop_scale=(0.5, 0.5), hflip=0.0, photometric=False, min_box_size=0.0)
    img = _image(100, 100, [(0, 0, 30, 30), (35, 35, 65, 65)])
    kept = dropped = 0
    for _ in range(100):
        _, boxes, _ = aug(img, torch.tensor([[0.0, 0, 30, 30], [35.0, 35, 65, 65]]), torch.zeros(2, dtype=torch.int64))
        corner = [b for b in boxes.tolist() if b[0] == 0.0 and b[1] == 0.0 and b[2] < 40 and b[3] < 40]
        if corner:
            kept += 1
            # the visible part reaches at least to the centre: x0 <= 15, so x2 = (30 - x0) * 1.28 >= 19.2
            assert corner[0][2] >= 19.2 - 1e-4 and corner[0][3] >= 19.2 - 1e-4
        else:
            dropped += 1
    assert kept > 5 and dropped > 5


def test_photometric_jitter_moves_no_box():
    faces = torch.tensor([[10.0, 10, 40, 44], [80.0, 30, 110, 60]])
    img = _image(90, 120, [(10, 10, 40, 44), (80, 30, 110, 60)])
    img[1] //= 2  # some colour for saturation and hue to act on
    outs = []
    for photometric in (False, True):
        aug = SquareCropTransform(48, crop_scale=(0.5, 1.2), photometric=photometric)
        outs.append([])
        for k in range(8):  # the jitter draws after the geometry: the same seed gives the same boxes
            torch.manual_seed(k)
            outs[-1].append(aug(img, faces, torch.zeros(2, dtype=torch.int64)))
    for (_, ba, _), (_, bb, _) in zip(*outs):
        assert torch.equal(ba, bb)
    assert any(not torch.equal(a, b) for (a, _, _), (b, _, _) in zip(*outs))


def test_square_crop_settings_are_checked():
    with pytest.raises(ValueError, match="crop_scale"):
        SquareCropTransform(64, crop_scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="image_size"):
        SquareCropTransform(0)


# ------------------------------------------------------------------ full-resolution evaluation batches


def test_full_resolution_validation_batches_map_back_exactly(tmp_path):
    root = make_widerface(tmp_path / "wider")
    dm = WiderFaceDataModule(root=str(root), image_size=32, batch_size=2, num_workers=0, seed=0)
    dm.setup()
    images, t = next(iter(dm.val_dataloader()))
    sizes = [SIZES[r.path] for r in dm.val_set.records]  # (48, 64) and (400, 240)
    assert images.shape == (2, 3, 416, 256)  # the largest sides rounded up to multiples of 32
    assert t["orig_size"].tolist() == [list(s) for s in sizes]
    assert images[0, :, 48:, :].abs().max() == 0 and images[0, :, :, 64:].abs().max() == 0  # padding is 0
    for i, rec in enumerate(dm.val_set.records):
        n = int(t["num_boxes"][i])
        back = boxes_to_original(t["boxes"][i, :n], t["scale"][i], t["pad"][i], sizes[i])
        torch.testing.assert_close(back, torch.from_numpy(rec.boxes[rec.keep]))
        grey = denormalize_image(images[i])[0]
        for x1, y1, x2, y2 in t["boxes"][i, :n].int().tolist():
            assert grey[y1:y2, x1:x2].mean() > 0.8
    # a longer side capped at 100: the 400x240 image is shrunk by 4, the small one is left alone
    capped = WiderFaceDataModule(root=str(root), image_size=32, eval_max_side=100, batch_size=2, num_workers=0)
    capped.setup()
    img, target = capped.val_set[1]
    assert img.shape == (3, 100, 60) and target["scale"].tolist() == [0.25, 0.25]
    img, target = capped.val_set[0]
    assert img.shape == (3, 48, 64) and target["scale"].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="eval_max_side=0"):
        WiderFaceDataModule(root=str(root), eval_max_side=0)


def test_fit_long_side_and_padded_collate():
    image = _image(30, 50, [(5, 5, 15, 25)])
    out, scale, pad = fit_long_side(image, 25)
    assert out.shape == (3, 15, 25) and scale.tolist() == [0.5, 0.5] and pad.tolist() == [0.0, 0.0]
    out_full, scale_full, _ = fit_long_side(image, None)
    assert out_full.shape == (3, 30, 50) and scale_full.tolist() == [1.0, 1.0]
    target = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64), "image_id": 0,
              "orig_size": (30, 50), "scale": scale, "pad": pad}
    images, _ = collate_detection([(out, target), (out_full, target)], size_divisor=16)
    assert images.shape == (2, 3, 32, 64)
    torch.testing.assert_close(images[1, :, :30, :50], out_full)


# ------------------------------------------------------------------ a real run: train, validate, predict


# debug=tiny on the recipe: 64x64 crops, every validation image, metrics in the CSV log
TINY = ["debug=tiny", "experiment=widerface_sew", "logger=csv", "data.image_size=64", "trainer.limit_val_batches=null",
        "+trainer.num_sanity_val_steps=0"]


@pytest.fixture(scope="module")
def wider_run(tmp_path_factory, compose_run):
    root = make_widerface(tmp_path_factory.mktemp("wider"), with_eval=True)
    out = tmp_path_factory.mktemp("run")
    metrics = train(compose_run(out, *TINY, f"data.root={root}", "model.head.score_thresh=0.0"))
    return root, out, metrics


@pytest.mark.slow
def test_wider_metrics_of_a_run_follow_the_official_protocol(wider_run, tmp_path, compose_run):
    from snntrain.export import load_checkpoint

    root, out, metrics = wider_run
    ckpt = out / "checkpoints" / "last.ckpt"
    # validate the checkpoint alone, then score its predictions with the evaluator directly
    again = train(compose_run(tmp_path / "val", *TINY, f"data.root={root}", "train=false", f"ckpt_path={ckpt}"))
    model = load_checkpoint(ckpt, backend="torch")
    dm = WiderFaceDataModule(root=str(root), image_size=64, batch_size=2, num_workers=0)
    dm.setup()
    boxes, scores = [], []
    with torch.no_grad():
        for images, t in dm.val_dataloader():
            for i, det in enumerate(model(images)):
                boxes.append(boxes_to_original(det["boxes"], t["scale"][i], t["pad"][i], t["orig_size"][i]).numpy())
                scores.append(det["scores"].numpy())
    records = dm.val_set.records
    expected = evaluate(boxes, scores, [r.boxes for r in records],
                        {level: [r.difficulty[level] for r in records] for level in ("easy", "medium", "hard")})
    for level in ("easy", "medium", "hard"):
        assert f"val/wider_{level}" in metrics
        assert again[f"val/wider_{level}"] == pytest.approx(expected[level].ap, abs=1e-6)


@pytest.mark.slow
def test_predict_thresholds_geometry_and_drawing(wider_run, tmp_path, compose_run):
    root, out, _ = wider_run
    ckpt = out / "checkpoints" / "last.ckpt"
    photo = root / "WIDER_val" / "images" / "12--Group" / "12_Group_Group_12_Group_Group_12_10.jpg"  # 400x240
    results = {"shown": run(compose_run(tmp_path / "shown", *TINY, "task=predict", f"ckpt_path={ckpt}",
                                        f"input={photo}"))[0]}
    for name, kwargs in (("all", {"score_thresh": 0.0}), ("small", {"score_thresh": 0.0, "max_side": 100})):
        results[name] = predict(ckpt, photo, tmp_path / name / "predictions", backend="torch", **kwargs)[0]
    for name in results:
        saved = json.loads((tmp_path / name / "predictions" / "predictions.json").read_text())[0]
        assert saved == results[name] and (saved["width"], saved["height"]) == (240, 400)
        for det in saved["detections"]:
            x1, y1, x2, y2 = det["box"]
            assert 0 <= x1 <= x2 <= 240 and 0 <= y1 <= y2 <= 400
        drawn = Image.open(tmp_path / name / "predictions" / "images" / f"{photo.stem}.png")
        assert drawn.size == (240, 400)
    scores = [d["score"] for d in results["all"]["detections"]]
    assert results["all"]["detections"], "score_thresh=0 keeps the model's boxes"
    assert [d["score"] for d in results["shown"]["detections"]] == [s for s in scores if s >= 0.5]
    assert results["small"]["detections"] != results["all"]["detections"]  # ran at another size


def test_detection_geometry_follows_the_training_data():
    assert detection_geometry({"name": "faces", "image_size": 64}) == (64, None)
    assert detection_geometry({"name": "faces", "image_size": 64}, 300) == (None, 300)
    assert detection_geometry({"name": "widerface", "image_size": 640, "eval_max_side": None}) == (None, None)
    assert detection_geometry({"name": "widerface", "image_size": 640, "eval_max_side": 1024}, 500) == (None, 500)


def test_load_image_keeps_aspect_at_max_side(tmp_path):
    path = tmp_path / "wide.png"
    Image.fromarray(np.zeros((300, 800, 3), np.uint8)).save(path)
    image, meta = load_image_for_detection(path, None, 400)
    assert image.shape == (3, 150, 400) and meta["orig_size"] == (300, 800) and meta["scale"].tolist() == [0.5, 0.5]


@pytest.mark.parametrize("side", [48, 2000])
def test_drawn_labels_are_legible_at_any_size(side):
    image = torch.zeros(3, side, side, dtype=torch.uint8)
    box = torch.tensor([[side * 0.25, side * 0.25, side * 0.75, side * 0.75]])
    out = draw_boxes(image, box, [0.87])
    red = (out[0] > 200) & (out[1] < 100)
    ys, xs = torch.nonzero(red, as_tuple=True)
    line = int(red[side // 2].sum())  # the two vertical edges crossed at mid height
    assert line >= 2 * max(2, round(side / 250))
    # the score: white text on a filled label, its glyphs at least 0.6 of the font size (12 px or 1/40 of
    # the image, whichever is larger) high
    white = (out[0] > 200) & (out[1] > 200)
    rows = torch.nonzero(white.any(1)).flatten()
    assert int(white.sum()) > 10 and int(rows.max() - rows.min() + 1) >= 0.6 * max(12, round(side / 40))
    assert bool(red[rows.min() - 1:rows.max() + 2].any(0).sum() > 0)  # on the red label
    assert ys.min() >= 0 and xs.max() < side


def test_model_card_says_what_the_model_was_trained_on():
    from snntrain.export import training_data_summary

    faces = training_data_summary({"data": {"name": "faces", "image_size": 64, "face_size": [12, 32]}})
    assert "synthetic" in faces and "12-32 px" in faces and "never trained on real photographs" in faces
    wider = training_data_summary({"data": {"name": "widerface", "image_size": 640, "eval_max_side": None}})
    assert "WIDER FACE train" in wider and "640x640" in wider and "original resolution" in wider
