"""Your own network through ``model._target_``: the arguments a run passes, the errors, the efficiency report's
refusal of networks without spiking layers, and docs/custom_models.md's network trained, validated, resumed,
exported and reported through the command line."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from snntrain.cli import run, target_overrides
from snntrain.efficiency import NotSpiking, check_spiking
from snntrain.models import build_model
from snntrain.nn import NormNeuron

DOC = Path(__file__).resolve().parents[1] / "docs" / "custom_models.md"
MODULE = "tutorial_net_" + str(os.getpid())  # the tutorial's file under a name no other test process imports


def tutorial_code() -> str:
    """The tutorial's network: the python block of docs/custom_models.md that starts with ``# tiny_snn.py``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    return next(b for b in blocks if b.startswith("# tiny_snn.py"))


def tutorial_command() -> list[str]:
    """The tutorial's training command, without ``python -m snntrain``."""
    line = next(ln for ln in DOC.read_text().splitlines()
                if ln.startswith("python -m snntrain model._target_=tiny_snn.") and "ckpt_path" not in ln)
    return shlex.split(line)[3:]


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory) -> str:
    """The tutorial's module, importable (as :data:`MODULE`) for the rest of the module."""
    folder = tmp_path_factory.mktemp("tutorial")
    (folder / f"{MODULE}.py").write_text(tutorial_code())
    sys.path.insert(0, str(folder))
    yield MODULE
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


