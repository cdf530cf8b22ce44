"""Face-detection data: synthetic faces, WIDER FACE parsing and loading, box-aware transforms, batching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from _testing import assert_close
from snntrain.data import DATAMODULES, build_datamodule
from snntrain.data.detection import (
    TrainTransform,
    boxes_to_original,
    collate_detection,
    denormalize_image,
    letterbox,
    load_image_for_detection,
    make_target,
    normalize_image,
)
from snntrain.data.faces import PHOTOS, FaceComposer, FacesDataModule, background_photos, lfw_crops, split_rng
from snntrain.data.widerface import (
    WiderFaceDataModule,
    WiderFaceDataset,
    load_difficulty_lists,
    parse_annotations,
)

# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def raster(boxes: np.ndarray, size: int) -> np.ndarray:
    """Union of integer xyxy boxes (exclusive x2/y2) as a bool mask."""
    mask = np.zeros((size, size), dtype=bool)
    for x1, y1, x2, y2 in np.asarray(boxes, dtype=np.int64).reshape(-1, 4):
        mask[y1:y2, x1:x2] = True
    return mask


def extent(mask: np.ndarray) -> list[float]:
    """Tight xyxy box (exclusive x2/y2) around the True pixels of ``mask``."""
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def iou(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def small_faces_dm(**kwargs) -> FacesDataModule:
    args = dict(num_train=16, num_val=8, num_test=4, batch_size=4, seed=7)
    args.update(kwargs)
    return FacesDataModule(**args)


# --------------------------------------------------------------------------------------------------
# Synthetic faces
# --------------------------------------------------------------------------------------------------


def test_lfw_subset_is_faces_then_non_faces():
    faces, non_faces = lfw_crops()
    assert faces.shape == (100, 25, 25) and non_faces.shape == (100, 25, 25)
    assert faces.dtype == np.float32 and 0.0 <= faces.min() and faces.max() <= 1.0
    # The faces are centred crops with structure everywhere; many non-face crops are nearly flat.
    assert np.median(faces.std(axis=(1, 2))) > np.median(non_faces.std(axis=(1, 2)))


@pytest.mark.parametrize("occlusion", [0.0, 1.0])
def test_synthetic_boxes_match_rendered_pixels(occlusion):
    """Render each layout twice, once with all-white and once with all-black face crops: the pixels that
    differ are exactly where faces are visible (``label_map``). Without occluders that is exactly the
    union of the boxes; with them, each face's visible pixels lie in its box, and the box is unchanged."""
    rng0 = np.random.default_rng(0)
    non_faces = rng0.uniform(0, 1, (10, 25, 25)).astype(np.float32)
    args = dict(photos=background_photos(), image_size=64, faces_per_image=(0, 4), face_size=(6, 40),
                backgrounds=("tiles", "photos", "textures", "flat"), skin_tones=0.5, context=1.0, lighting=1.0,
                occlusion=occlusion, blur=0.0, clutter_per_image=(0, 3))
    white = FaceComposer(np.ones((5, 25, 25), np.float32), non_faces, **args)
    black = FaceComposer(np.zeros((5, 25, 25), np.float32), non_faces, **args)
    counts, hidden = set(), 0
    for i in range(40):
        a = white.render(split_rng(3, "train", i))
        b = black.render(split_rng(3, "train", i))
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.label_map, b.label_map)
        differs = np.any(a.image != b.image, axis=2)
        np.testing.assert_array_equal(a.label_map > 0, differs)
        if occlusion == 0:
            np.testing.assert_array_equal(differs, raster(a.boxes, 64))
        for k, box in enumerate(a.boxes):
            visible = a.label_map == k + 1
            assert visible.any() and not (visible & ~raster(box[None], 64)).any()
            hidden += int(occlusion > 0 and not (raster(a.boxes[k + 1:], 64) & raster(box[None], 64)).any()
                          and visible.sum() < (box[2] - box[0]) * (box[3] - box[1]))
        boxes = a.boxes
        counts.add(len(boxes))
        assert np.all(boxes == np.round(boxes)) and np.all(boxes >= 0) and np.all(boxes <= 64)
        sides = boxes[:, 2:] - boxes[:, :2]
        assert np.all(sides[:, 0] == sides[:, 1]) and np.all((sides >= 6) & (sides <= 40))
    assert counts >= {0, 1, 2, 3}
    assert hidden > 10 if occlusion > 0 else hidden == 0  # occluded faces keep their whole box


def test_synthetic_blur_leaves_boxes_and_label_map():
    """The image-wide blur is drawn after every face: the same generator state gives the same faces."""
    faces, non_faces = lfw_crops()
    args = dict(photos=background_photos(), image_size=48, face_size=(8, 36))
    sharp = FaceComposer(faces, non_faces, blur=0.0, **args)
    blurred = FaceComposer(faces, non_faces, blur=1.0, **args)
    for i in range(6):
        a, b = sharp.render(split_rng(1, "val", i)), blurred.render(split_rng(1, "val", i))
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.label_map, b.label_map)
        assert not np.array_equal(a.image, b.image)
        # blurring smooths: neighbouring pixels differ less
        assert np.abs(np.diff(b.image.astype(int), axis=1)).mean() < np.abs(np.diff(a.image.astype(int), axis=1)).mean()


