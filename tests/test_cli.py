"""The Hydra app end to end: compose API runs, logs, checkpoints, resume, errors, and the real CLI."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from snntrain.backend import resolve_backend
from snntrain.cli import run

# debug=tiny, logged to TensorBoard over two validation batches
TINY = ["debug=tiny", "logger=tensorboard", "trainer.limit_val_batches=2"]


@pytest.fixture(scope="session")
def make_cfg(compose_run):
    return lambda out, *overrides: compose_run(out, *TINY, *overrides)


def tb_tags(out: Path, images: bool = False, hparams: bool = False):
    """The scalar and histogram tags of a run's TensorBoard files (with ``images``, also its image tags; with
    ``hparams``, also the hyper-parameters' names and the metrics of TensorBoard's HPARAMS dashboard)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    files = glob.glob(str(out / "tensorboard" / "events.out.tfevents.*"))
    assert files, f"no TensorBoard event file under {out}"
    scalars, hists, imgs, params, metrics = set(), set(), set(), set(), set()
    for f in files:
        ea = EventAccumulator(f, size_guidance={"scalars": 0, "histograms": 0, "images": 0})
        ea.Reload()
        scalars |= set(ea.Tags()["scalars"])
        hists |= set(ea.Tags()["histograms"])
        imgs |= set(ea.Tags()["images"])
        for content in ea.PluginTagToContent("hparams").values():
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            params |= set(data.session_start_info.hparams)
            metrics |= {m.name.tag for m in data.experiment.metric_infos}
    return (scalars, hists) + ((imgs,) if images else ()) + ((params, metrics) if hparams else ())


@pytest.fixture(scope="module")
def trained(tmp_path_factory, make_cfg) -> Path:
    out = tmp_path_factory.mktemp("run")
    run(make_cfg(out))
    return out


@pytest.mark.slow
def test_run_writes_config_logs_and_checkpoints(trained):
    out = trained
    saved = OmegaConf.load(out / "config.yaml")
    assert saved.T == 2 and saved.model.T == 2 and saved.model.width == 4
    assert saved.backend.resolved == "torch"
    scalars, hists = tb_tags(out)
    for tag in ("train/loss_step", "train/loss_epoch", "train/acc", "train/lr", "val/loss", "val/acc",
                "firing_rate/sn1", "firing_rate/layer4.1.sn2", "firing_rate/mean"):
        assert tag in scalars, f"{tag} missing from {sorted(scalars)}"
    assert "firing_rate_per_channel/sn1" in hists
    assert (out / "tensorboard" / "hparams.yaml").exists()
    assert not oct(os.stat(out / "config.yaml").st_mode).endswith("600"), "written with the umask's mode"
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert "last.ckpt" in ckpts and len(ckpts) == 2, ckpts
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")], "temporary file left behind"


