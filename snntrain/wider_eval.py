"""The official WIDER FACE evaluation (easy / medium / hard AP), reimplemented.

This is the protocol of ``eval_tools/wider_eval.m`` from the WIDER FACE site, the one behind the easy /
medium / hard numbers papers report (SCRFD, RetinaFace, ...). It differs from COCO-style AP@0.5 in
several ways, so both are computed and neither stands in for the other. Steps, for one level:

1. **Scores are normalised over the whole set.** All detection scores of all images are min-max
   normalised together: ``s' = (s - min) / (max - min)`` (``norm_score.m``). When every score is the
   same (``max == min``) the official code divides by zero and gets NaN, which no threshold passes;
   here every normalised score is 1 instead (documented deviation, the only one).
2. **Per image, detections are sorted by score, descending** (``read_pred.m``; MATLAB's sort is stable,
   so equal scores keep their given order).
3. **Images without any annotated face, or without any detection, are skipped**: they add no
   proposals, so false positives on an image with no annotated face cost nothing. Their listed faces
   still count in the denominator (``count_face`` is summed over every image).
4. **Matching** (``image_evaluation.m``), with the level's *keep* list (the ``gt_list`` of
   ``wider_<level>_val.mat``): every annotated face of the image takes part, listed or not. Detections
   are visited in order; each finds the annotated face of largest overlap (the first one on ties). When
   that overlap is at least 0.5:

   * the face is not in the keep list: the detection is *ignored* (``proposal_list = -1``);
   * the face is listed and not yet recalled: it is recalled now (the detection is a true positive);
   * the face is listed and already recalled: nothing changes (a duplicate is a false positive).

   Below 0.5 the detection is a false positive. ``pred_recall[h]`` is the number of listed faces
   recalled by detections ``0..h``.
   Overlap is ``boxoverlap.m``'s: inclusive pixel coordinates, so widths and heights are
   ``x2 - x1 + 1``; ``x2 = x + w`` as both the ground truth and the prediction files give ``x, y, w, h``.
5. **Per image, 1000 thresholds** (``image_pr_info.m``): for ``t = 1..1000``, ``thresh = 1 - t / 1000``
   (0.999 down to 0.0). With ``r`` the last detection whose normalised score is ``>= thresh``, the image
   contributes ``(number of non-ignored detections among 0..r, pred_recall[r])``, or ``(0, 0)`` when no
   detection passes.
6. **Accumulate** both columns over all images; then ``precision = recalled / proposals`` (0/0 is NaN)
   and ``recall = recalled / count_face`` (``dataset_pr_info.m``).
7. **AP** (``VOCap``): recall padded with 0 in front and 1 at the end, precision with 0 and 0; the
   precision made non-increasing from the right (``max``, which skips NaN in MATLAB as ``np.fmax``
   does here); AP is the sum of ``(r_i - r_{i-1}) * p_i`` over the points where recall changes.

A level with no listed face at all has no defined AP (the official code divides by zero); this module
returns 0 for it. Boxes are xyxy in the original image's pixels with ``x2 = x1 + w``, exactly the
numbers of the annotation and prediction files, so no coordinate conversion is lost on the way.

:func:`evaluate` does all of it for a set of images; :class:`WiderFaceAP` collects predictions batch by
batch (as a ``torchmetrics.Metric``, so distributed runs gather them) and calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchmetrics import Metric

#: Number of score thresholds of the precision-recall curve.
THRESH_NUM = 1000
#: Overlap at which a detection matches a face.
IOU_THRESH = 0.5


def box_overlap(gt: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Overlap of ``box`` (or boxes ``[P, 4]``) with each row of ``gt`` ``[G, 4]``, ``boxoverlap.m``-style.

    Coordinates are inclusive pixels (``+1`` on widths and heights); no intersection gives 0.
    Returns ``[G]`` for one box, ``[P, G]`` for several.
    """
    gt = np.asarray(gt, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(box, dtype=np.float64)
    single = b.ndim == 1
    b = b.reshape(-1, 4)
    x1 = np.maximum(gt[None, :, 0], b[:, None, 0])
    y1 = np.maximum(gt[None, :, 1], b[:, None, 1])
    x2 = np.minimum(gt[None, :, 2], b[:, None, 2])
    y2 = np.minimum(gt[None, :, 3], b[:, None, 3])
    w = x2 - x1 + 1
    h = y2 - y1 + 1
    inter = w * h
    area_gt = (gt[:, 2] - gt[:, 0] + 1) * (gt[:, 3] - gt[:, 1] + 1)
    area_b = (b[:, 2] - b[:, 0] + 1) * (b[:, 3] - b[:, 1] + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = inter / (area_gt[None, :] + area_b[:, None] - inter)
    out[(w <= 0) | (h <= 0)] = 0.0
    return out[0] if single else out


def normalize_scores(scores: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Min-max normalise the scores of all images together (step 1 of the module docstring)."""
    arrays = [np.asarray(s, dtype=np.float64).reshape(-1) for s in scores]
    present = [s for s in arrays if s.size]
    if not present:
        return arrays
    lo = min(float(s.min()) for s in present)
    hi = max(float(s.max()) for s in present)
    if hi == lo:
        return [np.ones_like(s) for s in arrays]
    return [(s - lo) / (hi - lo) for s in arrays]


def image_evaluation(
    boxes: np.ndarray, gt: np.ndarray, keep: np.ndarray, iou_thresh: float = IOU_THRESH
) -> tuple[np.ndarray, np.ndarray]:
    """Match one image's detections (already sorted by score) to its annotated faces (step 4).

    ``boxes`` ``[P, 4]``, ``gt`` ``[G, 4]`` (xyxy, ``x2 = x1 + w``), ``keep`` bool ``[G]`` (the level's
    listed faces). Returns ``pred_recall`` int64 ``[P]`` (listed faces recalled by detections ``0..h``)
    and ``proposal`` int64 ``[P]`` (1: counts as a proposal, -1: ignored).
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    gt = np.asarray(gt, dtype=np.float64).reshape(-1, 4)
    keep = np.asarray(keep, dtype=bool).reshape(-1)
    if keep.shape[0] != gt.shape[0]:
        raise ValueError(f"keep has {keep.shape[0]} entries for {gt.shape[0]} annotated faces")
    p = boxes.shape[0]
    proposal = np.ones(p, dtype=np.int64)
    if p == 0 or gt.shape[0] == 0:
        return np.zeros(p, dtype=np.int64), proposal
    overlap = box_overlap(gt, boxes)  # [P, G]
    best = overlap.argmax(1)  # the first face of largest overlap, like MATLAB's max
    matched = overlap[np.arange(p), best] >= iou_thresh
    ignored = matched & ~keep[best]
    proposal[ignored] = -1
    # a listed face is recalled by the first detection that matches it; later ones change nothing
    hits = np.flatnonzero(matched & keep[best])
    new = np.zeros(p, dtype=np.int64)
    if hits.size:
        _, first = np.unique(best[hits], return_index=True)
        new[hits[first]] = 1
    return np.cumsum(new), proposal


def thresholds(thresh_num: int = THRESH_NUM) -> np.ndarray:
    """``1 - t / thresh_num`` for ``t = 1..thresh_num``, float64, computed as the official code does."""
    return np.array([1 - (t + 1) / thresh_num for t in range(thresh_num)], dtype=np.float64)


def image_pr_info(
    scores: np.ndarray, proposal: np.ndarray, pred_recall: np.ndarray, thresh_num: int = THRESH_NUM
) -> np.ndarray:
    """Per threshold, ``(proposals, recalled)`` of one image (step 5): float64 ``[thresh_num, 2]``.

    ``scores`` are the image's normalised scores in the order of ``proposal``/``pred_recall``.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    out = np.zeros((thresh_num, 2), dtype=np.float64)
    if scores.size == 0:
        return out
    thresh = thresholds(thresh_num)
    if np.all(scores[1:] <= scores[:-1]):
        # sorted (as evaluate() gives them): the last passing detection is the count passing, minus one
        last = scores.size - np.searchsorted(scores[::-1], thresh, side="left") - 1
    else:
        last = np.array([_last_true(scores >= t) for t in thresh])
    valid = np.cumsum(proposal == 1)
    some = last >= 0
    out[some, 0] = valid[last[some]]
    out[some, 1] = pred_recall[last[some]]
    return out


def _last_true(mask: np.ndarray) -> int:
    idx = np.flatnonzero(mask)
    return int(idx[-1]) if idx.size else -1


def voc_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """AP from the interpolated (non-increasing) precision envelope over recall changes (step 7)."""
    mrec = np.concatenate([[0.0], np.asarray(recall, dtype=np.float64), [1.0]])
    mpre = np.concatenate([[0.0], np.asarray(precision, dtype=np.float64), [0.0]])
    for i in range(mpre.size - 2, -1, -1):
        mpre[i] = np.fmax(mpre[i], mpre[i + 1])
    idx = np.flatnonzero(mrec[1:] != mrec[:-1]) + 1
    return float(np.sum((mrec[idx] - mrec[idx - 1]) * mpre[idx]))


@dataclass(frozen=True)
class LevelResult:
    """One level's result: ``ap``; ``precision`` and ``recall`` ``[thresh_num]`` (threshold 0.999 first);
    ``num_faces``, the listed faces counted."""

    ap: float
    precision: np.ndarray
    recall: np.ndarray
    num_faces: int


def evaluate(
    pred_boxes: Sequence[np.ndarray],
    pred_scores: Sequence[np.ndarray],
    gt_boxes: Sequence[np.ndarray],
    keep: Mapping[str, Sequence[np.ndarray]],
    iou_thresh: float = IOU_THRESH,
    thresh_num: int = THRESH_NUM,
) -> dict[str, LevelResult]:
    """The official protocol (module docstring) over a set of images, for each level of ``keep``.

    ``pred_boxes[i]`` ``[P_i, 4]`` and ``pred_scores[i]`` ``[P_i]``: image i's detections (any order) in
    its original pixels, xyxy with ``x2 = x1 + w``. ``gt_boxes[i]`` ``[G_i, 4]``: *all* its annotated
    faces. ``keep[level][i]``: bool ``[G_i]``, the faces the level counts (or 0-based indices).
    """
    n = len(gt_boxes)
    if len(pred_boxes) != n or len(pred_scores) != n:
        raise ValueError(f"got {len(pred_boxes)} box and {len(pred_scores)} score lists for {n} images")
    boxes, scores = [], []
    for i, (b, s) in enumerate(zip(pred_boxes, pred_scores)):
        b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
        s = np.asarray(s, dtype=np.float64).reshape(-1)
        if b.shape[0] != s.shape[0]:
            raise ValueError(f"image {i}: {b.shape[0]} boxes but {s.shape[0]} scores")
        if not np.all(np.isfinite(s)):
            raise ValueError(f"image {i}: scores must be finite")
        order = np.argsort(-s, kind="stable")
        boxes.append(b[order])
        scores.append(s[order])
    normed = normalize_scores(scores)
    gts = [np.asarray(g, dtype=np.float64).reshape(-1, 4) for g in gt_boxes]
    results: dict[str, LevelResult] = {}
    for level, masks in keep.items():
        if len(masks) != n:
            raise ValueError(f"keep[{level!r}] has {len(masks)} entries for {n} images")
        curve = np.zeros((thresh_num, 2), dtype=np.float64)
        count_face = 0
        for i in range(n):
            listed = _as_mask(masks[i], gts[i].shape[0], level, i)
            count_face += int(listed.sum())
            if gts[i].shape[0] == 0 or boxes[i].shape[0] == 0:
                continue
            pred_recall, proposal = image_evaluation(boxes[i], gts[i], listed, iou_thresh)
            curve += image_pr_info(normed[i], proposal, pred_recall, thresh_num)
        with np.errstate(divide="ignore", invalid="ignore"):
            precision = curve[:, 1] / curve[:, 0]
            recall = curve[:, 1] / count_face if count_face else np.zeros(thresh_num)
        ap = voc_ap(recall, precision) if count_face else 0.0
        results[level] = LevelResult(ap, precision, recall, count_face)
    return results


def _as_mask(value: np.ndarray, n: int, level: str, image: int) -> np.ndarray:
    arr = np.asarray(value).reshape(-1)
    if arr.dtype == bool:
        if arr.shape[0] != n:
            raise ValueError(f"keep[{level!r}][{image}] has {arr.shape[0]} flags for {n} annotated faces")
        return arr
    idx = arr.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"keep[{level!r}][{image}] holds indices {idx.tolist()} outside 0..{n - 1}")
    mask = np.zeros(n, dtype=bool)
    mask[idx] = True
    return mask


class WiderFaceAP(Metric):
    """Collects detections per validation image and computes ``{level: AP}`` with :func:`evaluate`.

    ``gt_boxes[i]`` / ``keep[level][i]``: every annotated face of dataset image ``i`` and the level's
    listed ones (as :class:`~snntrain.data.widerface.WiderFaceRecord` holds them). :meth:`update` takes
    the image ids and their detections in original pixels. Only the images seen since the last reset
    take part (their listed faces form the denominator), so a partial validation pass scores the
    images it saw; a full pass is the official protocol. States are concatenated across processes; an
    image seen twice (a distributed sampler pads the set with repeats) counts once.
    """

    full_state_update = False

    def __init__(self, gt_boxes: Sequence[np.ndarray], keep: Mapping[str, Sequence[np.ndarray]], **kwargs) -> None:
        super().__init__(**kwargs)
        self.gt_boxes = [np.asarray(g, dtype=np.float64).reshape(-1, 4) for g in gt_boxes]
        self.keep = {level: list(masks) for level, masks in keep.items()}
        for level, masks in self.keep.items():
            if len(masks) != len(self.gt_boxes):
                raise ValueError(f"keep[{level!r}] has {len(masks)} entries for {len(self.gt_boxes)} images")
        self.add_state("boxes", default=[], dist_reduce_fx="cat")
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("owner", default=[], dist_reduce_fx="cat")
        self.add_state("seen", default=[], dist_reduce_fx="cat")

    def update(self, image_ids: Sequence[int] | torch.Tensor, boxes: Sequence[torch.Tensor],
               scores: Sequence[torch.Tensor]) -> None:
        """``image_ids[k]``: dataset index of the k-th image; ``boxes[k]`` ``[n, 4]`` xyxy in its original
        pixels, ``scores[k]`` ``[n]``."""
        ids = [int(i) for i in image_ids]
        if not len(ids) == len(boxes) == len(scores):
            raise ValueError(f"got {len(ids)} image ids, {len(boxes)} box and {len(scores)} score tensors")
        for i, b, s in zip(ids, boxes, scores):
            if not 0 <= i < len(self.gt_boxes):
                raise ValueError(f"image id {i} is outside the {len(self.gt_boxes)} images of the set")
            b = b.detach().reshape(-1, 4).to(self.device, torch.float64)
            self.boxes.append(b)
            self.scores.append(s.detach().reshape(-1).to(self.device, torch.float64))
            self.owner.append(torch.full((b.shape[0],), i, dtype=torch.int64, device=self.device))
        self.seen.append(torch.as_tensor(ids, dtype=torch.int64, device=self.device))

    def compute(self) -> dict[str, float]:
        def cat(state, shape) -> np.ndarray:
            if isinstance(state, torch.Tensor):
                return state.cpu().numpy().reshape(shape)
            if not state:
                return np.zeros((0,) if shape == (-1,) else (0, 4))
            return torch.cat([t.reshape(shape) for t in state]).cpu().numpy()

        boxes, scores = cat(self.boxes, (-1, 4)), cat(self.scores, (-1,))
        owner = cat(self.owner, (-1,)).astype(np.int64)
        seen, times = np.unique(cat(self.seen, (-1,)).astype(np.int64), return_counts=True)
        order = np.argsort(owner, kind="stable")
        boxes, scores, owner = boxes[order], scores[order], owner[order]
        starts = np.searchsorted(owner, seen, side="left")
        ends = np.searchsorted(owner, seen, side="right")
        per_image = []
        for a, b, n in zip(starts, ends, times):
            rows = np.concatenate([boxes[a:b], scores[a:b, None]], 1)
            if n > 1:  # an image evaluated twice (a distributed sampler pads the set): keep one copy of each row
                _, first = np.unique(rows, axis=0, return_index=True)
                rows = rows[np.sort(first)]
            per_image.append(rows)
        result = evaluate(
            [r[:, :4] for r in per_image],
            [r[:, 4] for r in per_image],
            [self.gt_boxes[i] for i in seen],
            {level: [masks[i] for i in seen] for level, masks in self.keep.items()},
        )
        return {level: r.ap for level, r in result.items()}


__all__ = [
    "IOU_THRESH",
    "THRESH_NUM",
    "LevelResult",
    "WiderFaceAP",
    "box_overlap",
    "evaluate",
    "image_evaluation",
    "image_pr_info",
    "normalize_scores",
    "thresholds",
    "voc_ap",
]