def test_synthetic_faces_are_coloured_like_distractors():
    """skin_tones=1: faces get skin colours (red > green > blue on average), and so do the distractors."""
    faces, non_faces = lfw_crops()
    comp = FaceComposer(np.full((3, 25, 25), 0.6, np.float32), np.full((3, 25, 25), 0.6, np.float32),
                        image_size=64, faces_per_image=(1, 1), face_size=(20, 20), distractors_per_image=(0, 0),
                        backgrounds="flat", skin_tones=1.0, context=0.0, lighting=0.0, occlusion=0.0, blur=0.0)
    skin = 0
    for i in range(20):
        c = comp.render(split_rng(0, "train", i))
        r, g, b = c.image[c.label_map == 1].astype(float).mean(0)
        grey = max(r, g, b) - min(r, g, b) < 2  # the whole-image grey (probability 0.2), then noise
        skin += int(r > g + 5 and g > b + 3)
        assert grey or r > g + 5 and g > b + 3
    assert skin >= 10
    # the photographs the detector is tested on never serve as backgrounds
    assert not {"astronaut", "camera", "chelsea", "coins"} & set(PHOTOS)
    photos = background_photos()
    assert len(photos) == len(PHOTOS) and all(p.dtype == np.uint8 and p.ndim == 3 and p.shape[2] == 3 for p in photos)


def test_clutter_is_painted_without_boxes():
    """Hands, arms and objects change the picture but never add a box; with skin_tones=1 much of the clutter
    is skin-coloured (hands and arms), the rest of any colour (objects)."""
    faces, non_faces = lfw_crops()
    args = dict(image_size=64, faces_per_image=(0, 0), distractors_per_image=(0, 0), backgrounds="flat",
                skin_tones=1.0, context=0.0, lighting=0.0, occlusion=0.0, blur=0.0)
    plain = FaceComposer(faces, non_faces, **args)
    cluttered = FaceComposer(faces, non_faces, clutter_per_image=(2, 2), **args)
    skin = painted = 0
    for i in range(30):
        a, b = plain.render(split_rng(0, "train", i)), cluttered.render(split_rng(0, "train", i))
        assert len(a.boxes) == len(b.boxes) == 0 and not b.label_map.any()
        background = a.image[0, 0].astype(int)
        changed = np.abs(b.image.astype(int) - background).max(2) > 40
        painted += int(changed.any())
        if changed.any():
            r, g, bl = b.image[changed].astype(float).mean(0)
            skin += int(r > g > bl)
    assert painted >= 25 and skin >= 8
    with pytest.raises(ValueError, match="clutter_per_image"):
        FacesDataModule(clutter_per_image=[3, 1])


def test_synthetic_label_map_extent_equals_box():
    dm = small_faces_dm(occlusion=0.0)
    dm.setup()
    checked = 0
    for split_set in (dm.train_set, dm.val_set):
        for i in range(len(split_set)):
            comp = split_set.render(i)
            assert 1 <= len(comp.boxes) <= 3
            for k, box in enumerate(comp.boxes):
                visible = comp.label_map == k + 1
                assert visible.any(), "a face is hidden completely"
                later = comp.boxes[k + 1:]
                covered = raster(later, 64) & raster(box[None], 64)
                # visible pixels are the box minus what later faces cover
                np.testing.assert_array_equal(visible, raster(box[None], 64) & ~covered)
                assert covered.sum() <= 0.25 * (box[2] - box[0]) * (box[3] - box[1]) * len(later) + 1e-6
                if not covered.any():
                    assert extent(visible) == box.tolist()
                    checked += 1
    assert checked > 10


def test_synthetic_data_is_deterministic_by_seed():
    def first_batches(seed: int):
        dm = small_faces_dm(seed=seed, augment=False)
        dm.setup()
        return next(iter(dm.train_dataloader())), next(iter(dm.val_dataloader()))

    (xa, ta), (va, vta) = first_batches(5)
    (xb, tb), (vb, vtb) = first_batches(5)
    assert torch.equal(xa, xb) and torch.equal(ta["boxes"], tb["boxes"]) and torch.equal(ta["image_id"], tb["image_id"])
    assert torch.equal(va, vb) and torch.equal(vta["boxes"], vtb["boxes"])
    (xc, _), (vc, _) = first_batches(6)
    assert not torch.equal(va, vc)
    # an image does not depend on which images were rendered before it
    dm = small_faces_dm(seed=5, cache=False)
    dm.setup()
    late = dm.val_set.render(5)
    dm2 = small_faces_dm(seed=5, cache=False)
    dm2.setup()
    for i in range(5):
        dm2.val_set.render(i)
    np.testing.assert_array_equal(late.image, dm2.val_set.render(5).image)
    # splits differ for the same index
    assert not np.array_equal(dm.val_set.render(0).image, dm.test_set.render(0).image)


def test_synthetic_splits_use_disjoint_crops():
    dm = small_faces_dm(held_out_faces=20)
    train, val = dm.composer("train"), dm.composer("val")
    assert len(train.faces) == 80 and len(val.faces) == 20
    flat_train = {f.tobytes() for f in train.faces}
    assert not any(f.tobytes() in flat_train for f in val.faces)
    assert not any(f.tobytes() in {g.tobytes() for g in train.non_faces} for f in val.non_faces)


