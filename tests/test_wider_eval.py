"""The WIDER FACE evaluation against hand-computed cases and a literal loop-by-loop transcription of the
official MATLAB code (eval_tools: norm_score, image_evaluation, image_pr_info, dataset_pr_info, VOCap)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from snntrain.wider_eval import (
    WiderFaceAP,
    box_overlap,
    evaluate,
    image_evaluation,
    normalize_scores,
    voc_ap,
)

# Two 10x10 faces (inclusive pixels: x2 = x1 + 9 means a width of 10 in boxoverlap's +1 convention).
FACE_A = [0, 0, 9, 9]
FACE_B = [50, 50, 59, 59]
MISS = [100, 100, 109, 109]


def level(masks):
    return {"hard": [np.asarray(m, dtype=bool) for m in masks]}


def ap_of(boxes, scores, gts, masks) -> float:
    return evaluate([np.asarray(b, float) for b in boxes], [np.asarray(s, float) for s in scores],
                    [np.asarray(g, float) for g in gts], level(masks))["hard"].ap


# ------------------------------------------------------------------ the MATLAB code, loop by loop


def matlab_reference(boxes, scores, gts, masks, thresh_num=1000):
    """A literal transcription of wider_eval.m's loops (1-based logic kept in comments); the oracle."""
    # read_pred: sort each image's detections by score, descending, stable
    preds = []
    for b, s in zip(boxes, scores):
        b, s = np.asarray(b, float).reshape(-1, 4), np.asarray(s, float).reshape(-1)
        order = sorted(range(len(s)), key=lambda k: -s[k])  # Python's sort is stable
        preds.append((b[order], s[order]))
    # norm_score over every image
    all_s = [v for _, s in preds for v in s]
    lo, hi = min(all_s), max(all_s)
    preds = [(b, (s - lo) / (hi - lo)) for b, s in preds]
    curve = np.zeros((thresh_num, 2))
    count_face = 0
    for (pb, ps), gt, keep in zip(preds, gts, masks):
        gt = np.asarray(gt, float).reshape(-1, 4)
        count_face += int(np.sum(keep))
        if len(gt) == 0 or len(pb) == 0:
            continue
        # image_evaluation
        pred_recall = np.zeros(len(pb))
        recall_list = np.zeros(len(gt))
        proposal_list = np.ones(len(pb))
        for h in range(len(pb)):
            overlaps = []
            for g in gt:
                x1, y1 = max(g[0], pb[h][0]), max(g[1], pb[h][1])
                x2, y2 = min(g[2], pb[h][2]), min(g[3], pb[h][3])
                w, hh = x2 - x1 + 1, y2 - y1 + 1
                inter = w * hh
                ua = (g[2] - g[0] + 1) * (g[3] - g[1] + 1) + (pb[h][2] - pb[h][0] + 1) * (pb[h][3] - pb[h][1] + 1)
                overlaps.append(0.0 if w <= 0 or hh <= 0 else inter / (ua - inter))
            idx = int(np.argmax(overlaps))
            if overlaps[idx] >= 0.5:
                if not keep[idx]:
                    recall_list[idx] = -1
                    proposal_list[h] = -1
                elif recall_list[idx] == 0:
                    recall_list[idx] = 1
            pred_recall[h] = np.sum(recall_list == 1)
        # image_pr_info
        for t in range(thresh_num):
            thresh = 1 - (t + 1) / thresh_num
            passing = [k for k in range(len(ps)) if ps[k] >= thresh]
            if passing:
                r = passing[-1]
                curve[t, 0] += np.sum(proposal_list[: r + 1] == 1)
                curve[t, 1] += pred_recall[r]
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = curve[:, 1] / curve[:, 0]
    recall = curve[:, 1] / count_face
    # VOCap with MATLAB's NaN-skipping max
    mrec = [0.0, *recall, 1.0]
    mpre = [0.0, *precision, 0.0]
    for i in range(len(mpre) - 2, -1, -1):
        if np.isnan(mpre[i]):
            mpre[i] = mpre[i + 1]
        elif not np.isnan(mpre[i + 1]):
            mpre[i] = max(mpre[i], mpre[i + 1])
    ap = sum((mrec[i] - mrec[i - 1]) * mpre[i] for i in range(1, len(mrec)) if mrec[i] != mrec[i - 1])
    return ap, precision, recall


# ------------------------------------------------------------------ hand-computed cases


def test_box_overlap_uses_inclusive_pixels():
    assert box_overlap(np.array([FACE_A]), np.array([5, 0, 14, 9]))[0] == pytest.approx(50 / 150)
    assert box_overlap(np.array([FACE_A]), np.array([0, 0, 9, 4]))[0] == pytest.approx(0.5)  # exactly 0.5
    assert box_overlap(np.array([FACE_A]), np.array([10, 0, 19, 9]))[0] == 0.0  # touching: no overlap
    # x1 == x2 is one pixel wide, not empty
    assert box_overlap(np.array([[3, 3, 3, 3]]), np.array([3, 3, 3, 3]))[0] == 1.0


