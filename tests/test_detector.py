"""Spiking FCOS: structure, target assignment on hand-made cases, decoding and NMS."""

from __future__ import annotations

import math

import pytest
import torch

from snntrain.models import SpikingFCOS, build_model
from snntrain.models.detector import (
    VALID_RANGE_SLACK,
    default_scale_ranges,
    fcos_targets,
    finest_scale,
    pyramid_scales,
    tile_starts,
)


def tiny_detector(**head) -> SpikingFCOS:
    cfg = {"fpn_levels": [1, 2, 3], "fpn_channels": 8, "num_convs": 1}
    cfg.update(head)
    return SpikingFCOS(num_classes=1, in_channels=3, T=2, width=4, head=cfg, backend="torch")


def test_forward_shapes_and_locations():
    m = tiny_detector()
    out = m(torch.randn(2, 3, 64, 64))
    # imagenet stem: stages 1-3 at strides 4, 8, 16 -> 16x16 + 8x8 + 4x4 locations
    assert m.strides == [4, 8, 16]
    L = 16 * 16 + 8 * 8 + 4 * 4
    assert out["cls_logits"].shape == (2, L, 1) and out["box_ltrb"].shape == (2, L, 4)
    assert out["centerness"].shape == (2, L) and out["points"].shape == (L, 2)
    assert (out["box_ltrb"] > 0).all()
    assert out["points"][0].tolist() == [2.0, 2.0] and out["points"][1].tolist() == [6.0, 2.0]
    assert out["points"][256].tolist() == [4.0, 4.0]  # first location of the stride-8 level
    assert out["strides"][:256].eq(4).all() and out["strides"][-16:].eq(16).all()
    loss = out["cls_logits"].sum() + out["box_ltrb"].sum() + out["centerness"].sum()
    loss.backward()


def test_build_model_picks_detector_when_head_given():
    m = build_model({"name": "sew_resnet", "depth": 18, "width": 4, "stem": "imagenet", "num_classes": 1,
                     "in_channels": 3, "T": 2, "head": {"fpn_levels": [2, 3], "fpn_channels": 8}}, backend="torch")
    assert isinstance(m, SpikingFCOS) and m.strides == [8, 16]
    assert not hasattr(m.backbone, "fc")


def test_rate_readout_runs():
    m = tiny_detector(readout="rate")
    out = m(torch.randn(1, 3, 32, 32))
    assert torch.isfinite(out["cls_logits"]).all()


@pytest.mark.parametrize(
    "head, message",
    [
        ({"fpn_levels": [3, 2]}, "fpn_levels=\\[3, 2\\] must be increasing"),
        ({"fpn_levels": [5]}, "must be increasing backbone stages among 1, 2, 3, 4"),
        ({"readout": "voltage"}, "readout='voltage' is not valid; choose one of membrane, rate"),
        ({"scale_ranges": [[0, 10]]}, "scale_ranges has 1 entries; fpn_levels has 3"),
        ({"anchors": 3}, "unknown detector head setting"),
        ({"flip_test": "yes"}, "flip_test"),
        ({"object_sizes": [48, 10]}, "object_sizes=\\[48, 10\\] must be \\[lo, hi\\]"),
        ({"object_sizes": 10}, "object_sizes=10 must be"),
        ({"test_scales": "all"}, "test_scales='all' is not valid; give auto or a non-empty list"),
        ({"test_scales": [1.0, 0]}, "test_scales=\\[1.0, 0\\] is not valid"),
        ({"test_scales": []}, "test_scales=\\[\\] is not valid"),
        ({"tile_size": 32}, "tile_size=32 must be at least 64"),
        ({"scale_step": 1.0}, "scale_step=1.0 must be larger than 1"),
        ({"train_size": 0}, "train_size=0 must be a positive integer"),
    ],
)
def test_bad_head_settings(head, message):
    with pytest.raises(ValueError, match=message):
        tiny_detector(**head)


def test_default_scale_ranges_follow_fcos():
    assert default_scale_ranges([8, 16, 32]) == [(0.0, 64.0), (64.0, 128.0), (128.0, math.inf)]


