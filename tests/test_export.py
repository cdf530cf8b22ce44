"""Export round trips (safetensors, ONNX, torch.export) and loaders, for a classifier and a detector."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from snntrain import export as ex
from snntrain import load_checkpoint, load_exported
from snntrain.checkpoint import CheckpointError
from snntrain.cli import run
from snntrain.models.detector import pyramid_scales

# ONNX runs the same float32 graph through other kernels: conv results differ in the last
# bits, so a membrane that lands within ~1e-6 of the threshold may fire in one and not the
# other. On the small inputs below that never happens; the tolerance covers the rounding.
ONNX_ATOL = 1e-4


@pytest.fixture(scope="module")
def detector_ckpt(tmp_path_factory, compose_run) -> Path:
    out = tmp_path_factory.mktemp("det")
    run(compose_run(out, "debug=tiny", "task=detect"))
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def classifier_export(classifier_ckpt, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("cls_export") / "export"
    card = ex.export_checkpoint(classifier_ckpt, out, backend="torch")
    return out, card


@pytest.fixture(scope="module")
def detector_export(detector_ckpt, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("det_export") / "export"
    card = ex.export_checkpoint(detector_ckpt, out, backend="torch")
    return out, card


def sample(card: dict, seed: int = 1) -> torch.Tensor:
    return torch.randn(card["input_shape"], generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow
def test_classifier_export_folder_and_card(classifier_export):
    out, card = classifier_export
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.yaml", "model.onnx", "model.pt2",
                                                    "model.safetensors", "model_card.json"]
    saved = json.loads((out / "model_card.json").read_text())
    assert saved["task"] == "classify" and saved["T"] == 2 and saved["input_shape"] == [1, 1, 8, 8]
    assert saved["classes"] == [str(i) for i in range(10)]
    assert saved["backend_in_training"] == "torch"
    assert "val/acc" in saved["metrics"] and saved["epoch"] == 0
    assert "onnx_max_abs_diff" in saved and saved["onnx_max_abs_diff"] <= ONNX_ATOL
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "temporary folder left behind"


@pytest.mark.slow
def test_classifier_safetensors_reload_is_identical(classifier_ckpt, classifier_export):
    out, card = classifier_export
    from_ckpt = load_checkpoint(classifier_ckpt, backend="torch")
    from_export = load_exported(out, backend="torch")
    x = sample(card).repeat(3, 1, 1, 1)
    with torch.no_grad():
        assert torch.equal(from_ckpt(x), from_export(x))
    assert not from_export.training and from_export.classes == from_ckpt.classes
    probs = from_export.predict(x)
    assert probs.shape == (3, 10) and torch.allclose(probs.sum(-1), torch.ones(3))


@pytest.mark.slow
def test_classifier_onnx_matches_pytorch_backend(classifier_export):
    import onnxruntime as ort

    out, card = classifier_export
    model = load_exported(out, backend="torch")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(4, *card["input_shape"][1:], generator=torch.Generator().manual_seed(3))  # dynamic batch
    (got,) = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        ref = model(x).numpy()
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=ONNX_ATOL, rtol=0)


@pytest.mark.slow
def test_classifier_program_loads_and_matches(classifier_export):
    out, card = classifier_export
    program = torch.export.load(str(out / "model.pt2"))
    model = load_exported(out, backend="torch")
    x = sample(card, 4).repeat(2, 1, 1, 1)
    with torch.no_grad():
        assert torch.allclose(program.module()(x), model(x), atol=1e-6)
    assert card["torch_export_backend"] == "torch"


@pytest.mark.slow
def test_detector_round_trips(detector_ckpt, detector_export):
    import onnxruntime as ort

    out, card = detector_export
    assert card["task"] == "detect" and card["classes"] == ["face"] and card["input_shape"] == [1, 3, 32, 32]
    model = load_exported(out, backend="torch")
    assert isinstance(model, ex.SpikingDetector)
    x = sample(card, 5).repeat(2, 1, 1, 1)
    with torch.no_grad():
        dets = model(x)
        ref_boxes, ref_scores = ex.ExportGraph(model.model)(x)
        ckpt_dets = load_checkpoint(detector_ckpt, backend="torch")(x)
    assert len(dets) == 2 and set(dets[0]) == {"boxes", "scores", "labels"}
    for a, b in zip(dets, ckpt_dets):
        assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["scores"], b["scores"])
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    boxes, scores = session.run(None, {"images": x.numpy()})
    np.testing.assert_allclose(boxes, ref_boxes.numpy(), atol=ONNX_ATOL * 32, rtol=1e-5)
    np.testing.assert_allclose(scores, ref_scores.numpy(), atol=ONNX_ATOL, rtol=0)
    program = torch.export.load(str(out / "model.pt2"))
    with torch.no_grad():
        p_boxes, p_scores = program.module()(x)
    assert torch.allclose(p_boxes, ref_boxes, atol=1e-4) and torch.allclose(p_scores, ref_scores, atol=1e-6)
    # one pass at any scale: both graphs take other heights and widths (multiples of the coarsest stride)
    other = torch.randn(1, 3, 48, 80, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref_boxes, ref_scores = ex.ExportGraph(model.model)(other)
        p_boxes, p_scores = program.module()(other)
    boxes, scores = session.run(None, {"images": other.numpy()})
    assert scores.shape == (1, 12 * 20 + 6 * 10 + 3 * 5, 1)
    np.testing.assert_allclose(scores, ref_scores.numpy(), atol=ONNX_ATOL, rtol=0)
    assert torch.allclose(p_boxes, ref_boxes, atol=1e-4) and torch.allclose(p_scores, ref_scores, atol=1e-6)


@pytest.mark.slow
def test_interrupted_export_leaves_nothing(classifier_ckpt, tmp_path, monkeypatch):
    out = tmp_path / "export"

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash while writing model.onnx")

    monkeypatch.setattr(ex, "_export_onnx", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        ex.export_checkpoint(classifier_ckpt, out, backend="torch")
    assert list(tmp_path.iterdir()) == []
    # an existing export is left untouched by a failed one
    ex.export_checkpoint(classifier_ckpt, out, formats=["safetensors"], backend="torch")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(RuntimeError, match="simulated crash"):
        ex.export_checkpoint(classifier_ckpt, out, backend="torch", overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


@pytest.mark.slow
def test_formats_exported_one_by_one_share_the_folder(classifier_ckpt, tmp_path):
    """README's exports into one folder, format by format: each writes its own file and the others stay (the
    model card lists them all); a file already there, or another checkpoint's export, is replaced only with
    overwrite; a folder of other files is refused; nothing is lost by a refusal."""
    out = tmp_path / "exported"
    ex.export_checkpoint(classifier_ckpt, out, formats=["safetensors"], backend="torch")
    weights = (out / "model.safetensors").read_bytes()
    card = ex.export_checkpoint(classifier_ckpt, out, formats=["nir"], backend="torch")
    assert card["formats"] == ["safetensors", "nir"] and list(card["files"]) == ["config.yaml", "model.safetensors",
                                                                                   "model.nir"]
    assert (out / "model.safetensors").read_bytes() == weights and "nir_max_abs_diff" in card
    saved = json.loads((out / "model_card.json").read_text())
    assert saved["formats"] == card["formats"] and "model.safetensors" in (out / "README.md").read_text()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match="already holds model.safetensors.*export.overwrite=true"):
        ex.export_checkpoint(classifier_ckpt, out, formats=["safetensors"], backend="torch")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    card = ex.export_checkpoint(classifier_ckpt, out, formats=["safetensors"], backend="torch", overwrite=True)
    assert card["formats"] == ["safetensors", "nir"] and card["nir_target"] == "spec"
    assert load_exported(out, backend="torch").config["model"]["width"] == 4

    # another checkpoint's weights: refused, then with overwrite its export replaces the folder's
    other = tmp_path / "other.ckpt"
    ckpt = torch.load(classifier_ckpt, map_location="cpu", weights_only=True)
    key = next(k for k in ckpt["state_dict"] if k.startswith("model.") and k.endswith(".weight"))
    ckpt["state_dict"][key] = ckpt["state_dict"][key] + 1
    torch.save(ckpt, other)
    with pytest.raises(ValueError, match="holds an export of other weights.*export.overwrite=true"):
        ex.export_checkpoint(other, out, formats=["safetensors"], backend="torch")
    assert {p.name: p.read_bytes() for p in out.iterdir()}.keys() == before.keys()
    card = ex.export_checkpoint(other, out, formats=["safetensors"], backend="torch", overwrite=True)
    assert card["formats"] == ["safetensors"] and not (out / "model.nir").exists()
    assert "nir_target" not in card and card["checkpoint"] == str(other)

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    with pytest.raises(ValueError, match="holds files that are not an snntrain export \\(README.md; no model_card.json\\)"):
        ex.export_checkpoint(classifier_ckpt, mine, formats=["safetensors"], backend="torch")
    assert [p.name for p in mine.iterdir()] == ["README.md"] and (mine / "README.md").read_text() == "my notes"


@pytest.mark.slow
def test_checkpoint_of_the_old_layout_with_the_backend_stored_twice_loads_and_exports(classifier_ckpt, tmp_path):
    """The training backend is stored once, in the config (backend.resolved); checkpoints that also kept it under
    snntrain.backend, or only there, still load and export, the card naming the backend they trained with."""
    from snntrain.backend import trained_backend

    ckpt = torch.load(classifier_ckpt, map_location="cpu", weights_only=True)
    assert "backend" not in ckpt["snntrain"] and trained_backend(ckpt) == "torch"
    twice = {**ckpt, "snntrain": {**ckpt["snntrain"], "backend": "torch"}}
    config = ckpt["hyper_parameters"]["config"]
    only_meta = {**twice, "hyper_parameters": {"config": {**config, "backend": {"name": "auto"}}}}
    for name, old in (("twice", twice), ("only_meta", only_meta)):
        path = tmp_path / f"{name}.ckpt"
        torch.save(old, path)
        assert trained_backend(torch.load(path, weights_only=True)) == "torch"
        card = ex.export_checkpoint(path, tmp_path / name, formats=["safetensors"], backend="auto")
        assert card["backend_in_training"] == "torch", name
        assert ex.load_checkpoint(path, backend="torch").config["model"] == config["model"]



def test_export_and_predict_resolve_the_backend_as_training_does(classifier_ckpt, tmp_path, monkeypatch):
    """One rule for every task: triton asked for without a CUDA device (and without Triton's interpreter) is
    refused with the way out, by export and predict as by training; auto picks the PyTorch backend there."""
    from snntrain.errors import UnavailableError
    from snntrain.predict import predict

    images = tmp_path / "in"
    images.mkdir()
    Image.new("L", (28, 28)).save(images / "a.png")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for call in (lambda: ex.load_checkpoint(classifier_ckpt, backend="triton"),
                 lambda: ex.export_checkpoint(classifier_ckpt, tmp_path / "e", formats=["torch_export"],
                                              backend="triton"),
                 lambda: predict(classifier_ckpt, images, tmp_path / "p", backend="triton")):
        with pytest.raises(UnavailableError, match="backend=triton needs a CUDA GPU.*use backend=torch"):
            call()
    assert not (tmp_path / "e").exists() and not (tmp_path / "p").exists()
    model = ex.load_checkpoint(classifier_ckpt, backend="auto")
    assert {m.backend for m in model.modules() if isinstance(getattr(m, "backend", None), str)} == {"torch"}


def test_bad_checkpoints_and_formats(tmp_path, classifier_ckpt):
    with pytest.raises(CheckpointError, match="nope.ckpt does not exist"):
        ex.export_checkpoint(tmp_path / "nope.ckpt", tmp_path / "out")
    data = classifier_ckpt.read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match="cut.ckpt cannot be read.*truncated"):
        ex.export_checkpoint(cut, tmp_path / "out")
    with pytest.raises(CheckpointError, match="cut.ckpt cannot be read"):
        load_checkpoint(cut)
    with pytest.raises(ValueError, match="export.formats=\\['tflite'\\] is not valid"):
        ex.export_checkpoint(classifier_ckpt, tmp_path / "out", formats=["tflite"])
    assert not (tmp_path / "out").exists()
    with pytest.raises(CheckpointError, match="is not an snntrain export folder: config.yaml is missing"):
        load_exported(tmp_path)


@pytest.mark.slow
def test_mismatched_weights_are_named(classifier_export, tmp_path):
    import shutil

    import yaml

    out, _ = classifier_export
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    cfg = yaml.safe_load((bad / "config.yaml").read_text())
    cfg["model"]["width"] = 8
    (bad / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises((CheckpointError, RuntimeError), match="size mismatch|does not match"):
        load_exported(bad)


@pytest.mark.slow
def test_cli_export_and_predict(classifier_ckpt, detector_export, tmp_path, compose_run):
    out = tmp_path / "exported"
    card = run(compose_run(tmp_path / "run", "task=export", f"ckpt_path={classifier_ckpt}", f"export.dir={out}",
                           "export.formats=[safetensors]", "backend=torch"))
    assert (out / "model.safetensors").exists() and not (out / "model.onnx").exists()
    assert list(card["files"]) == ["config.yaml", "model.safetensors"]

    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(images / f"img{i}.png")
    (images / "notes.txt").write_text("not an image")

    records = run(compose_run(tmp_path / "run2", "task=predict", f"ckpt_path={out}", f"input={images}",
                              "backend=torch"))
    saved = json.loads((tmp_path / "run2" / "predictions" / "predictions.json").read_text())
    assert saved == records and len(saved) == 3
    assert all(0 <= r["label"] < 10 and abs(sum(r["probabilities"]) - 1) < 1e-4 for r in saved)

    det_dir, _ = detector_export
    pred_out = tmp_path / "det_pred"
    records = run(compose_run(tmp_path / "run3", "task=predict", f"ckpt_path={det_dir}", f"input={images / 'img0.png'}",
                              f"predict.output_dir={pred_out}", "predict.score_thresh=0.0", "backend=torch"))
    saved = json.loads((pred_out / "predictions.json").read_text())
    assert saved == records and saved[0]["width"] == 50 and saved[0]["height"] == 40
    for det in saved[0]["detections"]:
        x1, y1, x2, y2 = det["box"]
        assert 0 <= x1 <= x2 <= 50 and 0 <= y1 <= y2 <= 40 and det["label"] == "face"
    assert (pred_out / "images" / "img0.png").exists()


@pytest.mark.slow
def test_predict_runs_the_pyramid_in_tiles_or_one_pass(detector_export, tmp_path, compose_run):
    """task=predict reads a photo at its own resolution and runs the model's image pyramid (here in tiles of
    64 px), or with predict.scales=null the single pass of evaluation; boxes are in the photo's pixels."""
    det_dir, card = detector_export
    assert card["multi_scale"]["object_sizes"] == [8, 14] and card["multi_scale"]["train_size"] == 32
    assert "one pass at one scale" in card["outputs"] and "object_sizes" in (det_dir / "README.md").read_text()
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (150, 230, 3), dtype=np.uint8)).save(photo)
    model = load_exported(det_dir, backend="torch")
    assert model.model.scale_plan(150, 230) == pyramid_scales(150, 230, 32, 1.41)  # faces of 3 %: from scale 1
    for overrides in (["predict.tile_size=64"], ["predict.scales=null"], ["predict.scales=[1.0,0.5]"]):
        out = tmp_path / overrides[0].split("=")[0]
        records = run(compose_run(tmp_path / "run", *["task=predict", f"ckpt_path={det_dir}", f"input={photo}",
                                                     f"predict.output_dir={out}", "predict.score_thresh=0.0",
                                                     "backend=torch", *overrides]))
        assert records[0]["width"] == 230 and records[0]["height"] == 150 and records[0]["detections"]
        for det in records[0]["detections"]:
            x1, y1, x2, y2 = det["box"]
            assert 0 <= x1 <= x2 <= 230 and 0 <= y1 <= y2 <= 150
    with pytest.raises(ValueError, match="predict.scales='big' is not valid"):
        run(compose_run(tmp_path / "run", *["task=predict", f"ckpt_path={det_dir}", f"input={photo}",
                                           "predict.scales=big", "backend=torch"]))
    with pytest.raises(ValueError, match="predict.tile_size=16 must be at least 64"):
        run(compose_run(tmp_path / "run", *["task=predict", f"ckpt_path={det_dir}", f"input={photo}",
                                           "predict.tile_size=16", "backend=torch"]))