def test_duplicate_detection_is_a_false_positive():
    # scores 0.9 (face A), 0.8 (A again), 0.3 (face B) -> normalised 1, 5/6, 0
    r = evaluate([np.array([FACE_A, FACE_A, FACE_B], float)], [np.array([0.9, 0.8, 0.3])],
                 [np.array([FACE_A, FACE_B], float)], level([[True, True]]))["hard"]
    # thresholds 0.999 .. 0.834 pass one detection, 0.833 .. 0.001 two, 0.0 all three
    assert (r.precision[0], r.recall[0]) == (1.0, 0.5)
    assert (r.precision[165], r.recall[165]) == (1.0, 0.5)  # threshold 0.834
    assert (r.precision[166], r.recall[166]) == (0.5, 0.5)  # threshold 0.833 < 5/6
    assert (r.precision[-1], r.recall[-1]) == pytest.approx((2 / 3, 1.0))
    assert r.ap == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3, abs=1e-12)
    assert r.num_faces == 2


def test_detection_on_an_ignored_face_is_neither_true_nor_false():
    gts = [[FACE_A, FACE_B]]
    # the best detection sits on face B, which this level does not list
    assert ap_of([[FACE_B, FACE_A]], [[0.9, 0.5]], gts, [[True, False]]) == pytest.approx(1.0, abs=1e-12)
    # listed, the same detection is a true positive that the level now also needs
    assert ap_of([[FACE_B, FACE_A]], [[0.9, 0.5]], gts, [[True, True]]) == pytest.approx(1.0, abs=1e-12)
    # a miss in its place is a false positive ahead of the true one: precision 1/2 at recall 1
    assert ap_of([[MISS, FACE_A]], [[0.9, 0.5]], gts, [[True, False]]) == pytest.approx(0.5, abs=1e-12)


def test_first_face_wins_overlap_ties_even_when_ignored():
    # two identical annotations, the first not listed: the detection matches the first and is ignored,
    # so the listed face is never recalled (the official behaviour)
    pred_recall, proposal = image_evaluation(np.array([FACE_A], float), np.array([FACE_A, FACE_A], float),
                                             np.array([False, True]))
    assert proposal.tolist() == [-1] and pred_recall.tolist() == [0]
    pred_recall, proposal = image_evaluation(np.array([FACE_A], float), np.array([FACE_A, FACE_A], float),
                                             np.array([True, False]))
    assert proposal.tolist() == [1] and pred_recall.tolist() == [1]


def test_tied_scores_enter_the_curve_together():
    # a false and a true positive with the same score: no threshold separates them
    r = evaluate([np.array([MISS, FACE_A, MISS], float)], [np.array([0.8, 0.8, 0.2])],
                 [np.array([FACE_A], float)], level([[True]]))["hard"]
    assert r.precision[0] == 0.5 and r.recall[0] == 1.0
    assert r.ap == pytest.approx(0.5, abs=1e-12)


def test_images_without_faces_add_no_false_positives_but_shape_the_normalisation():
    boxes = [np.array([FACE_A], float), np.array([MISS, MISS], float)]
    scores = [np.array([0.6]), np.array([0.9, 0.1])]
    r = evaluate(boxes, scores, [np.array([FACE_A], float), np.zeros((0, 4))],
                 level([[True], np.zeros(0, bool)]))["hard"]
    # image 1 is skipped; image 0's score normalises to 0.625: thresholds 0.999 .. 0.626 see nothing
    assert np.isnan(r.precision[0]) and r.recall[0] == 0.0
    assert r.precision[374] == 1.0 and r.recall[374] == 1.0  # threshold 0.625
    assert np.isnan(r.precision[373])  # threshold 0.626
    assert r.ap == pytest.approx(1.0, abs=1e-12)


def test_listed_faces_without_detections_count_in_the_denominator():
    boxes = [np.array([FACE_A], float), np.zeros((0, 4))]
    r = evaluate(boxes, [np.array([0.7]), np.zeros(0)], [np.array([FACE_A], float), np.array([FACE_B], float)],
                 level([[True], [True]]))["hard"]
    assert r.num_faces == 2 and r.recall[-1] == 0.5 and r.ap == pytest.approx(0.5, abs=1e-12)


def test_level_without_listed_faces_scores_zero_and_equal_scores_pass_every_threshold():
    r = evaluate([np.array([FACE_A], float)], [np.array([0.3])], [np.array([FACE_A], float)],
                 {"easy": [np.array([False])], "hard": [np.array([0])]})
    assert r["easy"].ap == 0.0 and r["easy"].num_faces == 0
    assert r["hard"].ap == pytest.approx(1.0, abs=1e-12)  # index form of keep; a lone score normalises to 1
    assert normalize_scores([np.array([0.4, 0.4])])[0].tolist() == [1.0, 1.0]


