"""The config groups: the tiny debug run over every task and dataset, the callbacks and trainer groups
(and the old keys that moved there), the detector's own model config, the event datasets' shared base."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from snntrain.cli import train
from snntrain.config_keys import MOVED, check_moved, upgrade_overrides
from snntrain.data import DATAMODULES, build_datamodule
from snntrain.models import SEWResNet, SpikingFCOS, build_model, is_detector
from snntrain.tasks import TASKS

DATASETS = sorted(DATAMODULES)
EVENTS = ["digits_dvs", "nmnist", "dvs_gesture", "cifar10_dvs", "ncaltech101"]


def resolved(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


# ------------------------------------------------------------------------------------------ debug=tiny


@pytest.mark.parametrize("task, data", [*(("classify", d) for d in DATASETS), ("detect", "faces"),
                                        ("detect", "widerface"), ("detect", "digits")])
def test_tiny_debug_run_applies_to_any_task_and_dataset(task, data, compose_run, tmp_path):
    for name in ("a", "b"):  # data=image_folder: two class folders (the one dataset without a default place)
        (tmp_path / name).mkdir()
    root = [f"data.root={tmp_path}"] if data == "image_folder" else []
    cfg = resolved(compose_run("out", "debug=tiny", f"task={task}", f"data={data}", *root))
    assert cfg["T"] == 2 and cfg["model"]["T"] == 2 and cfg["data"].get("T", 2) == 2
    assert cfg["backend"]["name"] == "torch" and cfg["logger"]["name"] == "none"
    trainer = cfg["trainer"]
    assert (trainer["accelerator"], trainer["max_epochs"], trainer["limit_train_batches"],
            trainer["limit_val_batches"], trainer["enable_progress_bar"]) == ("cpu", 1, 2, 1, False)
    assert cfg["data"]["num_workers"] == 0 and cfg["model"]["width"] == 4
    assert cfg["callbacks"]["precise_bn"]["num_batches"] == 2
    assert cfg["model"]["name"] == ("sew_fcos" if task == "detect" else "sew_resnet")
    if task == "detect":
        assert cfg["model"]["head"]["fpn_channels"] == 8 and cfg["model"]["head"]["num_convs"] == 1
    build_datamodule(cfg["data"])  # every key the tiny run sets is a setting of the dataset


def test_tiny_debug_run_shrinks_the_data_it_knows(compose_run):
    digits = resolved(compose_run("out", "debug=tiny"))["data"]
    assert (digits["image_size"], digits["batch_size"]) == (8, 32)
    faces = resolved(compose_run("out", "debug=tiny", "task=detect"))["data"]
    assert (faces["num_train"], faces["num_val"], faces["image_size"], faces["face_size"]) == (16, 8, 32, [8, 14])
    # the tiny run wins over an experiment, and a command-line override over the tiny run
    wider = resolved(compose_run("out", "debug=tiny", "experiment=widerface_sew", "trainer.max_epochs=3"))
    assert wider["data"]["image_size"] == 32 and wider["model"]["head"]["fpn_channels"] == 8
    assert wider["trainer"]["precision"] == "32-true" and wider["trainer"]["check_val_every_n_epoch"] == 1
    assert wider["trainer"]["max_epochs"] == 3 and wider["task"]["monitor"] == "val/map_50"


def test_runs_without_debug_are_untouched(compose_run):
    cfg = resolved(compose_run("out"))
    assert cfg["T"] == 4 and cfg["model"]["width"] == 64 and cfg["data"]["image_size"] == 16
    assert cfg["trainer"]["limit_train_batches"] is None and cfg["logger"]["name"] == "tensorboard"


# ------------------------------------------------------------------------- callbacks, trainer.ddp, moves


def test_callbacks_and_ddp_settings_live_in_their_groups(compose_run):
    cfg = resolved(compose_run("out"))
    assert cfg["callbacks"] == {"checkpoint": {"every_n_steps": None, "every_n_minutes": 15},
                                "precise_bn": {"enabled": True, "num_batches": 50},
                                "ema": {"enabled": False, "decay": 0.999}, "efficiency": True}
    assert cfg["trainer"]["ddp"] == {"reducer": "auto", "broadcast_buffers": True, "gradient_as_bucket_view": False,
                                     "static_graph": False}
    assert not set(MOVED) & set(cfg)
    detect = resolved(compose_run("out", "task=detect"))["callbacks"]
    assert detect["ema"] == {"enabled": True, "decay": 0.998} and detect["precise_bn"]["num_batches"] == 10


def test_moved_keys_are_rewritten_to_their_new_place():
    args = ["-m", "precise_bn.num_batches=4", "ema.enabled=true", "+checkpoint.every_n_steps=3", "~ddp.static_graph",
            "ddp={broadcast_buffers: false}", "model.width=4", "--cfg", "job", "emax=1", "ckpt_path=ema.ckpt"]
    new, notes = upgrade_overrides(args)
    assert new == ["-m", "callbacks.precise_bn.num_batches=4", "callbacks.ema.enabled=true",
                   "+callbacks.checkpoint.every_n_steps=3", "~trainer.ddp.static_graph",
                   "trainer.ddp={broadcast_buffers: false}", "model.width=4", "--cfg", "job", "emax=1",
                   "ckpt_path=ema.ckpt"]
    assert len(notes) == 5 and notes[0] == ("precise_bn.num_batches is now callbacks.precise_bn.num_batches: "
                                            "read precise_bn.num_batches=4 as callbacks.precise_bn.num_batches=4")


def test_old_keys_on_the_command_line_give_the_config_of_the_new_ones(compose_run):
    old = ["precise_bn.num_batches=4", "ema.enabled=true", "ema.decay=0.9", "checkpoint.every_n_steps=3",
           "ddp.static_graph=true", "task=detect"]
    new = ["callbacks.precise_bn.num_batches=4", "callbacks.ema.enabled=true", "callbacks.ema.decay=0.9",
           "callbacks.checkpoint.every_n_steps=3", "trainer.ddp.static_graph=true", "task=detect"]
    assert resolved(compose_run("out", *upgrade_overrides(old)[0])) == resolved(compose_run("out", *new))
    with pytest.raises(ConfigCompositionException, match="precise_bn.num_batches"):
        compose_run("out", *old)  # the compose API takes the config as it is: upgrade_overrides first


def test_a_config_that_still_sets_a_moved_section_is_refused_naming_the_new_key(compose_run, tmp_path):
    # what a config file of one's own written for the old layout gives (here through +key=value)
    cfg = compose_run(tmp_path, "debug=tiny", "+precise_bn.num_batches=4", "+ema.enabled=true")
    with pytest.raises(ValueError, match=r"precise_bn.num_batches -> callbacks.precise_bn.num_batches, "
                                         r"ema.enabled -> callbacks.ema.enabled"):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()
    check_moved(resolved(compose_run(tmp_path, "debug=tiny")))  # today's layout passes


# ------------------------------------------------------------------------------------- model=sew_fcos


def test_the_detector_has_its_own_model_config(compose_run):
    detect = resolved(compose_run("out", "task=detect"))["model"]
    classify = resolved(compose_run("out"))["model"]
    assert detect["name"] == "sew_fcos" and "head" in detect and "head" not in classify
    # the backbone is model=sew_resnet's, with the detector's changes
    assert {k for k in classify if k != "name"} <= set(detect) and detect["depth"] == classify["depth"]
    assert (detect["width"], detect["stem"], detect["neuron"]["decay_input"]) == (32, "imagenet", False)
    assert resolved(compose_run("out", "model=sew_fcos", "data=faces"))["model"] == detect


def test_old_detector_configs_named_sew_resnet_build_the_same_detector():
    cfg = {"name": "sew_fcos", "T": 2, "width": 4, "num_classes": 1, "in_channels": 3,
           "head": {"fpn_levels": [1, 2, 3], "fpn_channels": 8, "num_convs": 1}}
    old = {**cfg, "name": "sew_resnet"}  # checkpoints from before the detector had its own name
    assert is_detector(cfg) and is_detector(old) and not is_detector({**old, "head": None})
    torch.manual_seed(0)
    a = build_model(cfg, backend="torch")
    torch.manual_seed(0)
    b = build_model(old, backend="torch")
    assert type(a) is type(b) is SpikingFCOS
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert type(build_model({k: v for k, v in old.items() if k != "head"}, backend="torch")) is SEWResNet
    with pytest.raises(ValueError, match="model name='fcos' is not valid; choose one of sew_resnet, sew_fcos"):
        build_model({**cfg, "name": "fcos"})


def test_task_and_model_mismatch_is_named(compose_run):
    with pytest.raises(ValueError, match="task=detect trains a detector: model=sew_fcos .* not model=sew_resnet"):
        TASKS["detect"](resolved(compose_run("out", "debug=tiny", "task=detect", "model=sew_resnet")), backend="torch")
    with pytest.raises(ValueError, match="model=sew_fcos is a detector: train it with task=detect"):
        TASKS["classify"](resolved(compose_run("out", "debug=tiny", "model=sew_fcos")), backend="torch")


# ------------------------------------------------------------------------------ event datasets' base


@pytest.mark.parametrize("name", EVENTS)
def test_event_datasets_share_one_base(name, compose_run):
    cfg = resolved(compose_run("out", f"data={name}"))
    data = cfg["data"]
    base = compose_run("out", "data=base/events").data  # (names no dataset: see the next test)
    assert set(base) <= set(data) and data["name"] == name and data["T"] == 4 and data["in_channels"] == 2
    if name != "digits_dvs":
        assert data["download"] is True and data["root"] == cfg["paths"]["data_dir"] and data["num_workers"] == 4
    dm = build_datamodule({**data, "root": "unused", "download": False} if name != "digits_dvs" else data)
    assert dm.frame_shape[:2] == (4, 2)


def test_the_event_base_is_not_a_dataset(compose_run, tmp_path):
    with pytest.raises(MissingMandatoryValue, match="data.name"):
        train(compose_run(tmp_path, "debug=tiny", "data=base/events"))