def grid(stride: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = size // stride
    ys, xs = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    points = torch.stack([xs.flatten(), ys.flatten()], 1).float() * stride + stride // 2
    strides = torch.full((n * n,), float(stride))
    ranges = torch.tensor([[0.0, math.inf]]).expand(n * n, 2)
    return points, strides, ranges


def test_targets_centre_sampling_and_values():
    points, strides, ranges = grid(8, 64)  # centres at 4, 12, ..., 60
    boxes = torch.tensor([[[8.0, 8.0, 40.0, 24.0]]])  # centre (24, 16), 32 x 16
    t = fcos_targets(points, strides, ranges, boxes, torch.tensor([[0]]), torch.tensor([1]), 1.5)
    pos = t["positive"][0].view(8, 8)
    # centre region: |x - 24| < 12 and |y - 16| < 12, clipped to the box: x in (12, 36), y in (8, 24)
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[1:3, 2:4] = True  # y = 12, 20 and x = 20, 28
    assert torch.equal(pos, expected)
    i = 1 * 8 + 2  # point (20, 12)
    assert t["ltrb"][0, i].tolist() == [12.0, 4.0, 20.0, 12.0]
    assert t["centerness"][0, i].item() == pytest.approx(math.sqrt(12 / 20 * 4 / 12))
    assert t["labels"][0, i].item() == 0 and t["labels"][0, 0].item() == -1
    assert t["ltrb"][0, 0].tolist() == [0, 0, 0, 0] and t["centerness"][0, 0] == 0


def test_targets_smallest_box_wins_and_padding_ignored():
    points, strides, ranges = grid(8, 64)
    big = [0.0, 0.0, 64.0, 64.0]
    small = [16.0, 16.0, 40.0, 40.0]  # centre (28, 28)
    boxes = torch.tensor([[big, small, [0.0, 0.0, 0.0, 0.0]]])
    labels = torch.tensor([[0, 0, -1]])
    t = fcos_targets(points, strides, ranges, boxes, labels, torch.tensor([2]), 10.0)
    p = 3 * 8 + 3  # point (28, 28): inside both boxes -> the small one
    assert t["ltrb"][0, p].tolist() == [12.0, 12.0, 12.0, 12.0]
    q = 0  # point (4, 4): only in the big box
    assert t["ltrb"][0, q].tolist() == [4.0, 4.0, 60.0, 60.0]
    # the padding row (index 2) would match nothing even without num_boxes; with num_boxes=0 nothing is positive
    t0 = fcos_targets(points, strides, ranges, boxes, labels, torch.tensor([0]), 10.0)
    assert not t0["positive"].any()


def test_targets_respect_scale_ranges():
    points, strides, _ = grid(8, 64)
    ranges = torch.tensor([[0.0, 10.0]]).expand(points.shape[0], 2)
    boxes = torch.tensor([[[0.0, 0.0, 48.0, 48.0]]])
    t = fcos_targets(points, strides, ranges, boxes, torch.tensor([[0]]), torch.tensor([1]), 10.0)
    assert not t["positive"].any()  # every location's reach exceeds 10 px


def test_decode_thresholds_nms_and_clipping():
    m = tiny_detector(score_thresh=0.3, nms_thresh=0.5, max_detections=2)
    points = torch.tensor([[10.0, 10.0], [11.0, 10.0], [40.0, 40.0], [60.0, 60.0]])
    big = 20.0
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    outputs = {
        "points": points,
        "box_ltrb": torch.tensor([[[5.0, 5, 5, 5], [5.0, 5, 5, 5], [5.0, 5, 5, 5], [big, big, big, big]]]),
        "cls_logits": torch.tensor([[[logit(0.9)], [logit(0.8)], [logit(0.7)], [logit(0.1)]]]),
        "centerness": torch.full((1, 4), 30.0),  # sigmoid ~ 1: score = sqrt(cls)
    }
    det = m.decode(outputs, image_size=(64, 64))[0]
    # location 1 overlaps location 0 (IoU 0.82) and is suppressed; location 3 is under the threshold
    assert det["boxes"].tolist() == [[5.0, 5.0, 15.0, 15.0], [35.0, 35.0, 45.0, 45.0]]
    assert det["scores"].tolist() == pytest.approx([math.sqrt(0.9), math.sqrt(0.7)], rel=1e-5)
    assert det["labels"].tolist() == [0, 0]
    outputs["cls_logits"][0, 3, 0] = logit(0.99)
    det = m.decode(outputs, image_size=(64, 64))[0]
    assert det["boxes"][0].tolist() == [40.0, 40.0, 64.0, 64.0]  # clipped to the image


def test_targets_do_not_depend_on_the_box_chunking():
    # many boxes, equal-area ties and duplicates: chunked candidate tests must give the same assignment
    g = torch.Generator().manual_seed(0)
    points = torch.rand(300, 2, generator=g) * 200
    strides = torch.randint(1, 4, (300,), generator=g).float() * 4
    ranges = torch.stack([torch.zeros(300), torch.full((300,), 1e5)], 1)
    ranges[::3, 1] = 20
    xy = torch.rand(2, 30, 2, generator=g) * 180
    wh = torch.rand(2, 30, 2, generator=g) * 60 + 2
    wh[:, 5] = wh[:, 4]
    boxes = torch.cat([xy, xy + wh], -1)
    boxes[:, 7] = boxes[:, 6]
    labels = torch.zeros(2, 30, dtype=torch.long)
    num = torch.tensor([30, 11])
    whole = fcos_targets(points, strides, ranges, boxes, labels, num, 1.5, chunk_elements=1 << 30)
    assert whole["positive"].sum() > 20
    for chunk in (1, 4, 7):
        part = fcos_targets(points, strides, ranges, boxes, labels, num, 1.5, chunk_elements=chunk * 600)
        for key in whole:
            assert torch.equal(part[key], whole[key]), (chunk, key)


def test_mirror_index_maps_each_location_to_its_mirror_image():
    m = tiny_detector()
    out = m(torch.randn(1, 3, 32, 48))
    index = m.mirror_index(48, out)
    p = out["points"]
    assert torch.equal(p[index, 0], 48 - p[:, 0]) and torch.equal(p[index, 1], p[:, 1])
    assert torch.equal(out["strides"][index], out["strides"])
    assert torch.equal(index[index], torch.arange(len(index)))  # mirroring twice is the identity
    with pytest.raises(ValueError, match="multiple of every stride"):
        m.mirror_index(40, out)


def test_flip_merge_keeps_outputs_whose_mirror_image_agrees():
    """When the mirrored image's outputs are exactly the mirror of the plain ones, averaging changes nothing;
    otherwise each output is the mean of its own and its mirror location's (left and right swapped)."""
    m = tiny_detector()
    g = torch.Generator().manual_seed(0)
    out = m(torch.randn(2, 3, 32, 32))
    out = {k: v.detach() for k, v in out.items()}
    index = m.mirror_index(32, out)
    mirrored = dict(out, cls_logits=out["cls_logits"][:, index], centerness=out["centerness"][:, index],
                    box_ltrb=out["box_ltrb"][:, index][..., [2, 1, 0, 3]])
    merged = m.merge_flipped(out, mirrored, 32)
    for key in ("cls_logits", "centerness", "box_ltrb"):
        torch.testing.assert_close(merged[key], out[key])
    other = dict(out, cls_logits=torch.randn(out["cls_logits"].shape, generator=g),
                 box_ltrb=torch.rand(out["box_ltrb"].shape, generator=g) * 10)
    merged = m.merge_flipped(out, other, 32)
    i = 5  # the location in row 0, column 5 of the stride-4 level; its mirror is column 2
    assert int(index[i]) == 2
    torch.testing.assert_close(merged["cls_logits"][:, i], (out["cls_logits"][:, i] + other["cls_logits"][:, 2]) / 2)
    l, t, r, b = other["box_ltrb"][:, 2].unbind(-1)
    torch.testing.assert_close(merged["box_ltrb"][:, i], (out["box_ltrb"][:, i] + torch.stack([r, t, l, b], -1)) / 2)


def test_flip_test_detects_from_both_views_and_pads_odd_widths():
    torch.manual_seed(0)
    # batch statistics (training mode): a freshly built network's running statistics leave its towers
    # silent, and every location would predict the same
    m = tiny_detector(flip_test=True, score_thresh=0.0).train()
    for conv in (m.head.cls_logits[0], m.head.box_ltrb[0], m.head.centerness[0]):
        torch.nn.init.normal_(conv.weight, std=0.3)
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        want = m.decode(m.merge_flipped(m(x), m(x.flip(-1)), 48), image_size=(32, 48))
    got = m.detect(x)
    for a, b in zip(got, want):
        assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["scores"], b["scores"])
    plain = tiny_detector(score_thresh=0.0)
    plain.load_state_dict(m.state_dict())
    mine = plain.detect(x)[0]
    assert not (torch.equal(mine["scores"], got[0]["scores"]) and torch.equal(mine["boxes"], got[0]["boxes"]))
    # a width that is not a multiple of the coarsest stride (16) is padded on the right; boxes stay inside
    odd = m.detect(torch.randn(1, 3, 32, 42))[0]["boxes"]
    assert len(odd) and float(odd[:, 2].max()) <= 42.0