def test_faces_sample_format_and_fixed_batch_shape():
    dm = small_faces_dm(faces_per_image=[1, 4], face_size=[10, 20])
    dm.setup()
    dm.setup()  # idempotent
    image, target = dm.val_set[0]
    assert image.shape == (3, 64, 64) and image.dtype == torch.float32
    assert -1.0 <= image.min() and image.max() <= 1.0
    assert target["boxes"].dtype == torch.float32 and target["labels"].dtype == torch.int64
    assert torch.equal(target["scale"], torch.ones(2)) and torch.equal(target["pad"], torch.zeros(2))
    assert target["orig_size"] == (64, 64) and target["image_id"] == 0
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        images, t = next(iter(loader))
        assert images.shape == (4, 3, 64, 64)
        assert t["boxes"].shape == (4, 4, 4) and t["labels"].shape == (4, 4)  # M = faces_per_image max
    images, t = next(iter(dm.train_dataloader()))
    assert torch.isnan(t["scale"]).all()  # augmented: mapping not tracked
    assert dm.num_classes == 1 and dm.in_channels == 3 and dm.image_size == 64


def test_faces_settings_are_validated():
    with pytest.raises(ValueError, match="face_size"):
        FacesDataModule(face_size=[12, 80])
    with pytest.raises(ValueError, match="faces_per_image"):
        FacesDataModule(faces_per_image=[3, 1])
    with pytest.raises(ValueError, match="backgrounds"):
        FacesDataModule(backgrounds=["sky"])
    with pytest.raises(ValueError, match="held_out_faces"):
        FacesDataModule(held_out_faces=100)
    with pytest.raises(ValueError, match="max_boxes"):
        FacesDataModule(max_boxes=0)
    for name, bad in (("skin_tones", 1.5), ("context", -0.1), ("lighting", "on"), ("occlusion", True), ("blur", 2)):
        with pytest.raises(ValueError, match=rf"{name}={bad!r}"):
            FacesDataModule(**{name: bad})


# --------------------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------------------


def _sample(n_boxes: int, image_id: int):
    boxes = torch.tensor([[0.0, 0.0, 2.0 + k, 2.0 + k] for k in range(n_boxes)]).reshape(-1, 4)
    return torch.zeros(3, 8, 8), make_target(boxes, image_id, (8, 8), torch.ones(2), torch.zeros(2))


def test_collate_pads_boxes_and_counts():
    batch = [_sample(0, 0), _sample(2, 1), _sample(5, 2)]
    images, t = collate_detection(batch)
    assert images.shape == (3, 3, 8, 8)
    assert t["boxes"].shape == (3, 5, 4) and t["labels"].shape == (3, 5)
    assert t["num_boxes"].tolist() == [0, 2, 5] and t["image_id"].tolist() == [0, 1, 2]
    assert t["num_boxes"].dtype == torch.int64 and t["orig_size"].shape == (3, 2)
    pad = t["labels"] < 0
    assert torch.equal(pad, torch.arange(5)[None, :] >= t["num_boxes"][:, None])
    assert torch.all(t["boxes"][pad] == 0) and torch.all(t["boxes"][pad][:, 3] <= 0)
    assert torch.all(t["boxes"][~pad][:, 3] > 0)
    assert torch.equal(t["boxes"][2, :5], batch[2][1]["boxes"])


def test_collate_fixed_max_boxes_keeps_largest_in_order():
    batch = [_sample(1, 0), _sample(5, 1)]
    _, t = collate_detection(batch, max_boxes=3)
    assert t["boxes"].shape == (2, 3, 4) and t["num_boxes"].tolist() == [1, 3]
    # boxes 2, 3, 4 are the largest; original order is kept
    assert torch.equal(t["boxes"][1], batch[1][1]["boxes"][2:5])
    _, t = collate_detection(batch, max_boxes=8)
    assert t["boxes"].shape == (2, 8, 4)
    _, t = collate_detection(batch, max_boxes=3, drop=False)  # evaluation: never drop
    assert t["boxes"].shape == (2, 5, 4) and t["num_boxes"].tolist() == [1, 5]


# --------------------------------------------------------------------------------------------------
# Transforms, letterbox, mapping back
# --------------------------------------------------------------------------------------------------


def _square_image(h: int, w: int, box: tuple[int, int, int, int]) -> torch.Tensor:
    img = torch.zeros(3, h, w, dtype=torch.uint8)
    x1, y1, x2, y2 = box
    img[:, y1:y2, x1:x2] = 255
    return img


def augmented(aug: TrainTransform, path: str, image, boxes, labels, rng: np.random.Generator):
    """One augmentation of ``image`` by ``aug`` per sample (``__call__``, on the loader's side) or as a batch of
    one (``draw`` and ``apply_batch``, the training set kept on the device): the same outputs either way."""
    if path == "sample":
        return aug(image, boxes, labels)
    params = torch.from_numpy(aug.draw(rng, 1, image.shape[-2], image.shape[-1]))
    out, b, lab, n = aug.apply_batch(image[None], boxes[None], labels[None], torch.tensor([boxes.shape[0]]), params)
    return out[0], b[0, : int(n[0])], lab[0, : int(n[0])]