def test_old_face_detector_checkpoints_take_their_sizes_from_the_data_section():
    config = {"data": {"name": "faces", "face_size": [10, 48], "image_size": 64},
              "model": {"name": "sew_resnet", "head": {"fpn_levels": [1, 2, 3]}}}
    assert ex.model_config(config)["head"]["object_sizes"] == [10, 48]
    assert ex.model_config(config)["head"]["train_size"] == 64
    config["data"] = {"name": "widerface", "image_size": 640}
    assert "object_sizes" not in ex.model_config(config)["head"]


def digit_files(folder: Path) -> dict[str, tuple[int, str]]:
    """Three of scikit-learn's digits as 40 x 40 PNGs (light on dark as in training, dark on light as ink on paper,
    light on dark) and a truncated JPEG; file -> (label, polarity)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    folder.mkdir()
    files = {}
    for i, polarity in enumerate(("light_on_dark", "dark_on_light", "light_on_dark")):
        image = np.asarray(Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8)).resize((40, 40)))
        Image.fromarray(255 - image if polarity == "dark_on_light" else image).save(folder / f"d{i}.png")
        files[f"d{i}.png"] = (int(digits.target[i]), polarity)
    buf = __import__("io").BytesIO()
    Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(buf, "JPEG")
    (folder / "cut.jpg").write_bytes(buf.getvalue()[:100])
    return files


def test_digits_are_read_with_their_polarity(tmp_path):
    """A digits classifier was trained on light strokes on a dark ground: an image of dark ink on light paper is
    found as such and inverted into the input the light-on-dark image gives; predict.polarity forces either."""
    from snntrain.predict import classification_input, digit_polarity

    files = digit_files(tmp_path / "digits")
    data = {"name": "digits", "image_size": 8}
    light, dark = tmp_path / "digits" / "d0.png", tmp_path / "digits" / "d1.png"
    x_light = classification_input(light, data, 1)
    for path, (_, polarity) in files.items():
        x = classification_input(tmp_path / "digits" / path, data, 1, polarity="light_on_dark")
        assert digit_polarity(x * 0.5 + 0.5) == polarity, path
    # d1 is d1's digit inverted: auto reads it as d1 itself would be read light on dark
    inverted = tmp_path / "d1_light.png"
    Image.fromarray(255 - np.asarray(Image.open(dark))).save(inverted)
    assert torch.allclose(classification_input(dark, data, 1), classification_input(inverted, data, 1), atol=0.02)
    assert torch.allclose(classification_input(light, data, 1, polarity="light_on_dark"), x_light)
    assert not torch.allclose(classification_input(light, data, 1, polarity="dark_on_light"), x_light, atol=0.5)


@pytest.mark.slow
def test_predict_skips_unreadable_images_when_told(classifier_ckpt, detector_export, tmp_path, caplog):
    """An unreadable image stops task=predict by default, naming it and predict.bad_files=skip; with skip every
    readable image is predicted, and the skipped ones are counted and named in the log."""
    import logging

    from snntrain.data.common import BadDataError
    from snntrain.predict import predict

    files = digit_files(tmp_path / "digits")
    cut = tmp_path / "digits" / "cut.jpg"
    with pytest.raises(BadDataError, match=f"image {cut} cannot be read.*predict.bad_files=skip"):
        predict(classifier_ckpt, tmp_path / "digits", tmp_path / "p0", backend="torch")
    assert not (tmp_path / "p0" / "predictions.json").exists()
    with caplog.at_level(logging.INFO, logger="snntrain.predict"):
        records = predict(classifier_ckpt, tmp_path / "digits", tmp_path / "p1", backend="torch", bad_files="skip")
    assert [Path(r["file"]).name for r in records] == list(files)
    assert [r["polarity"] for r in records] == [p for _, p in files.values()]
    assert f"skipped 1 of 4 image(s) that cannot be read (predict.bad_files=skip): {cut}" in caplog.text
    assert "digits read as 2 light on dark (as trained) and 1 dark on light (inverted)" in caplog.text
    records = predict(classifier_ckpt, tmp_path / "digits", tmp_path / "p2", backend="torch", bad_files="skip",
                      polarity="light_on_dark")
    assert {r["polarity"] for r in records} == {"light_on_dark"}
    det_dir, _ = detector_export  # the detector's path reads its images by itself
    records = predict(det_dir, tmp_path / "digits", tmp_path / "p3", backend="torch", bad_files="skip",
                      scales=None, draw=False)
    assert [Path(r["file"]).name for r in records] == list(files)
    with pytest.raises(ValueError, match="predict.bad_files='ignore' is not valid; choose one of error, skip"):
        predict(det_dir, tmp_path / "digits", tmp_path / "p4", bad_files="ignore")


def test_predict_input_errors(tmp_path, compose_run):
    from snntrain.predict import list_images

    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_images(tmp_path / "missing")
    with pytest.raises(ValueError, match="holds no images"):
        list_images(tmp_path)
    with pytest.raises(ValueError, match="task=predict needs ckpt_path"):
        run(compose_run(tmp_path / "r", "task=predict", f"input={tmp_path}"))


@pytest.mark.slow
def test_nir_export_of_detector_backbone(detector_ckpt, tmp_path):
    """A detector exports its backbone to NIR: one spike-map output per built stage (the default
    pyramid reads stages 1-3, so stage 4 is not built), matching the model's stages."""
    import nir

    card = ex.export_checkpoint(detector_ckpt, tmp_path / "e", formats=["nir"], backend="torch", nir_dt=1e-3)
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["README.md", "config.yaml", "model.nir",
                                                                 "model_card.json"]
    assert card["nir_dt"] == 1e-3 and card["nir_max_abs_diff"] < 1e-4 and "backbone" in card["files"]["model.nir"]
    graph = nir.read(str(tmp_path / "e" / "model.nir"))
    outputs = sorted(n for n, node in graph.nodes.items() if isinstance(node, nir.Output))
    assert outputs == ["stage1", "stage2", "stage3"] and graph.metadata["dt"] == 1e-3