# ---------------------------------------------------------------------------------------- multi-scale inference


def test_pyramid_runs_from_the_photo_down_to_the_training_square():
    scales = pyramid_scales(886, 1280, 64)
    assert scales[0] == 1.0 and scales[-1] == pytest.approx(64 / 1280)
    ratios = [a / b for a, b in zip(scales, scales[1:])]
    assert all(r <= 2.0 + 1e-9 for r in ratios) and max(ratios) == pytest.approx(min(ratios))
    assert len(pyramid_scales(886, 1280, 64, step=4.0)) < len(scales)
    assert pyramid_scales(64, 64, 64) == [1.0]  # the training square: one pass, as validation runs
    assert pyramid_scales(40, 50, 64) == [64 / 50]  # smaller than the training square: enlarged to it


def test_min_object_sets_the_finest_scale():
    # faces of 3 % of a 886 px shorter side (26.6 px) reach the smallest trained size (10 px) at scale 0.376
    assert finest_scale(886, 1280, 10, 0.03) == pytest.approx(10 / (0.03 * 886))
    assert finest_scale(886, 1280, 10, 0.0) == 1.0 and finest_scale(200, 300, 10, 0.03) == 1.0  # never enlarged
    m = tiny_detector(object_sizes=[10, 48], train_size=64, min_object=0.03)
    plan = m.scale_plan(886, 1280)
    assert plan[0] == pytest.approx(10 / (0.03 * 886)) and plan[-1] == pytest.approx(64 / 1280)
    with pytest.raises(ValueError, match="min_object=1.5 must be in"):
        tiny_detector(min_object=1.5)
    with pytest.raises(ValueError, match="merge='wbf' is not valid; choose one of nms, vote"):
        tiny_detector(merge="wbf")