@pytest.mark.parametrize("path", ["sample", "batch"])
def test_flip_moves_box_with_pixels_exactly(path):
    img = _square_image(40, 40, (5, 10, 17, 30))
    flip = TrainTransform(40, hflip=1.0, zoom_out=1.0, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0))
    out, boxes, labels = augmented(flip, path, img, torch.tensor([[5.0, 10.0, 17.0, 30.0]]),
                                   torch.zeros(1, dtype=torch.int64), np.random.default_rng(0))
    assert boxes.tolist() == [[23.0, 10.0, 35.0, 30.0]] and labels.tolist() == [0]
    assert extent(denormalize_image(out)[0].numpy() > 0.5) == boxes[0].tolist()


@pytest.mark.parametrize("path", ["sample", "batch"])
def test_random_augmentation_keeps_boxes_on_the_pixels(path):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    aug = TrainTransform(64, hflip=0.5, zoom_out=2.0, crop_scale=(0.3, 1.0), min_visibility=0.5)
    src_box = (30, 20, 70, 50)
    img = _square_image(80, 100, src_box)
    seen = 0
    for _ in range(60):
        out, boxes, labels = augmented(aug, path, img, torch.tensor([src_box], dtype=torch.float32),
                                       torch.zeros(1, dtype=torch.int64), rng)
        assert out.shape == (3, 64, 64) and boxes.shape[0] == labels.shape[0] <= 1
        bright = denormalize_image(out)[0].numpy() > 0.75  # zoom-out fill is mid grey
        if boxes.shape[0] == 0:
            continue  # dropped: too little of the square is visible (or too small)
        seen += 1
        box = boxes[0].tolist()
        assert 0 <= box[0] < box[2] <= 64 and 0 <= box[1] < box[3] <= 64
        assert iou(extent(bright), box) > 0.85
    assert seen > 30


@pytest.mark.parametrize("path", ["sample", "batch"])
def test_augmentation_drops_faces_mostly_cut_off_by_the_crop(path):
    # A 50x50 crop of a 100x100 image resized to 50x50: no resampling, so the bright pixels that
    # remain measure exactly how much of the 20x20 square is visible.
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    aug = TrainTransform(50, hflip=0.0, zoom_out=1.0, crop_scale=(0.25, 0.25), crop_ratio=(1.0, 1.0),
                         min_visibility=0.5, min_box_size=1.0)
    img = _square_image(100, 100, (40, 40, 60, 60))
    kept_partial = dropped_partial = 0
    for _ in range(200):
        out, boxes, _ = augmented(aug, path, img, torch.tensor([[40.0, 40.0, 60.0, 60.0]]),
                                  torch.zeros(1, dtype=torch.int64), rng)
        visible = int((denormalize_image(out)[0] > 0.5).sum()) / 400.0
        if boxes.shape[0]:
            assert visible >= 0.5
            b = boxes[0]
            assert float((b[2] - b[0]) * (b[3] - b[1])) == pytest.approx(visible * 400.0)
            kept_partial += visible < 1.0
        else:
            assert visible < 0.5
            dropped_partial += visible > 0.0
    assert kept_partial > 5 and dropped_partial > 5


def test_batch_augmentation_draws_the_recipes_distribution():
    """``draw`` samples what ``__call__`` samples: flips at ``hflip``, a zoom-out half the time, and crops of
    ``crop_scale`` of the (grown) canvas with aspect ratios in ``crop_ratio``, inside the canvas."""
    aug = TrainTransform(64, hflip=0.3, zoom_out=2.0, crop_scale=(0.4, 0.9), crop_ratio=(0.75, 4 / 3))
    n, h, w = 4000, 48, 80
    p = aug.draw(np.random.default_rng(5), n, h, w)
    assert p.shape == (n, 5) and set(np.unique(p[:, 0])) == {0.0, 1.0}
    assert abs(p[:, 0].mean() - 0.3) < 0.03
    cw, ch = p[:, 3] - p[:, 1], p[:, 4] - p[:, 2]
    assert (cw > 0).all() and (ch > 0).all()
    # the crop lies inside a canvas at most zoom_out times the image, which the canvas always contains
    assert (p[:, 1] >= -w).all() and (p[:, 3] <= 2 * w).all() and (p[:, 2] >= -h).all() and (p[:, 4] <= 2 * h).all()
    inside = (p[:, 1] >= 0) & (p[:, 2] >= 0) & (p[:, 3] <= w) & (p[:, 4] <= h)
    assert 0.4 < inside.mean() < 0.9  # no zoom-out half the time: then the crop is inside the image
    aspect = cw / ch
    assert ((aspect > 0.75 * 0.9) & (aspect < 4 / 3 * 1.1)).mean() > 0.99
    plain = TrainTransform(64, hflip=0.0, zoom_out=1.0, crop_scale=(0.4, 0.9))
    q = plain.draw(np.random.default_rng(6), n, 60, 60)  # square: every crop of the range fits
    area = (q[:, 3] - q[:, 1]) * (q[:, 4] - q[:, 2]) / 3600
    assert (q[:, 0] == 0).all() and (q[:, 1:3] >= 0).all() and (q[:, 3:] <= 60).all()
    assert area.min() > 0.37 and area.max() < 0.95 and 0.6 < area.mean() < 0.7


def _epoch(loader, epoch: int) -> list:
    loader.sampler.set_epoch(epoch)
    return list(loader)


