"""The detection task end to end: loss behaviour, a one-batch CLI run with TensorBoard images, and the
WIDER FACE easy/medium/hard evaluation on a fixture in the official format."""

from __future__ import annotations

import glob

import pytest
import torch

from snntrain.cli import run
from snntrain.losses import fcos_loss
from snntrain.models import SpikingFCOS
from snntrain.tasks.detection import draw_detections, padded_to_list
from test_detection_data import make_widerface  # noqa: E402  (tests folder on sys.path)

# debug=tiny detection, logged to TensorBoard
TINY = ["debug=tiny", "task=detect", "logger=tensorboard"]


@pytest.mark.slow  # a training loop of 25 steps
def test_loss_is_finite_and_decreases_on_a_batch():
    from snntrain.data import build_datamodule

    torch.manual_seed(0)
    dm = build_datamodule({"name": "faces", "num_train": 8, "num_val": 4, "num_test": 4, "image_size": 32,
                           "face_size": [8, 14], "batch_size": 8, "augment": False}, seed=0)
    dm.setup()
    images, targets = next(iter(dm.train_dataloader()))
    model = SpikingFCOS(T=2, width=8, head={"fpn_levels": [1, 2, 3], "fpn_channels": 16, "num_convs": 1},
                        backend="torch")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        out = model(images)
        assigned = model.targets(out, targets["boxes"], targets["labels"], targets["num_boxes"])
        parts = fcos_loss(out, assigned, backend="torch")
        assert all(torch.isfinite(v) for v in parts.values())
        opt.zero_grad()
        parts["loss"].backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(parts["loss"].item())
    assert parts["num_pos"] >= 1
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses


def test_loss_normalises_by_positives_and_ignores_background():
    out = {"cls_logits": torch.zeros(1, 4, 1), "centerness": torch.zeros(1, 4),
           "box_ltrb": torch.tensor([[[1.0, 1, 1, 1], [2.0, 2, 2, 2], [9.0, 9, 9, 9], [9.0, 9, 9, 9]]])}
    tgt = {"labels": torch.tensor([[0, 0, -1, -1]]), "positive": torch.tensor([[True, True, False, False]]),
           "ltrb": torch.tensor([[[1.0, 1, 1, 1], [1.0, 1, 1, 1], [0.0, 0, 0, 0], [0.0, 0, 0, 0]]]),
           "centerness": torch.tensor([[1.0, 1.0, 0.0, 0.0]])}
    parts = fcos_loss(out, tgt, backend="torch")
    assert parts["num_pos"] == 2
    # GIoU: identical box 0, box 2x as large (IoU 1/4, enclosing = union) 0.75 -> mean over 2 positives
    assert parts["loss_box"].item() == pytest.approx(0.375, abs=1e-5)
    # centerness BCE at logit 0 against target 1 on the 2 positives: log 2
    assert parts["loss_ctr"].item() == pytest.approx(torch.log(torch.tensor(2.0)).item(), rel=1e-5)


def test_iou_quality_learns_the_predicted_boxes_iou():
    """quality=iou: the quality branch's target is each positive's IoU with its box (identical: 1, twice the
    side: 1/4), without gradient into the box distances."""
    F = torch.nn.functional
    box = torch.tensor([[[1.0, 1, 1, 1], [2.0, 2, 2, 2], [9.0, 9, 9, 9]]], requires_grad=True)
    out = {"cls_logits": torch.zeros(1, 3, 1), "centerness": torch.tensor([[2.0, -1.0, 3.0]]), "box_ltrb": box}
    tgt = {"labels": torch.tensor([[0, 0, -1]]), "positive": torch.tensor([[True, True, False]]),
           "ltrb": torch.tensor([[[1.0, 1, 1, 1], [1.0, 1, 1, 1], [0.0, 0, 0, 0]]]),
           "centerness": torch.tensor([[0.5, 0.5, 0.0]])}
    parts = fcos_loss(out, tgt, quality="iou", backend="torch")
    logits, target = torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.25])
    expected = F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / 2
    assert parts["loss_ctr"].item() == pytest.approx(expected.item(), rel=1e-5)
    centerness = fcos_loss(out, tgt, backend="torch")["loss_ctr"]
    assert centerness.item() == pytest.approx((F.binary_cross_entropy_with_logits(
        logits, torch.tensor([0.5, 0.5]), reduction="sum") / 2).item(), rel=1e-5)
    out["centerness"] = out["centerness"].requires_grad_()
    (parts := fcos_loss(out, tgt, box_weight=0.0, quality="iou", backend="torch"))["loss"].backward()
    assert box.grad is None or not box.grad.any()
    with pytest.raises(ValueError, match="quality='giou'"):
        fcos_loss(out, tgt, quality="giou", backend="torch")


@pytest.mark.slow
@pytest.mark.parametrize("on_device", ["auto", "true"])  # auto: the CPU's loader; true: the set kept on the device
def test_detect_cli_one_batch_logs_map_and_images(tmp_path, compose_run, on_device):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics_value = run(compose_run(tmp_path, *TINY, f"data.on_device={on_device}"))
    assert metrics_value is not None and 0.0 <= metrics_value <= 1.0
    ea = EventAccumulator(glob.glob(str(tmp_path / "tensorboard" / "events.*"))[0],
                          size_guidance={"images": 0, "scalars": 0})
    ea.Reload()
    scalars = set(ea.Tags()["scalars"])
    for tag in ("train/loss_step", "train/loss_box_step", "train/loss_cls_step", "train/loss_ctr_step", "train/lr",
                "val/loss", "val/map", "val/map_50", "firing_rate/mean", "firing_rate/head.cls_tower.1"):
        assert tag in scalars, (tag, sorted(scalars))
    assert "val/detections" in ea.Tags()["images"]
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_draw_detections_enlarges_and_filters():
    img = torch.full((3, 32, 32), -1.0)  # normalised black
    pred = {"boxes": torch.tensor([[2.0, 2, 10, 10], [5.0, 5, 20, 20]]), "scores": torch.tensor([0.9, 0.1]),
            "labels": torch.tensor([0, 0])}
    gt = padded_to_list({"boxes": torch.tensor([[[4.0, 4, 12, 12]]]), "labels": torch.tensor([[0]]),
                         "num_boxes": torch.tensor([1])})[0]
    out = draw_detections(img, pred, gt, min_score=0.5, min_side=128)
    assert out.shape == (3, 128, 128) and out.max() <= 1.0
    assert out[0, 8, 8:40].max() > 0.9  # the kept prediction's top edge (x4) is red
    assert out[1, 16, 16:48].max() > 0.9  # the ground truth's top edge is green
    assert out[0, 20:80, 80].max() < 0.1  # the low-score box (x from 20 to 80 at scale 4) is not drawn


@pytest.mark.slow
def test_widerface_easy_medium_hard(tmp_path, compose_run):
    root = make_widerface(tmp_path / "wider", with_eval=True)
    out = tmp_path / "run"
    run(compose_run(out, *TINY, "data=widerface", f"data.root={root}", "trainer.limit_val_batches=null"))
    import csv  # noqa: F401  (the tensorboard logger holds the metrics)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(glob.glob(str(out / "tensorboard" / "events.*"))[0], size_guidance={"scalars": 0})
    ea.Reload()
    for level in ("easy", "medium", "hard"):
        values = ea.Scalars(f"val/wider_{level}")
        assert values and 0.0 <= values[-1].value <= 1.0