def test_tiles_cover_the_image_and_overlap():
    for length, tile, overlap in [(1280, 1024, 92), (4000, 1024, 92), (300, 64, 30), (65, 64, 8)]:
        starts = tile_starts(length, tile, overlap)
        assert starts[0] == 0 and starts[-1] + tile == length
        assert all(b - a <= tile - overlap for a, b in zip(starts, starts[1:]))
    assert tile_starts(500, 1024, 92) == [0]


def test_scale_plan_auto_needs_the_training_sizes():
    m = tiny_detector()
    assert m.scale_plan(500, 800) == [1.0]  # sizes unknown (an older checkpoint): one pass
    m = tiny_detector(object_sizes=[10, 48], train_size=64)
    assert m.scale_plan(500, 800) == pyramid_scales(500, 800, 64, 1.41, finest_scale(500, 800, 10, 0.03))
    assert m.scale_plan(500, 800, [0.5, 1, 0.5]) == [1.0, 0.5]
    with pytest.raises(ValueError, match="scales=\\[-1\\] is not valid"):
        m.scale_plan(500, 800, [-1])


def _noisy(m: SpikingFCOS) -> SpikingFCOS:
    # batch statistics (training mode) and strong prediction weights: a fresh network predicts the same
    # everywhere otherwise
    m.train()
    for conv in (m.head.cls_logits[0], m.head.box_ltrb[0], m.head.centerness[0]):
        torch.nn.init.normal_(conv.weight, std=0.3)
    return m