def _same_batches(a: list, b: list) -> bool:
    keys = ("boxes", "labels", "num_boxes", "image_id")
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and all(torch.equal(x[1][k], y[1][k]) for k in keys)
                                    for x, y in zip(a, b))


def test_training_set_on_the_device_without_augmentation_gives_the_loaders_batches():
    """``on_device: true`` renders the training set once and gathers each batch by index: without augmentation
    its batches are exactly those of the loader that renders image by image, in the same order."""
    plain = small_faces_dm(augment=False, on_device=False, max_boxes=2, faces_per_image=[1, 3])
    kept = small_faces_dm(augment=False, on_device=True, max_boxes=2, faces_per_image=[1, 3])
    for dm in (plain, kept):
        dm.setup()
    assert not plain.keeps_on_device() and kept.keeps_on_device()
    for epoch in (0, 1):
        assert _same_batches(_epoch(plain.train_dataloader(), epoch), _epoch(kept.train_dataloader(), epoch))


def test_training_set_on_the_device_augments_by_seed_and_resumes_mid_epoch():
    dm = small_faces_dm(on_device=True, num_train=20)
    dm.setup()
    loader = dm.train_dataloader()
    first = _epoch(loader, 2)
    assert len(first) == 5 and _same_batches(first, _epoch(loader, 2))  # the same augmentations again
    assert not torch.equal(first[0][0], _epoch(loader, 3)[0][0])
    images, t = first[0]
    assert images.shape == (4, 3, 64, 64) and images.dtype == torch.float32 and -1 <= images.min() <= images.max() <= 1
    assert t["boxes"].shape == (4, 3, 4) and torch.isnan(t["scale"]).all()
    rows = torch.arange(3) < t["num_boxes"][:, None]
    assert (t["labels"][rows] == 0).all() and (t["labels"][~rows] == -1).all() and (t["boxes"][~rows] == 0).all()
    real = t["boxes"][rows]
    assert (real[:, 2:] - real[:, :2] >= 2.0).all() and (real >= 0).all() and (real <= 64).all()
    loader.sampler.set_epoch(2)
    loader.progress = lambda: (3, 5)
    state = loader.state_dict()
    assert state["epoch"] == 2 and state["batches_done"] == 3
    again = small_faces_dm(on_device=True, num_train=20)
    again.setup()
    fresh = again.train_dataloader()
    fresh.load_state_dict(state)
    assert _same_batches(first[3:], list(fresh))


@pytest.mark.gpu
def test_training_set_on_a_gpu_gives_the_cpus_batches_from_its_graphs():
    """On a CUDA device (``on_device: auto`` there) each batch is gathered and augmented by a CUDA graph (the
    first batch of a size eagerly): the batches equal those built on the CPU, and each owns its tensors (the
    next replay does not overwrite the last batch)."""
    from types import SimpleNamespace

    # four batches of 5 and a last one of 4: two graphs
    cpu, gpu = small_faces_dm(num_train=24, batch_size=5), small_faces_dm(num_train=24, batch_size=5)
    for dm in (cpu, gpu):
        dm.setup()
    gpu.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    assert gpu.keeps_on_device() and not cpu.keeps_on_device()
    cpu.on_device = True
    want, got = _epoch(cpu.train_dataloader(), 1), _epoch(gpu.train_dataloader(), 1)
    assert len(got) == 5 and [b[0].shape[0] for b in got] == [5, 5, 5, 5, 4]
    for (wi, wt), (gi, gt) in zip(want, got):
        # the GPU's and the CPU's roi_align and box arithmetic round differently: images within 1e-4, boxes (scaled by the
        # crop's zoom) within 1e-3, beside the fp32 row of rtol
        assert gi.is_cuda
        assert_close(gi, wi, rtol=1e-5, atol=1e-4, what="images")
        assert torch.equal(gt["num_boxes"].cpu(), wt["num_boxes"]) and torch.equal(gt["labels"].cpu(), wt["labels"])
        assert_close(gt["boxes"], wt["boxes"], rtol=1e-5, atol=1e-3, what="boxes")
        assert torch.equal(gt["image_id"].cpu(), wt["image_id"])


def test_on_device_setting_is_checked():
    with pytest.raises(ValueError, match="data.on_device='gpu' must be auto, true or false"):
        FacesDataModule(on_device="gpu")
    dm = small_faces_dm()
    dm.setup()
    assert dm.on_device == "auto" and not dm.keeps_on_device()  # auto: on a CUDA device only