@pytest.mark.slow
def test_the_tensorboard_tags_readme_names_are_written(trained):
    """Every tag README.md's TensorBoard paragraph names is in a run's event files (``<layer>`` and ``*`` stand
    for any layer or name), and the config keys it names are on the HPARAMS dashboard with its metrics."""
    import re

    from test_readme import README

    text = README.read_text()
    paragraph = text[text.index("\nScalars: "):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    names = re.findall(r"`([^`]+)`", paragraph)
    scalars, hists, images, params, metrics = tb_tags(trained, images=True, hparams=True)
    tags = scalars | hists | images
    for name in names:
        if "/" not in name:
            assert name in params, f"README names the hyper-parameter {name}; written: {sorted(params)}"
            continue
        prefix = re.split(r"<|\*", name)[0]
        found = name in tags if prefix == name else any(t.startswith(prefix) and t != prefix for t in tags)
        assert found, f"README names {name}; written: {sorted(tags)}"
    assert {"train/loss_step", "train/loss_epoch", "efficiency/per_layer"} <= set(names)
    assert metrics == {"val/acc", "val/loss"} and "model.depth" in params and "data.batch_size" in params


@pytest.mark.slow
def test_checkpoint_loads_weights_only_with_config(trained):
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    config = ckpt["hyper_parameters"]["config"]
    assert config["model"]["name"] == "sew_resnet" and config["T"] == 2
    assert config["backend"]["resolved"] == "torch" and "backend" not in ckpt["snntrain"]  # stored once
    assert any(k.startswith("model.layer1.0.conv1") for k in ckpt["state_dict"])


@pytest.mark.slow
def test_resume_continues_from_checkpoint(trained, tmp_path, make_cfg):
    last = trained / "checkpoints" / "last.ckpt"
    first = torch.load(last, map_location="cpu", weights_only=True)
    run(make_cfg(tmp_path, f"ckpt_path={last}", "trainer.max_epochs=2"))
    resumed = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert first["epoch"] == 0 and resumed["epoch"] == 1
    assert resumed["global_step"] == 2 * first["global_step"]


@pytest.mark.slow
def test_validate_only(trained, tmp_path, make_cfg):
    metrics = run(make_cfg(tmp_path, "train=false", f"ckpt_path={trained / 'checkpoints' / 'last.ckpt'}"))
    assert metrics is not None and 0.0 <= metrics <= 1.0


@pytest.mark.slow
def test_seed_makes_runs_repeatable(tmp_path, make_cfg):
    a, b = tmp_path / "a", tmp_path / "b"
    run(make_cfg(a, "seed=7", "logger=none"))
    run(make_cfg(b, "seed=7", "logger=none"))
    sa = torch.load(a / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    sb = torch.load(b / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.slow
def test_plif_and_csv_logger(tmp_path, make_cfg):
    run(make_cfg(tmp_path, "model.neuron.type=PLIF", "~model.neuron.tau", "+model.neuron.init_tau=2.0",
                 "logger=csv", "task.optimizer.name=sgd", "task.optimizer.lr=0.05"))
    assert (tmp_path / "csv" / "metrics.csv").read_text().count("val/acc") == 1


def test_typo_in_group_override_lists_valid_options(tmp_path, make_cfg):
    with pytest.raises(MissingConfigException) as err:
        make_cfg(tmp_path, "model=sew_resnt")
    assert "sew_resnet" in str(err.value) and "Available options" in str(err.value)
    with pytest.raises(ConfigCompositionException):
        make_cfg(tmp_path, "model.depht=18")


def test_bad_neuron_parameter_is_named(tmp_path, make_cfg):
    with pytest.raises(ValueError, match="tau=0.5 must be > 1"):
        run(make_cfg(tmp_path, "model.neuron.tau=0.5"))


def test_data_steps_other_than_the_model_T_are_refused_up_front(tmp_path, make_cfg):
    """Overriding the data's time steps alone would train on them while the export records model.T: refused
    before anything is built or written, naming both keys and the one override that sets both."""
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"data\.T=3 and model\.T=2 differ.*T=3 \(data\.T and model\.T"):
        run(make_cfg(out, "data=digits_dvs", "data.T=3", f"paths.data_dir={tmp_path / 'data'}"))
    with pytest.raises(ValueError, match=r"data\.frames=3 and model\.T=2 differ"):
        run(make_cfg(out, "data=synthetic", "data.frames=3"))
    assert not (out / "checkpoints").exists() and not (tmp_path / "data").exists()
    cfg = make_cfg(out, "data=digits_dvs", "T=3")  # the top-level T sets both
    assert cfg.data.T == cfg.model.T == 3


def test_bad_checkpoint_is_named(tmp_path, make_cfg):
    bad = tmp_path / "broken.ckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="broken.ckpt cannot be read"):
        run(make_cfg(tmp_path / "out", f"ckpt_path={bad}"))


def test_triton_backend_without_cuda_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="backend=triton needs a CUDA GPU.*use backend=torch"):
        resolve_backend("triton", cuda=False)
    assert resolve_backend("auto", cuda=False) == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("triton", cuda=False) == "triton"


# ----------------------------------------------------------------------------- the real command line


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run([sys.executable, "-m", "snntrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_help_lists_config_groups(tmp_path):
    res = cli("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for line in ("task: classify", "backend: auto, torch, triton", "debug: tiny", "logger: csv, none, tensorboard",
                 "callbacks: default"):
        assert line in res.stdout
    models = next(line for line in res.stdout.splitlines() if line.strip().startswith("model: "))
    assert {"custom", "ms_resnet", "sew_fcos", "sew_resnet", "spiking_resnet", "spiking_vgg", "spikformer",
            "spike_driven_transformer", "qkformer"} <= \
        set(models.split(":", 1)[1].replace(",", " ").split())
    assert "data: " in res.stdout and "digits" in res.stdout and "trainer: default" in res.stdout


@pytest.mark.slow
def test_cli_typo_fails_with_options(tmp_path):
    res = cli("backend=trition", cwd=tmp_path)
    assert res.returncode != 0
    assert "Could not find 'backend/trition'" in res.stderr and "auto" in res.stderr and "triton" in res.stderr
    assert len(res.stderr.splitlines()) == 1 and not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_cli_user_errors_are_one_message(tmp_path):
    """A bad value and an unknown key: one message naming the full key (no traceback), exit code 1, and no run
    folder left, its log kept beside where it was; --debug or HYDRA_FULL_ERROR=1 shows the traceback as well."""
    res = cli("debug=tiny", "data.batch_size=-1", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stdout + res.stderr
    errors = res.stderr.splitlines()
    assert len(errors) <= 3 and "snntrain: error: data.batch_size=-1 must be a positive integer" in errors, errors
    runs = tmp_path / "outputs" / "classify"
    (log,) = runs.iterdir()  # the run folder is gone, its log stays
    assert log.name.endswith(".failed.log") and str(log.relative_to(tmp_path)) in res.stderr
    assert "data.batch_size=-1" in log.read_text() and "Traceback" in log.read_text()

    res = cli("model.dept=18", cwd=tmp_path)
    assert res.returncode == 1 and res.stderr.splitlines() == [
        "snntrain: error: model.dept=18: model has no key 'dept'; did you mean model.depth=18?"]

    for full in (["--debug"], []):  # --debug, or HYDRA_FULL_ERROR=1, shows the traceback too
        res = cli("model.dept=18", *full, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0" if full else "1"})
        assert res.returncode == 1 and "Traceback" in res.stderr and "did you mean model.depth=18" in res.stderr
    assert len(list(runs.iterdir())) == 1


@pytest.mark.slow
def test_cli_prints_the_resolved_config(tmp_path):
    """README's command for the resolved config prints every value, interpolations resolved."""
    res = cli("--cfg", "job", "--resolve", "T=3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "${" not in res.stdout
    cfg = OmegaConf.create(res.stdout)
    assert cfg.T == 3 and cfg.model.T == 3 and cfg.model.num_classes == cfg.data.num_classes == 10


@pytest.mark.slow
def test_cli_multirun_over_T(tmp_path):
    res = cli("-m", "T=1,2", "debug=tiny", "paths.log_dir=logs", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted((tmp_path / "logs" / "classify" / "multirun").glob("*/*/config.yaml"))
    assert [OmegaConf.load(p).T for p in runs] == [1, 2]
    for p in runs:
        assert (p.parent / "checkpoints" / "last.ckpt").exists()
    assert "run directory" in res.stdout + res.stderr


@pytest.mark.slow
def test_cli_reads_moved_keys_as_their_new_ones(tmp_path):
    """Keys that moved into the callbacks and trainer groups keep working on the command line, and the
    run says what they are called now."""
    res = cli("precise_bn.num_batches=4", "ema.enabled=true", "checkpoint.every_n_steps=3", "ddp.static_graph=true",
              "--cfg", "job", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = OmegaConf.create(res.stdout)
    assert cfg.callbacks.precise_bn.num_batches == 4 and cfg.callbacks.ema.enabled is True
    assert cfg.callbacks.checkpoint.every_n_steps == 3 and cfg.trainer.ddp.static_graph is True
    assert "precise_bn" not in cfg and "ddp" not in cfg
    assert "precise_bn.num_batches is now callbacks.precise_bn.num_batches" in res.stderr
    assert "ddp.static_graph is now trainer.ddp.static_graph" in res.stderr


@pytest.mark.parametrize("task", ["classify", "detect"])
def test_step_values_are_logged_on_logging_steps_only(tmp_path, compose_run, monkeypatch, task):
    # Lightning writes a step's values every trainer.log_every_n_steps; the tasks publish them on those steps only
    # (one read from the device, no LightningModule.log per key), at the step Lightning writes at
    import csv

    import lightning as L

    from snntrain import callbacks

    calls: list[str] = []
    log, publish = L.LightningModule.log, callbacks.publish

    def counting_log(self, name, *args, **kwargs):
        calls.append(name)
        return log(self, name, *args, **kwargs)

    def counting_publish(trainer, metrics, *args, **kwargs):
        calls.extend(metrics)
        return publish(trainer, metrics, *args, **kwargs)

    monkeypatch.setattr(L.LightningModule, "log", counting_log)
    monkeypatch.setattr(callbacks, "publish", counting_publish)
    run(compose_run(tmp_path, "debug=tiny", f"task={task}", "logger=csv", "trainer.limit_train_batches=4",
                    "data.batch_size=4", "trainer.log_every_n_steps=2", "callbacks.efficiency=false"))
    assert calls.count("train/loss_step") == calls.count("train/lr") == 2, calls
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for key in ("train/loss_step", "train/lr"):
        assert {int(r["step"]) for r in rows if r.get(key)} == {1, 3}, key
    assert [r for r in rows if r.get("train/loss_epoch")], "the epoch's mean is logged"


@pytest.mark.parametrize("task, key", [("classify", "loss"), ("detect", "num_pos")])
def test_epoch_means_are_those_of_their_own_epoch(tmp_path, compose_run, task, key):
    # the training means are logged once, at the epoch's end: each is the mean of that epoch's steps (equal
    # batches), not of the run so far
    import csv

    run(compose_run(tmp_path, "debug=tiny", f"task={task}", "logger=csv", "trainer.max_epochs=2",
                    "data.batch_size=4", "trainer.limit_train_batches=2", "callbacks.efficiency=false"))
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for epoch in (0, 1):
        steps = [float(r[f"train/{key}_step"]) for r in rows if r.get(f"train/{key}_step") and int(r["epoch"]) == epoch]
        means = [float(r[f"train/{key}_epoch"]) for r in rows if r.get(f"train/{key}_epoch") and int(r["epoch"]) == epoch]
        assert len(steps) == 2 and len(means) == 1, rows
        assert means[0] == pytest.approx(sum(steps) / 2, rel=1e-5)


def test_tensorboard_logger_writes_the_values_of_a_call_as_one_event(tmp_path):
    """The run's TensorBoard logger writes every value of a ``log_metrics`` call under its step (what
    Lightning's logger writes value by value), as one event; tensors are read, dicts are Lightning's
    ``add_scalars``, anything else is refused by name."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from snntrain.callbacks import BatchedTensorBoardLogger

    logger = BatchedTensorBoardLogger(str(tmp_path), name="tb", version="", default_hp_metric=False)
    logger.log_metrics({"a": 1.5, "b/c": torch.tensor(-2.0), "n": 3}, step=4)
    logger.log_metrics({"a": 0.25}, step=7)
    logger.log_metrics({"pair": {"x": 1.0, "y": 2.0}}, step=8)
    with pytest.raises(ValueError, match="metric bad='text' cannot be logged"):
        logger.log_metrics({"bad": "text"}, step=9)
    logger.finalize("success")
    (events,) = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    written = [e for e in EventFileLoader(events).Load() if e.HasField("summary")]
    assert [(e.step, len(e.summary.value)) for e in written] == [(4, 3), (7, 1)]
    ea = EventAccumulator(events, size_guidance={"scalars": 0})
    ea.Reload()
    assert [(s.step, s.value) for s in ea.Scalars("a")] == [(4, 1.5), (7, 0.25)]
    assert [(s.step, s.value) for s in ea.Scalars("b/c")] == [(4, -2.0)] and ea.Scalars("n")[0].value == 3
    assert glob.glob(str(tmp_path / "tb" / "pair_x" / "events.out.tfevents.*"))  # add_scalars' own writers


def test_tensorboard_records_are_checksummed_in_c_with_the_same_checksums(tmp_path):
    """The run's logger switches TensorBoard's record checksums to google-crc32c: the same masked CRC32C as
    TensorBoard's pure-Python one, and a written event file whose every record carries it."""
    import struct

    import numpy as np
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as python_crc
    from tensorboard.summary.writer import record_writer

    from snntrain.callbacks import BatchedTensorBoardLogger, fast_record_checksums

    assert fast_record_checksums() and record_writer.masked_crc32c is not python_crc
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 1000, 12345):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert record_writer.masked_crc32c(data) == python_crc(data), n
    logger = BatchedTensorBoardLogger(str(tmp_path), name="tb", version="", default_hp_metric=False)
    logger.log_metrics({f"m{i}": float(i) for i in range(50)}, step=1)
    logger.finalize("success")
    (events,) = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    raw, records = Path(events).read_bytes(), 0
    while raw:
        (length,) = struct.unpack("<Q", raw[:8])
        assert struct.unpack("<I", raw[8:12])[0] == python_crc(raw[:8])
        data, raw = raw[12:12 + length], raw[12 + length:]
        assert struct.unpack("<I", raw[:4])[0] == python_crc(data)
        raw, records = raw[4:], records + 1
    assert records == 2  # the file version, then the 50 values