def test_one_scale_is_the_resized_image_mapped_back():
    torch.manual_seed(0)
    m = _noisy(tiny_detector(score_thresh=0.0, merge="nms"))
    x = torch.randn(2, 3, 64, 96)
    half = torch.nn.functional.interpolate(x, size=(32, 48), mode="bilinear", align_corners=False, antialias=True)
    with torch.no_grad():
        want = m.decode(m(half), image_size=(32, 48))
    got = m.detect(x, scales=[0.5])
    for a, b in zip(got, want):  # both in decreasing score order
        assert torch.allclose(a["boxes"], b["boxes"] * 2, atol=1e-4) and torch.equal(a["scores"], b["scores"])
    # scale 1 on an image no larger than a tile is the single pass of validation
    for a, b in zip(m.detect(x, scales=[1.0]), m.decode(m(x), image_size=(64, 96))):
        assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["scores"], b["scores"])
    # outputs computed by the caller (validation) are decoded as they are, even for an image larger than a tile
    m.tile_size = 64
    with torch.no_grad():
        outputs = m(x)
    for a, b in zip(m.detect(x, outputs, scales=[1.0]), m.decode(outputs, image_size=(64, 96))):
        assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["scores"], b["scores"])


def test_large_images_run_in_tiles_each_box_decoded_once(monkeypatch):
    """An image larger than tile_size runs tile by tile: no pass sees more than a tile, the tiles cover the
    image with overlaps larger than the largest trained object, and a box is kept by the one tile whose own
    part holds its centre, mapped back to the image's pixels."""
    m = tiny_detector(object_sizes=[8, 16], train_size=32, tile_size=64)
    seen = []
    objects = torch.tensor([[30.0, 40.0, 46.0, 56.0], [100.0, 50.0, 120.0, 70.0], [150.0, 90.0, 166.0, 106.0]])

    def fake_pass(images, outputs=None):  # "detects" every object wholly inside the crop, in crop pixels
        y0, x0 = seen_offsets.pop(0)
        h, w = images.shape[-2:]
        seen.append((y0, x0, h, w))
        inside = ((objects[:, 0] >= x0) & (objects[:, 2] <= x0 + w) & (objects[:, 1] >= y0) & (objects[:, 3] <= y0 + h))
        boxes = objects[inside] - torch.tensor([x0, y0, x0, y0], dtype=torch.float32)
        return [{"boxes": boxes, "scores": torch.ones(len(boxes)), "labels": torch.zeros(len(boxes), dtype=torch.long)}]

    H, W = 120, 200
    overlap = min(32, math.ceil(16 * VALID_RANGE_SLACK[1]) + 2 * 16)
    ys, xs = tile_starts(H, 64, overlap), tile_starts(W, 64, overlap)
    seen_offsets = [(y, x) for y in ys for x in xs]
    monkeypatch.setattr(m, "_detect_pass", fake_pass)
    got = m.detect_scaled(torch.zeros(1, 3, H, W), 1.0)[0]
    assert len(seen) == len(ys) * len(xs) > 4 and all(h <= 64 and w <= 64 for _, _, h, w in seen)
    assert sorted(got["boxes"].tolist()) == sorted(objects.tolist())  # each object once, in image pixels


def test_pyramid_keeps_trained_sizes_per_scale_and_merges(monkeypatch):
    m = tiny_detector(object_sizes=[10, 40], train_size=64, nms_thresh=0.5, scale_step=2.0, min_object=0.0,
                      merge="nms")
    plan = m.scale_plan(256, 256)
    assert plan == [1.0, 0.5, 0.25]

    def fake_scaled(images, scale):
        # per scale: a face of 100 px (image pixels) seen well at 0.25 (25 px), with a score that depends on
        # the scale, and a box of 12 px in the image that is only plausible at the finest scale
        face = torch.tensor([[50.0, 50.0, 150.0, 150.0]])
        small = torch.tensor([[200.0, 200.0, 212.0, 212.0]])
        boxes = torch.cat([face, small])
        scores = torch.tensor([{1.0: 0.9, 0.5: 0.6, 0.25: 0.7}[scale], 0.8])
        return [{"boxes": boxes, "scores": scores, "labels": torch.zeros(2, dtype=torch.long)}]

    monkeypatch.setattr(m, "detect_scaled", fake_scaled)
    det = m.detect(torch.zeros(1, 3, 256, 256))[0]
    # the 100 px face is 100 px at scale 1 (above 40 x 1.25: dropped there), 50 px at 0.5 (kept, 0.6) and
    # 25 px at 0.25 (kept, 0.7): NMS keeps the better one; the 12 px box survives only at the finest scale
    assert det["scores"].tolist() == pytest.approx([0.8, 0.7])
    assert det["boxes"].tolist() == [[200.0, 200.0, 212.0, 212.0], [50.0, 50.0, 150.0, 150.0]]