class Plain(nn.Module):
    """A network without snntrain's neurons; takes only ``num_classes`` of the run settings."""

    def __init__(self, num_classes: int, hidden: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, hidden, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def takes_anything(**kwargs) -> nn.Module:
    takes_anything.got = kwargs
    return nn.Identity()


def needs_width(width: int, T: int) -> nn.Module:
    return nn.Identity()


def not_a_module(num_classes: int) -> int:
    return num_classes


def raises(num_classes: int) -> nn.Module:
    raise ValueError(f"no network for {num_classes} classes")


RUN = {"T": 3, "num_classes": 5, "in_channels": 1, "neuron": {"type": "LIF"}}


def test_the_run_settings_go_where_the_signature_takes_them(tutorial):
    plain = build_model({"_target_": f"{__name__}.Plain", **RUN, "hidden": 6}, backend="torch")
    assert isinstance(plain, Plain) and plain.net[0].out_channels == 6 and plain.net[-1].out_features == 5
    build_model({"_target_": f"{__name__}.takes_anything", **RUN, "extra": [1, 2]}, backend="torch")
    assert takes_anything.got == {**RUN, "extra": [1, 2], "backend": "torch"}
    net = build_model({"_target_": f"{tutorial}.TinySNN", **RUN, "channels": 4}, backend="torch")
    assert net.T == 3 and net.sn1.backend == net.sn1.neuron.backend == "torch"
    assert net(torch.randn(2, 1, 8, 8)).shape == (2, 5) and net(torch.randn(4, 2, 1, 8, 8)).shape == (2, 5)


@pytest.mark.parametrize("cfg, error", [
    ({"_target_": "no_such_package_xyz.Net"}, "no module 'no_such_package_xyz' can be imported"),
    ({"_target_": f"{__name__}.Missing"}, f"{__name__} has no attribute 'Missing'"),
    ({"_target_": "Net"}, "must be a dotted import path such as my_package.MyNet"),
    ({"_target_": f"{__name__}.RUN"}, "names a dict, not an nn.Module class or a function that returns one"),
    ({"_target_": f"{__name__}.Plain", "depth": 3}, "model.depth: Plain takes no argument 'depth'; its arguments: "
                                                     "num_classes, hidden"),
    ({"_target_": f"{__name__}.needs_width"}, "needs_width needs argument 'width'.*set it with \\+model.width="),
    ({"_target_": f"{__name__}.raises"}, r"raises\(num_classes=5\) failed: ValueError: no network for 5 classes"),
    ({"_target_": f"{__name__}.takes_anything", "_partial_": True}, "model._partial_ is not supported"),
    ({"_target_": f"{__name__}.not_a_module"}, "not_a_module returned a int, not a torch.nn.Module"),
])
def test_targets_that_cannot_be_built_name_the_class_and_argument(cfg, error):
    with pytest.raises((ValueError, ImportError), match=error):
        build_model({**RUN, **cfg}, backend="torch")


def test_a_module_that_fails_to_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "broken_net_pkg.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="importing broken_net_pkg failed: No module named 'no_such_dependency_xyz'"):
        build_model({"_target_": "broken_net_pkg.Net", **RUN})


def test_target_on_the_command_line_picks_the_custom_model_config():
    assert target_overrides(["model._target_=a.B", "T=2"]) == ["model=custom", "model._target_=a.B", "T=2"]
    assert target_overrides(["+model._target_=a.B"]) == ["model=custom", "model._target_=a.B"]
    assert target_overrides(["model=custom", "model._target_=a.B"]) == ["model=custom", "model._target_=a.B"]
    assert target_overrides(["model=ms_resnet", "T=2"]) == ["model=ms_resnet", "T=2"]


def test_the_efficiency_report_refuses_a_network_without_spiking_layers(caplog):
    from snntrain.callbacks import FiringRateMonitor

    with pytest.raises(NotSpiking, match="covers networks with snntrain spiking layers .* and Plain has none"):
        check_spiking(Plain(3))
    monitor = FiringRateMonitor()
    module = SimpleNamespace(model=Plain(3), backend="torch")
    trainer = SimpleNamespace(sanity_checking=False)
    with caplog.at_level(logging.WARNING, logger="snntrain"):
        for _ in range(2):  # every validation skips the report; the reason is logged once
            monitor.on_validation_epoch_start(trainer, module)
    assert monitor._counter is None and monitor.report is None
    assert sum("no firing rates or efficiency report" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.slow
def test_a_target_network_trains_validates_resumes_exports_and_reports(tutorial, tmp_path, compose_run):
    """The tutorial's network through the command line's tasks, each rebuilding it from the checkpoint's config."""
    from snntrain.export import load_checkpoint, load_exported

    target = [f"model._target_={tutorial}.TinySNN", "+model.channels=4"]
    out = tmp_path / "train"
    metrics = run(compose_run(out, "debug=tiny", "model=custom", *target))
    assert 0.0 <= metrics <= 1.0
    last = out / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["hyper_parameters"]["config"]["model"]["_target_"] == f"{tutorial}.TinySNN"
    neurons = {n for n, m in load_checkpoint(last, backend="torch").model.named_modules() if isinstance(m, NormNeuron)}
    spiking = {lay["name"] for lay in ckpt["efficiency"]["layers"] if lay["kind"] == "spiking"}
    assert spiking == neurons and len(neurons) >= 2  # the validation's report, from the network's NormNeurons

    # validate the checkpoint alone (train=false), then resume it for a second epoch
    assert run(compose_run(tmp_path / "val", "debug=tiny", "model=custom", *target, "train=false",
                           f"ckpt_path={last}")) == pytest.approx(metrics)
    run(compose_run(tmp_path / "resume", "debug=tiny", "model=custom", *target, f"ckpt_path={last}",
                    "trainer.max_epochs=2"))
    resumed = torch.load(tmp_path / "resume" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert resumed["epoch"] == 1 and resumed["global_step"] == 2 * ckpt["global_step"]

    # export (safetensors, ONNX, torch.export), reload, and report
    export = tmp_path / "export"
    card = run(compose_run(tmp_path / "exp", "task=export", f"ckpt_path={last}", f"export.dir={export}",
                           "backend=torch"))
    assert {"model.safetensors", "model.onnx", "model.pt2"} <= set(card["files"])
    assert card["onnx_max_abs_diff"] < 1e-4 and card["torch_export_max_abs_diff"] < 1e-4
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(load_exported(export, backend="torch")(x), load_checkpoint(last, backend="torch")(x))
    report = run(compose_run(tmp_path / "rep", "debug=tiny", "task=report", f"ckpt_path={last}"))
    assert report["model"]["_target_"] == f"{tutorial}.TinySNN"
    assert {lay["name"] for lay in report["layers"] if lay["kind"] == "spiking"} == neurons
    assert report["workload"]["SynapticOperations"]["Effective_ACs"] > 0


@pytest.mark.slow
def test_a_network_without_spiking_layers_trains_and_task_report_refuses_it(tmp_path, compose_run):
    target = [f"model._target_={__name__}.Plain", "+model.hidden=3"]
    run(compose_run(tmp_path / "train", "debug=tiny", "model=custom", *target))
    with pytest.raises(NotSpiking, match="and Plain has none"):
        run(compose_run(tmp_path / "rep", "debug=tiny", "task=report",
                        f"ckpt_path={tmp_path / 'train' / 'checkpoints' / 'last.ckpt'}"))


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path):
    """docs/custom_models.md's file and command, run as a user runs them: ``python -m snntrain`` in the folder that
    holds the file (shortened by debug=tiny)."""
    (tmp_path / "tiny_snn.py").write_text(tutorial_code())
    cmd = [sys.executable, "-m", "snntrain", *tutorial_command(), "debug=tiny", f"hydra.run.dir={tmp_path / 'run'}"]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, HYDRA_FULL_ERROR="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "final metrics {'val/acc'" in res.stderr + res.stdout
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