def test_voc_ap_envelope_skips_nan():
    assert voc_ap(np.array([0.0, 0.5, 0.5, 1.0]), np.array([np.nan, 0.5, 1.0, 0.25])) == pytest.approx(0.625)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="2 boxes but 1 scores"):
        evaluate([np.zeros((2, 4))], [np.zeros(1)], [np.zeros((0, 4))], level([np.zeros(0, bool)]))
    with pytest.raises(ValueError, match="outside 0..0"):
        evaluate([np.zeros((1, 4))], [np.zeros(1)], [np.zeros((1, 4))], {"easy": [np.array([3])]})


# ------------------------------------------------------------------ against the MATLAB transcription


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_official_loops_on_random_sets(seed):
    rng = np.random.default_rng(seed)
    boxes, scores, gts, masks = [], [], [], []
    for _ in range(int(rng.integers(2, 7))):
        g = int(rng.integers(0, 6))
        xy = rng.uniform(0, 200, (g, 2))
        gt = np.round(np.concatenate([xy, xy + rng.uniform(4, 40, (g, 2))], 1))
        p = int(rng.integers(0, 9))
        src = gt[rng.integers(0, g, p)] if g else rng.uniform(0, 200, (p, 4))
        rand_xy = rng.uniform(0, 200, (p, 2))
        rand = np.concatenate([rand_xy, rand_xy + rng.uniform(4, 40, (p, 2))], 1)
        b = np.where((rng.random(p) < 0.7)[:, None], src + rng.normal(0, 3, (p, 4)), rand)
        b[:, 2:] = np.maximum(b[:, 2:], b[:, :2])
        boxes.append(b)
        scores.append(np.round(rng.uniform(0, 1, p), 2))  # two decimals: ties happen
        gts.append(gt)
        masks.append(rng.random(g) < 0.7)
    if sum(len(s) for s in scores) < 2 or len({v for s in scores for v in s}) < 2:
        scores[0] = np.concatenate([scores[0], [0.0, 1.0]])
        boxes[0] = np.concatenate([boxes[0], np.array([MISS, FACE_B], float)])
    ap, precision, recall = matlab_reference(boxes, scores, gts, masks)
    r = evaluate(boxes, scores, gts, level(masks))["hard"]
    assert r.ap == pytest.approx(ap, abs=1e-6)
    np.testing.assert_allclose(r.precision, precision, atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(r.recall, recall, atol=1e-12)


def test_metric_collects_batches_in_any_order():
    rng = np.random.default_rng(3)
    gts = [np.array([FACE_A, FACE_B], float), np.array([FACE_B], float), np.zeros((0, 4)), np.array([FACE_A], float)]
    keep = {"easy": [np.array([True, False]), np.array([True]), np.zeros(0, bool), np.array([False])],
            "hard": [np.array([True, True]), np.array([True]), np.zeros(0, bool), np.array([True])]}
    boxes = [np.array([FACE_A, FACE_B, MISS], float), np.array([FACE_B], float), np.array([MISS], float),
             np.zeros((0, 4))]
    scores = [rng.uniform(0, 1, len(b)) for b in boxes]
    expected = {k: v.ap for k, v in evaluate(boxes, scores, gts, keep).items()}
    metric = WiderFaceAP(gts, keep)
    for ids in ([3, 1], [0, 2]):
        metric.update(ids, [torch.from_numpy(boxes[i]).float() for i in ids],
                      [torch.from_numpy(scores[i]) for i in ids])
    got = metric.compute()
    assert got == pytest.approx(expected, abs=1e-6)
    metric.reset()
    metric.update([1], [torch.tensor([FACE_B], dtype=torch.float32)], [torch.tensor([0.5])])
    assert metric.compute() == {"easy": pytest.approx(1.0), "hard": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="image id 7"):
        metric.update([7], [torch.zeros(0, 4)], [torch.zeros(0)])


def test_metric_counts_a_repeated_image_once():
    gts = [np.array([FACE_A], float), np.array([FACE_B], float)]
    keep = {"hard": [np.array([True]), np.array([True])]}
    boxes = [np.array([FACE_A, MISS], float), np.array([MISS, FACE_B], float)]
    scores = [np.array([0.9, 0.4]), np.array([0.8, 0.3])]
    expected = evaluate(boxes, scores, gts, keep)["hard"].ap
    metric = WiderFaceAP(gts, keep)
    for ids in ([0, 1], [1]):  # image 1 again, as a padded distributed sampler would repeat it
        metric.update(ids, [torch.from_numpy(boxes[i]) for i in ids], [torch.from_numpy(scores[i]) for i in ids])
    assert metric.compute()["hard"] == pytest.approx(expected, abs=1e-12)