def test_pyramid_detects_a_photo_end_to_end_within_its_pixels():
    torch.manual_seed(0)
    m = _noisy(tiny_detector(object_sizes=[8, 16], train_size=32, tile_size=64, score_thresh=0.0, flip_test=True,
                             scale_step=2.0))
    x = torch.randn(1, 3, 90, 150)
    assert len(m.scale_plan(90, 150)) == 4
    det = m.detect(x)[0]
    assert 0 < len(det["boxes"]) <= m.max_detections
    assert float(det["boxes"][:, 2].max()) <= 150 and float(det["boxes"][:, 3].max()) <= 90
    assert (det["scores"][:-1] >= det["scores"][1:]).all()


def test_vote_averages_boxes_and_asks_two_scales_to_agree(monkeypatch):
    m = tiny_detector(object_sizes=[10, 40], train_size=64, nms_thresh=0.5, scale_step=2.0, min_object=0.0)
    assert m.scale_plan(256, 256) == [1.0, 0.5, 0.25]

    def fake_scaled(images, scale):
        # a 60 px face (valid at 0.5: 30 px and 0.25: 15 px; too large at 1: 60 > 50) found at 0.5 and 0.25 with
        # slightly different boxes; a 60 px box elsewhere found only at 0.5
        face = {0.5: [40.0, 40.0, 100.0, 100.0], 0.25: [44.0, 44.0, 104.0, 104.0], 1.0: [40.0, 40.0, 100.0, 100.0]}
        score = {0.5: 0.8, 0.25: 0.6, 1.0: 0.9}
        boxes, scores = [face[scale]], [score[scale]]
        if scale == 0.5:
            boxes.append([150.0, 150.0, 210.0, 210.0])
            scores.append(0.9)
        return [{"boxes": torch.tensor(boxes), "scores": torch.tensor(scores), "labels": torch.zeros(len(boxes),
                                                                                                     dtype=torch.long)}]

    monkeypatch.setattr(m, "detect_scaled", fake_scaled)
    det = m.detect(torch.zeros(1, 3, 256, 256))[0]
    # the face: (0.8 + 0.6) / 2, its box the score-weighted mean (the scale-1 box is out of range there);
    # the other box: one of the two scales that should have seen it, (0.9 + 0) / 2
    assert det["scores"].tolist() == pytest.approx([0.7, 0.45])
    want = (torch.tensor([40.0, 40.0, 100.0, 100.0]) * 0.8 + torch.tensor([44.0, 44.0, 104.0, 104.0]) * 0.6) / 1.4
    torch.testing.assert_close(det["boxes"][0], want)
    torch.testing.assert_close(det["boxes"][1], torch.tensor([150.0, 150.0, 210.0, 210.0]))


@pytest.mark.slow  # torch.compile of a small detector
def test_compiled_forward_computes_the_point_grid_in_the_graph():
    """Inside ``torch.compile`` the point grid is computed in the graph, never cached from it (under
    ``reduce-overhead`` a cached grid would be CUDA-graph output memory that the next replay overwrites); the
    compiled forward gives the eager outputs, and eager calls still use the cache."""
    from snntrain.tasks.speed import compile_model

    torch._dynamo.reset()
    model = tiny_detector().train()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    compiled = compile_model(model, "default", backend="aot_eager")
    with torch.no_grad():
        got = compiled(x)
        assert not model._points_cache
        want = model(x)
    assert len(model._points_cache) == 1
    for key in ("points", "strides", "ranges", "cls_logits", "box_ltrb"):
        torch.testing.assert_close(got[key], want[key])