@pytest.mark.slow
def test_detector_checkpoint_of_the_old_layout_loads_validates_and_exports(detector_ckpt, tmp_path, compose_run):
    """Checkpoints written before the detector had a model name of its own describe it as ``sew_resnet``
    with a ``head`` section, with the callbacks' and DDP settings at the top of the config: they load,
    validate and export as the same checkpoint in today's layout."""
    ckpt = torch.load(detector_ckpt, map_location="cpu", weights_only=True)
    config = ckpt["hyper_parameters"]["config"]
    assert config["model"]["name"] == "sew_fcos"
    config["model"]["name"] = "sew_resnet"
    config.update(config.pop("callbacks"))
    config["ddp"] = config["trainer"].pop("ddp")
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)

    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, ref = load_checkpoint(old, backend="torch")(x), load_checkpoint(detector_ckpt, backend="torch")(x)
    assert isinstance(load_checkpoint(old, backend="torch"), ex.SpikingDetector)
    for a, b in zip(got, ref):
        assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["scores"], b["scores"])
    metrics = [run(compose_run(tmp_path / name, "debug=tiny", "task=detect", "train=false", f"ckpt_path={path}"))
               for name, path in (("old", old), ("new", detector_ckpt))]
    assert metrics[0] == metrics[1]
    card = ex.export_checkpoint(old, tmp_path / "export", formats=["safetensors"], backend="torch")
    assert card["task"] == "detect" and isinstance(load_exported(tmp_path / "export"), ex.SpikingDetector)