@pytest.mark.parametrize("hw", [(37, 90), (90, 37), (64, 64), (500, 333)])
def test_letterbox_round_trip(hw):
    h, w = hw
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(6, 2, generator=g) * torch.tensor([w * 0.5, h * 0.5])
    wh = torch.rand(6, 2, generator=g) * torch.tensor([w * 0.5, h * 0.5]) + 1
    boxes = torch.cat([xy, xy + wh], dim=1)
    image = _square_image(h, w, (w // 4, h // 4, w // 2, h // 2))
    out, mapped, scale, pad = letterbox(image, boxes, 64)
    assert out.shape == (3, 64, 64) and out.dtype == torch.float32
    assert max(round(h * scale[1].item()), round(w * scale[0].item())) == 64
    if h < w:
        assert out[:, 0, :].abs().max() == 0 and out[:, -1, :].abs().max() == 0  # padding is exactly 0
    elif w < h:
        assert out[:, :, 0].abs().max() == 0 and out[:, :, -1].abs().max() == 0
    back = boxes_to_original(mapped, scale, pad, (h, w))
    torch.testing.assert_close(back, boxes, atol=1e-4, rtol=1e-5)
    # batched form
    back_b = boxes_to_original(mapped[None], scale[None], pad[None], torch.tensor([[h, w]]))
    torch.testing.assert_close(back_b[0], boxes, atol=1e-4, rtol=1e-5)
    # the bright square lands where its mapped box says
    square = torch.tensor([[w // 4, h // 4, w // 2, h // 2]], dtype=torch.float32)
    _, sq, _, _ = letterbox(image, square, 64)
    bright = denormalize_image(out)[0].numpy() > 0.5
    assert iou(extent(bright), sq[0].tolist()) > 0.8


@pytest.mark.parametrize("name, k", [("photo.png", 1), ("photo.jpg", 8)])  # the JPEG decodes at 1/4 size
def test_load_image_for_detection(tmp_path, name, k):
    path = tmp_path / name
    pixels = _square_image(60 * k, 120 * k, (10 * k, 20 * k, 40 * k, 50 * k))
    Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(path)
    image, meta = load_image_for_detection(path, 48)
    assert image.shape == (3, 48, 48) and meta["orig_size"] == (60 * k, 120 * k)
    torch.testing.assert_close(meta["scale"], torch.tensor([0.4 / k, 0.4 / k]))
    torch.testing.assert_close(meta["pad"], torch.tensor([0.0, 12.0]))
    bright = denormalize_image(image)[0].numpy() > 0.5
    back = boxes_to_original(torch.tensor(extent(bright)), meta["scale"], meta["pad"])
    assert iou(back.tolist(), [10 * k, 20 * k, 40 * k, 50 * k]) > 0.85
    with pytest.raises(FileNotFoundError, match="nothing.jpg"):
        load_image_for_detection(tmp_path / "nothing.jpg", 48)


def test_normalisation_range():
    x = torch.tensor([0, 128, 255], dtype=torch.uint8)
    y = normalize_image(x)
    assert y[0] == -1 and y[2] == 1 and abs(float(y[1])) < 0.01


# --------------------------------------------------------------------------------------------------
# WIDER FACE
# --------------------------------------------------------------------------------------------------

TRAIN_GT = """\
0--Parade/0_Parade_marchingband_1_5.jpg
2
4 5 10 12 0 0 0 0 0 0 
20 8 6 6 2 0 0 1 0 0 
0--Parade/0_Parade_Parade_0_17.jpg
0
0 0 0 0 0 0 0 0 0 0 
12--Group/12_Group_Group_12_Group_Group_12_3.jpg
4
2 3 80 80 0 0 0 0 0 0 
10 10 0 5 0 0 0 0 0 0 
14 2 6 -1 0 0 0 0 0 0 
130 40 100 120 1 1 0 0 1 1 
"""

VAL_GT = """\
0--Parade/0_Parade_marchingband_1_20.jpg
3
4 4 16 16 0 0 0 0 0 0 
30 6 8 8 2 0 0 0 2 0 
44 20 4 4 2 0 0 1 0 0 
12--Group/12_Group_Group_12_Group_Group_12_10.jpg
1
20 40 100 120 0 0 0 0 0 0 
"""

# Image sizes (h, w) of the fixture files.
SIZES = {
    "0--Parade/0_Parade_marchingband_1_5.jpg": (40, 60),
    "0--Parade/0_Parade_Parade_0_17.jpg": (30, 30),
    "12--Group/12_Group_Group_12_Group_Group_12_3.jpg": (300, 256),  # large: decoded at a reduction
    "0--Parade/0_Parade_marchingband_1_20.jpg": (48, 64),
    "12--Group/12_Group_Group_12_Group_Group_12_10.jpg": (400, 240),  # large: decoded at a reduction
}


def make_widerface(root: Path, with_eval: bool = False) -> Path:
    """Write a tiny WIDER FACE tree in the official layout: JPEGs with a white rectangle per valid face."""
    for split, text in (("train", TRAIN_GT), ("val", VAL_GT)):
        (root / "wider_face_split").mkdir(parents=True, exist_ok=True)
        (root / "wider_face_split" / f"wider_face_{split}_bbx_gt.txt").write_text(text)
        for rec in parse_annotations(root / "wider_face_split" / f"wider_face_{split}_bbx_gt.txt"):
            h, w = SIZES[rec.path]
            arr = np.full((h, w, 3), 30, dtype=np.uint8)
            for x1, y1, x2, y2 in rec.boxes[rec.keep].astype(int):
                arr[y1:y2, x1:x2] = 230
            out = root / f"WIDER_{split}" / "images" / rec.path
            out.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(arr).save(out, quality=95)
    if with_eval:
        write_eval_mats(root / "eval_tools" / "ground_truth")
    return root


def _cell(items) -> np.ndarray:
    arr = np.empty((len(items), 1), dtype=object)
    for i, item in enumerate(items):
        arr[i, 0] = item
    return arr


def write_eval_mats(folder: Path, keep=None, names_apart: bool = False) -> None:
    """Difficulty lists in the official structure: per event a cell of file names and a cell (one per
    image) of 1-based indices of the boxes that count, as MATLAB doubles of shape [k, 1]. With
    ``names_apart`` the event and file lists are only in wider_face_val.mat."""
    from scipy.io import savemat

    folder.mkdir(parents=True, exist_ok=True)
    keep = keep or {
        "easy": {"0_Parade_marchingband_1_20": [1], "12_Group_Group_12_Group_Group_12_10": []},
        "medium": {"0_Parade_marchingband_1_20": [1, 2], "12_Group_Group_12_Group_Group_12_10": [1]},
        "hard": {"0_Parade_marchingband_1_20": [1, 2], "12_Group_Group_12_Group_Group_12_10": [1]},
    }
    events = {"0--Parade": ["0_Parade_marchingband_1_20"], "12--Group": ["12_Group_Group_12_Group_Group_12_10"]}
    for level, table in keep.items():
        event_list = _cell(list(events))
        file_list = _cell([_cell(names) for names in events.values()])
        gt_list = _cell([
            _cell([np.asarray(table[n], dtype=np.float64).reshape(-1, 1) for n in names]) for names in events.values()
        ])
        names = {"event_list": event_list, "file_list": file_list}
        if names_apart:
            savemat(str(folder / "wider_face_val.mat"), names)
            savemat(str(folder / f"wider_{level}_val.mat"), {"gt_list": gt_list})
        else:
            savemat(str(folder / f"wider_{level}_val.mat"), {**names, "gt_list": gt_list})


def test_parse_odd_cases(tmp_path):
    path = tmp_path / "gt.txt"
    path.write_text(TRAIN_GT + "\n\n")  # trailing blank lines are fine
    records = parse_annotations(path)
    assert [r.path for r in records] == list(SIZES)[:3]
    a, empty, c = records
    assert a.boxes.tolist() == [[4, 5, 14, 17], [20, 8, 26, 14]]
    assert a.keep.tolist() == [True, False] and a.invalid.tolist() == [False, True]
    assert a.attributes[1].tolist() == [2, 0, 0, 1, 0, 0]
    assert empty.boxes.shape == (0, 4) and empty.keep.shape == (0,) and empty.line == 5
    assert c.keep.tolist() == [True, False, False, True]  # zero width, negative height dropped
    assert c.event == "12--Group" and c.name == "12_Group_Group_12_Group_Group_12_3"
    assert c.attributes[3].tolist() == [1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("a/b.jpg\n1\n1 2 3 4 0 0 0 0 0\n", 3, "10 integers"),
        ("a/b.jpg\nx\n", 2, "face count"),
        ("a/b.jpg\n-1\n", 2, "negative"),
        ("a/b.jpg\n0\nc/d.jpg\n1\n1 1 2 2 0 0 0 0 0 0\n", 3, "placeholder"),
        ("a/b.jpg\n0\n1 1 1 1 0 0 0 0 0 0\n", 3, "ten zeros"),
        ("a/b.jpg\n2\n1 1 2 2 0 0 0 0 0 0\n", 4, "ends"),
        ("a/b.jpg\n1\n1 1 2 2 0 0 0 2 0 0\n", 3, "invalid flag"),
        ("a/b.jpg\n1\n1 1 2.5 2 0 0 0 0 0 0\n", 3, "10 integers"),
        ("a/b.jpg\n1\n1 1 2 2 0 0 0 0 0 0\n\nc/d.jpg\n", 4, "blank"),
        ("7\n", 1, "image path"),
        ("a/b.jpg\n", 2, "ends"),
    ],
)
def test_parse_rejects_malformed_files_with_line_numbers(tmp_path, text, line, words):
    path = tmp_path / "wider_face_train_bbx_gt.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"wider_face_train_bbx_gt.txt, line {line}:.*{words}"):
        parse_annotations(path)


def test_widerface_missing_files_say_what_to_download(tmp_path):
    dm = WiderFaceDataModule(root=str(tmp_path / "widerface"), num_workers=0)
    with pytest.raises(FileNotFoundError) as err:
        dm.setup()
    msg = str(err.value)
    for words in ("WIDER_train", "WIDER_train.zip", "WIDER_val.zip", "wider_face_split.zip",
                  "shuoyang1213.me/WIDERFACE", str(tmp_path / "widerface")):
        assert words in msg
    root = make_widerface(tmp_path / "w")
    (root / "WIDER_val" / "images" / "0--Parade" / "0_Parade_marchingband_1_20.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="0_Parade_marchingband_1_20.jpg does not exist"):
        WiderFaceDataModule(root=str(root), num_workers=0).setup()
    with pytest.raises(ValueError, match="data.root"):
        WiderFaceDataModule(root=None)


def test_widerface_datamodule_on_fixture(tmp_path):
    root = make_widerface(tmp_path)
    dm = WiderFaceDataModule(root=str(root), image_size=32, batch_size=2, num_workers=0, max_boxes=4, seed=0)
    dm.setup()
    assert len(dm.train_set) == 3 and len(dm.val_set) == 2 and dm.test_set is dm.val_set
    assert dm.val_set.records[0].difficulty is None  # no eval_tools
    # evaluation samples: original resolution, boxes on the bright rectangles, mapping back to the file's pixels
    for i, rec in enumerate(dm.val_set.records):
        image, target = dm.val_set[i]
        assert image.shape == (3, *SIZES[rec.path]) and target["orig_size"] == SIZES[rec.path]
        assert target["boxes"].shape == (int(rec.keep.sum()), 4)
        back = boxes_to_original(target["boxes"], target["scale"], target["pad"], target["orig_size"])
        torch.testing.assert_close(back, torch.from_numpy(rec.boxes[rec.keep]), atol=1e-3, rtol=1e-4)
        grey = denormalize_image(image)[0]
        for x1, y1, x2, y2 in target["boxes"].round().int().tolist():
            assert grey[y1 + 1:y2 - 1, x1 + 1:x2 - 1].mean() > 0.6
    images, t = next(iter(dm.val_dataloader()))
    assert images.shape == (2, 3, 416, 256) and t["boxes"].shape == (2, 4, 4)  # padded to multiples of 32
    assert t["num_boxes"].tolist() == [2, 1] and not torch.isnan(t["scale"]).any()
    # training: the 0-face image gives an empty target; batches keep the fixed shape
    torch.manual_seed(0)
    _, empty = dm.train_set[1]
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,)
    for images, t in dm.train_dataloader():
        assert images.shape[1:] == (3, 32, 32) and t["boxes"].shape[1:] == (4, 4)
        assert torch.all(t["num_boxes"] <= 2)
    # a large training image is decoded at a reduction: its boxes must still sit on its rectangles
    plain = TrainTransform(32, hflip=1.0, zoom_out=1.0, crop_scale=(1.0, 1.0), crop_ratio=(0.1, 10.0))
    image, target = WiderFaceDataset(root, "train", 32, plain)[2]
    assert target["boxes"].shape == (2, 4)
    grey = denormalize_image(image)[0]
    for x1, y1, x2, y2 in target["boxes"].round().int().tolist():
        assert grey[y1 + 1:y2 - 1, x1 + 1:x2 - 1].mean() > 0.6
        assert grey[y1:y2, x1:x2].numel() > 4


def test_widerface_difficulty_lists(tmp_path):
    root = make_widerface(tmp_path, with_eval=True)
    lists = load_difficulty_lists(root / "eval_tools" / "ground_truth")
    assert lists["medium"][("0--Parade", "0_Parade_marchingband_1_20")].tolist() == [0, 1]
    ds = WiderFaceDataset(root, "val", 32)
    by_name = {r.name: r for r in ds.records}
    parade = by_name["0_Parade_marchingband_1_20"]
    assert parade.difficulty["easy"].tolist() == [True, False, False]
    assert parade.difficulty["hard"].tolist() == [True, True, False]  # the invalid third box never counts
    assert by_name["12_Group_Group_12_Group_Group_12_10"].difficulty["medium"].tolist() == [True]
    assert by_name["12_Group_Group_12_Group_Group_12_10"].difficulty["easy"].tolist() == [False]  # empty gt_list
    # event and file names kept only in wider_face_val.mat
    write_eval_mats(root / "eval_tools" / "ground_truth", names_apart=True)
    again = {r.name: r for r in WiderFaceDataset(root, "val", 32).records}
    assert again["0_Parade_marchingband_1_20"].difficulty["medium"].tolist() == [True, True, False]
    # files that do not belong to these annotations
    write_eval_mats(root / "eval_tools" / "ground_truth", keep={
        level: {"0_Parade_marchingband_1_20": [1, 7], "12_Group_Group_12_Group_Group_12_10": [1]}
        for level in ("easy", "medium", "hard")
    })
    with pytest.raises(ValueError, match="box 7 of 0--Parade/0_Parade_marchingband_1_20"):
        WiderFaceDataset(root, "val", 32)
    write_eval_mats(root / "eval_tools" / "ground_truth", keep={
        level: {"0_Parade_marchingband_1_20": [1], "12_Group_Group_12_Group_Group_12_10": [1]}
        for level in ("easy", "medium", "hard")
    })
    (root / "wider_face_split" / "wider_face_val_bbx_gt.txt").write_text(VAL_GT.split("12--Group")[0])
    with pytest.raises(ValueError, match="12_Group_Group_12_Group_Group_12_10, which the annotation file lacks"):
        WiderFaceDataset(root, "val", 32)


# --------------------------------------------------------------------------------------------------
# Registry and configs
# --------------------------------------------------------------------------------------------------


def test_configs_compose_and_build(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    conf = Path(__file__).resolve().parents[1] / "conf"
    monkeypatch.setenv("SNNTRAIN_DATA", str(tmp_path))
    make_widerface(tmp_path / "widerface")
    assert {"faces", "widerface"} <= set(DATAMODULES)
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        for name in ("faces", "widerface"):
            cfg = compose(config_name="config", overrides=[f"data={name}", "seed=3"])
            assert cfg.data.num_classes == 1 and cfg.data.in_channels == 3
            cfg.data.num_workers = 0
            if name == "faces":
                cfg.data.num_train, cfg.data.num_val, cfg.data.num_test = 8, 4, 4
            dm = build_datamodule(cfg.data, seed=cfg.seed)
            assert dm.seed == 3 and dm.num_classes == 1
            dm.setup()
            images, t = next(iter(dm.val_dataloader()))
            # faces: the rendered squares; widerface: the original resolution, padded to multiples of 32
            assert images.shape[-1] == (cfg.data.image_size if name == "faces" else 256) and t["boxes"].shape[-1] == 4
