"""Training on two processes with Lightning's DDP, through the real command line.

Without two GPUs the processes run on the CPU over gloo with ``backend=torch``; on a machine with
two GPUs the same tests run over NCCL with ``backend=triton`` and ``trainer.sync_batchnorm=true``.

What is checked: one run directory per job (a sweep included) with one ``config.yaml``, one
``.hydra`` folder and each checkpoint once; both processes report the same validation metrics; and
the logged validation metrics equal one process validating the same checkpoint over the same data.
That last comparison is exact up to float rounding because validation is sharded without repeats
(:class:`snntrain.distributed.EvalShardSampler`) and losses, firing rates, accuracy and mAP are sums
and counts reduced over the processes. The validation sizes are chosen so that each process's batches
are also the single process's batches (digits: 360 images = 2 blocks of 3 batches of 60; faces:
7 images = blocks of 3 and 4, batches of 1, so the shards are uneven): then not even a convolution
sees a different batch, and the only differences left are the order of the cross-process sums.
"""

from __future__ import annotations

import csv
import glob
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from snntrain.cli import train
from snntrain.distributed import (
    JOB_ENV,
    DeferredSigtermEpochLoop,
    EvalShardSampler,
    SyncBatchNorm,
    command_line,
    convert_sync_batchnorm,
    ddp_strategy,
    defer_sigterm_check,
    rank_name,
)

GPUS = torch.cuda.device_count() >= 2
# cuDNN's timed algorithm choice off: each process (and the single process validating the checkpoint) would
# choose its own convolution algorithms, whose TF32 sums differ by more than rounding and flip spikes
ON = ["trainer.accelerator=gpu", "backend=triton", "trainer.sync_batchnorm=true", "trainer.benchmark=false"] if GPUS \
    else []
# debug=tiny with the whole validation set, logged to TensorBoard
COMMON = ["debug=tiny", *ON, "trainer.limit_val_batches=null", "logger=tensorboard"]
CLASSIFY = [*COMMON, "data.batch_size=60"]
DETECT = [*COMMON, "task=detect", "data.num_val=7", "data.batch_size=1"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "RANK", "WORLD_SIZE", JOB_ENV)}
    env["HYDRA_FULL_ERROR"] = "1"
    res = subprocess.run([sys.executable, "-m", "snntrain", *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "sync_dist=True" not in res.stderr, "a metric was logged without reduction over processes"
    return res


def single_process_validation(compose_run, overrides: list[str], ckpt: Path, out: Path) -> dict[str, float]:
    device = ["trainer.devices=1", "trainer.sync_batchnorm=false"]
    return train(compose_run(out, *overrides, *device, "train=false", f"ckpt_path={ckpt}", "logger=none"))


def logged_epoch_metrics(run: Path) -> dict[str, float]:
    """The last validation epoch's values in the CSV log."""
    out: dict[str, float] = {}
    with open(run / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            out.update({k: float(v) for k, v in row.items()
                        if v and k.startswith(("val/", "firing_rate/", "efficiency/"))})
    return out


def tb_scalars(run: Path) -> tuple[dict[str, float], set[str], int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(str(run / "tensorboard" / "events.out.tfevents.*"))
    assert len(files) == 1, files  # written by rank 0 only
    ea = EventAccumulator(files[0], size_guidance={"scalars": 0, "images": 0, "histograms": 0})
    ea.Reload()
    last = {tag: ea.Scalars(tag)[-1].value for tag in ea.Tags()["scalars"]}
    return last, set(ea.Tags()["images"]) | set(ea.Tags()["histograms"]), len(ea.Images("val/detections"))


def final_metrics_lines(run: Path) -> list[str]:
    lines = []
    for log in sorted(run.glob("cli*.log")):
        lines += [ln.split("final metrics ", 1)[1] for ln in log.read_text().splitlines() if "final metrics" in ln]
    return lines


def check_run_dir(run: Path) -> None:
    names = sorted(p.name for p in run.iterdir())
    assert names.count("config.yaml") == 1 and ".hydra" in names, names
    assert sorted(p.name for p in run.glob("cli*.log")) == ["cli.log", "cli_rank1.log"], names
    assert not [n for n in names if n.startswith(("train_ddp", "lightning_logs"))], names
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(ckpts) == 2 and "last.ckpt" in ckpts, ckpts  # last + best, each once, no temporary file
    lines = final_metrics_lines(run)
    assert len(lines) == 2 and lines[0] == lines[1], lines  # both ranks report the same validation metrics


def assert_close(logged: dict[str, float], single: dict[str, float], keys: list[str]) -> None:
    for k in keys:
        assert k in logged and k in single, (k, sorted(logged), sorted(single))
        assert logged[k] == pytest.approx(single[k], rel=1e-5, abs=1e-6), (k, logged[k], single[k])


@pytest.mark.slow
def test_ddp_classification_sweep_matches_single_process_and_resumes_on_one(tmp_path, compose_run):
    """A sweep of two jobs of two processes each: the default LIF, and ALIF (a neuron generated from its step, with a
    second state and learnable parameters, whose gradients are all-reduced like the others)."""
    neurons = ["LIF", "ALIF"]
    res = cli("-m", f"model.neuron.type={','.join(neurons)}", *CLASSIFY, "trainer.devices=2", "logger=csv",
              "paths.log_dir=logs", cwd=tmp_path)
    sweeps = list((tmp_path / "logs" / "classify" / "multirun").iterdir())
    assert len(sweeps) == 1, sweeps  # the processes of each job ran that job, not the sweep again
    runs = sorted(p for p in sweeps[0].iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["0", "1"], res.stderr[-2000:]
    for run in runs:
        check_run_dir(run)
        logged = logged_epoch_metrics(run)
        neuron = f"model.neuron.type={neurons[int(run.name)]}"  # job n of the sweep ran the n-th neuron
        single = single_process_validation(compose_run, [*CLASSIFY, neuron], run / "checkpoints" / "last.ckpt",
                                           tmp_path / f"val{run.name}")
        rates = [k for k in single if k.startswith("firing_rate/")]
        assert len(rates) > 10
        # synaptic operations of all ranks (the AC/MAC split is decided per batch, and batches differ here)
        assert_close(logged, single, ["val/loss", "val/acc", *rates, "efficiency/Dense",
                                      "efficiency/ActivationSparsity"])

    # a two-process checkpoint resumes on one process (next epoch, same step count per epoch there)
    last = runs[0] / "checkpoints" / "last.ckpt"
    first = torch.load(last, map_location="cpu", weights_only=True)
    train(compose_run(tmp_path / "resumed", *CLASSIFY, "trainer.sync_batchnorm=false", f"ckpt_path={last}",
                      "trainer.max_epochs=2", "logger=none"))
    resumed = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert first["epoch"] == 0 and resumed["epoch"] == 1
    assert first["global_step"] == 2 and resumed["global_step"] == 4


@pytest.mark.slow
def test_ddp_detection_resumes_single_process_run_and_matches_single_process(tmp_path, compose_run):
    # one epoch on one process, then a second on two: resuming on a different number of devices
    train(compose_run(tmp_path / "one", *DETECT, "trainer.sync_batchnorm=false", "trainer.devices=1", "logger=none"))
    run = tmp_path / "two"
    first = tmp_path / "one" / "checkpoints" / "last.ckpt"
    cli(*DETECT, "trainer.devices=2", "trainer.max_epochs=2", f"ckpt_path={first}", f"hydra.run.dir={run}",
        cwd=tmp_path)
    check_run_dir(run)
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["epoch"] == 1 and last["global_step"] == 4
    logged, others, images = tb_scalars(run)
    # histograms and images written once, by rank 0 (images after the sanity check only)
    assert "firing_rate_per_channel/backbone.sn1" in others and "efficiency/per_layer" in others and images == 1
    single = single_process_validation(compose_run, DETECT, run / "checkpoints" / "last.ckpt", tmp_path / "val")
    assert_close(logged, single, ["val/loss", "val/loss_box", "val/loss_cls", "val/loss_ctr", "val/num_pos", "val/map",
                                  "val/map_50", "val/mar_100", "firing_rate/mean", "firing_rate/backbone.sn1",
                                  "efficiency/Effective_ACs", "efficiency/Effective_MACs", "efficiency/Dense"])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not GPUS, reason="needs two CUDA GPUs")
def test_two_gpus_capture_the_step_with_its_all_reduce_and_train_as_eager(tmp_path):
    """With the flat reducer the whole training step of each process, the NCCL all-reduce of the gradients
    included, is one CUDA graph (``cuda_graph=true`` refuses a run it cannot capture). Trained so, rank 0's
    weights are those of the same run without the graph (fp32, SGD, as in ``test_speed``'s one-GPU comparison),
    while they moved far more than that from where they started: a step whose all-reduce were lost or left out
    of the replays would apply rank 0's gradients only. ``trainer.deterministic``: the two runs are then equal to
    the last bit (2 x H200, 2026-11-27); with cuDNN's heuristic but not deterministic algorithms their updates
    differed by 4 % and 16 % of their size in two runs, the last bits of atomic sums flipping spikes."""
    common = ["data=synthetic", "data.image_size=32", "data.num_train=320", "data.num_val=64", "data.batch_size=16",
              "model.stem=cifar", "model.width=16", "T=2", "trainer.accelerator=gpu", "trainer.devices=2",
              "backend=triton", "trainer.max_epochs=2", "trainer.precision=32-true", "trainer.deterministic=true",
              "task.optimizer.name=sgd", "task.optimizer.lr=0.05", "callbacks.precise_bn.enabled=false",
              "logger=csv", "trainer.enable_progress_bar=false"]

    def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))

    weights = {}
    for graph in ("false", "true"):
        run = tmp_path / f"graph_{graph}"
        cli(*common, f"cuda_graph={graph}", "seed=3", f"hydra.run.dir={run}", cwd=tmp_path)
        lines = final_metrics_lines(run)
        assert len(lines) == 2 and lines[0] == lines[1], lines
        state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert state["global_step"] == 20  # 10 steps per process and epoch (320 images, 2 x 16 per step)
        weights[graph] = {k: v for k, v in state["state_dict"].items()
                          if v.is_floating_point() and not k.endswith(("running_mean", "running_var"))}
    assert weights["true"].keys() == weights["false"].keys()
    from snntrain.models import build_model

    torch.manual_seed(3)  # the run's model, as its task made it after seed_everything(3): the initial weights
    init = {f"model.{k}": v for k, v in build_model(state["hyper_parameters"]["config"]["model"]).state_dict().items()}
    keys = [k for k in weights["false"] if k in init]
    eager = torch.cat([(weights["false"][k] - init[k]).double().flatten() for k in keys])
    graph = torch.cat([(weights["true"][k] - init[k]).double().flatten() for k in keys])
    # what training changed, the same with and without the graph (a lost all-reduce: rank 0's half of the
    # gradients, an update about as far from the average as the average is long)
    start = torch.cat([init[k].double().flatten() for k in keys])
    assert 2e-3 < float(eager.norm() / start.norm()) < 0.5  # trained (about 1e-2 on a CPU), from these weights
    err = float((graph - eager).norm() / eager.norm())
    assert err <= 1e-3, f"the graph's updates differ from the eager run's by {err:.2e} of their size"


# ----------------------------------------------------------------------------------------- pieces


def test_eval_shards_cover_every_sample_once_in_order():
    data = list(range(11))
    shards = [list(EvalShardSampler(data, num_replicas=3, rank=r)) for r in range(3)]
    assert shards == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9, 10]]
    assert [len(EvalShardSampler(data, num_replicas=3, rank=r)) for r in range(3)] == [3, 4, 4]
    with pytest.raises(ValueError, match="2 sample.*fewer than the 3 processes"):
        EvalShardSampler([0, 1], num_replicas=3, rank=0)


def test_command_line_of_ddp_children_and_other_ranks():
    argv = ["snntrain", "-m", "T=1,2"]
    job = '{"parent": 7, "argv": ["T=2", "hydra.run.dir=\'out/0\'", "hydra.output_subdir=null"]}'
    child = command_line(argv, {JOB_ENV: job, "LOCAL_RANK": "1", "NODE_RANK": "0"}, ppid=7)
    assert child == ["snntrain", "T=2", "hydra.run.dir='out/0'", "hydra.output_subdir=null", "hydra.job.name=cli_rank1"]
    # the job is for the parent's own children only; rank 0 keeps its command line
    assert command_line(argv, {JOB_ENV: job, "LOCAL_RANK": "1"}, ppid=8)[:3] == argv
    assert command_line(argv, {}) == argv
    assert command_line(argv, {"RANK": "3"}) == [*argv, "hydra.output_subdir=null", "hydra.job.name=cli_rank3"]
    assert rank_name({"NODE_RANK": "1", "LOCAL_RANK": "0"}) == "node1_rank0"
    assert rank_name({"SLURM_PROCID": "0", "LOCAL_RANK": "0"}) is None


class FusedNormStandIn(nn.Module):
    """A module with its own batch statistics, taking part through the conversion protocol."""

    def __init__(self) -> None:
        super().__init__()
        self.synced = False
        self.inner = nn.BatchNorm2d(3)  # left to the module itself

    def to_sync_batchnorm(self, process_group):
        self.synced = True
        return self

    def from_sync_batchnorm(self):
        self.synced = False
        return self


def test_sync_batchnorm_conversion_and_revert():
    model = nn.Sequential(nn.Conv2d(1, 3, 1), nn.BatchNorm2d(3), nn.Sequential(nn.BatchNorm2d(3)), FusedNormStandIn())
    weight = model[1].weight
    model[1].running_mean.fill_(0.5)
    converted = convert_sync_batchnorm(model)
    assert isinstance(converted[1], nn.SyncBatchNorm) and isinstance(converted[2][0], nn.SyncBatchNorm)
    assert converted[3].synced and type(converted[3].inner) is nn.BatchNorm2d
    reverted = SyncBatchNorm().revert(converted)
    assert type(reverted[1]) is nn.BatchNorm2d and type(reverted[2][0]) is nn.BatchNorm2d
    assert reverted[1].weight is weight and torch.all(reverted[1].running_mean == 0.5)
    assert not reverted[3].synced


@pytest.mark.slow
def test_training_speed_is_logged_on_synthetic_data(tmp_path, compose_run):
    cfg = compose_run(tmp_path, "debug=tiny", "data=synthetic", "data.num_classes=3", "trainer.limit_train_batches=null")
    metrics = train(cfg)
    assert metrics["perf/train_images_per_s"] > 0  # 8 steps: 3 timed after 5 warm-up steps
    assert 0.0 <= metrics["val/acc"] <= 1.0


def test_synthetic_data_is_a_fixed_pool():
    from snntrain.data import build_datamodule

    dm = build_datamodule({"name": "synthetic", "num_train": 10, "num_val": 3, "image_size": 5, "in_channels": 2,
                           "num_classes": 4, "pool_size": 4, "batch_size": 2}, seed=3)
    dm.setup()
    x, y = dm.train_set[5]
    assert x.shape == (2, 5, 5) and torch.equal(x, dm.train_set[1][0]) and 0 <= int(y) < 4
    assert torch.equal(dm.val_set[0][0], dm.train_set[2][0]) and len(dm.val_set) == 3
    # training batches: views of the pool (no host copy), samples k*B.. of batch k, a partial last one
    batches = list(dm.train_dataloader())
    assert sorted(len(b[0]) for b in batches) == [2] * 5
    firsts = sorted(float(b[0][0].sum()) for b in batches)
    assert firsts == sorted(float(dm.train_set[2 * k][0].sum()) for k in range(5))
    for x, _ in batches:
        assert x.untyped_storage().data_ptr() == dm.train_batches.images.untyped_storage().data_ptr()
    dm = build_datamodule({"name": "synthetic", "num_train": 7, "pool_size": 4, "batch_size": 3, "image_size": 2},
                          seed=3)
    dm.setup()
    last = dm.train_batches[2]
    assert len(dm.train_batches) == 3 and len(last[0]) == 1 and torch.equal(last[0][0], dm.train_set[6][0])
    wrapped = dm.train_batches[1]  # samples 3, 4, 5 = pool entries 3, 0, 1
    assert all(torch.equal(wrapped[0][j], dm.train_set[3 + j][0]) for j in range(3))
    assert all(torch.equal(wrapped[1][j], dm.train_set[3 + j][1]) for j in range(3))
    with pytest.raises(ValueError, match="pool_size=0"):
        build_datamodule({"name": "synthetic", "pool_size": 0})


def test_training_epochs_are_sharded_over_processes():
    from snntrain.data.common import EpochSampler, ResumableLoader

    shards = [EpochSampler(10, seed=4, num_replicas=3, rank=r) for r in range(3)]
    for s in shards:
        s.set_epoch(2)
    taken = [list(s) for s in shards]
    assert [len(t) for t in taken] == [4, 4, 4] and [len(s) for s in shards] == [4, 4, 4]  # equal step counts
    one = EpochSampler(10, seed=4, num_replicas=1, rank=0)
    one.set_epoch(2)
    perm = [i for _, i in one]
    padded = perm + perm[:2]  # 10 samples over 3 processes: two read twice
    assert taken == [[(2, i) for i in padded[r::3]] for r in range(3)]
    assert sorted({i for t in taken for _, i in t}) == list(range(10))
    shards[1].resume_at(2, 3)  # a resumed process continues its own share
    assert list(shards[1]) == taken[1][3:] and list(shards[1]) == taken[1]
    assert EpochSampler(10, seed=4).num_replicas == 1  # no process group: one process

    loader = ResumableLoader(list(range(10)), batch_size=2, seed=4, sampler=shards[0])
    state = loader.state_dict()
    assert state["processes"] == 3 and state["size"] == 10
    with pytest.warns(UserWarning, match="processes was 3, is 1.*starts from its beginning"):
        ResumableLoader(list(range(10)), batch_size=2, seed=4).load_state_dict({**state, "batches_done": 1})
    one = ResumableLoader(list(range(10)), batch_size=2, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an epoch boundary resumes exactly on any number of processes
        one.load_state_dict({**state, "epoch": 3, "batches_done": 0})
    assert [i for b in one for i in b.tolist()] == one.sampler.shard(3)  # epoch 3 from its start


@pytest.mark.slow
def test_ddp_processes_split_each_training_epoch(tmp_path):
    from snntrain.data import build_datamodule

    run = tmp_path / "run"
    # each process keeps its own batch-norm buffers (no broadcast from rank 0): only precise BN's average
    # over the processes makes them agree before validation
    cli(*CLASSIFY, "trainer.limit_train_batches=null", "trainer.devices=2", "trainer.limit_val_batches=1",
        "trainer.ddp.broadcast_buffers=false", "trainer.ddp.gradient_as_bucket_view=true", f"hydra.run.dir={run}",
        cwd=tmp_path)
    lines = final_metrics_lines(run)
    assert len(lines) == 2 and lines[0] == lines[1], lines  # the averaged precise-BN statistics agree
    dm = build_datamodule({"name": "digits"}, seed=42)
    dm.setup("fit")
    per_process = -(-len(dm.train_set) // 2)
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == -(-per_process // 60)  # each process read half of the epoch


def _sigterm_worker(rank: int, store: str, received: list, answers) -> None:
    from snntrain.distributed import _SigtermFlag

    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        flag = _SigtermFlag(torch.device("cpu"))
        answers[rank] = [flag.ask(r) for r in received[rank]]
    finally:
        torch.distributed.destroy_process_group()


def test_sigterm_flag_is_rank_zeros_read_one_step_later_by_every_process(tmp_path):
    """Lightning's per-step SIGTERM check, deferred (no host synchronisation on CUDA): at every step each
    process broadcasts, and reads rank 0's flag of the step before; rank 1's own flag is never the answer."""
    import torch.multiprocessing as mp

    received = [[False, False, True, False, True], [True, False, False, False, False]]
    with mp.Manager() as manager:
        answers = manager.dict()
        mp.start_processes(_sigterm_worker, args=(str(tmp_path / "store"), received, answers), nprocs=2,
                           start_method="spawn")
        got = dict(answers)
    assert got[0] == got[1] == [False, False, False, True, False], got  # every process stops at step 3


def _reduce_worker(rank: int, store: str, results) -> None:
    from snntrain.distributed import all_reduce_gradients, broadcast_from_rank_zero

    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        g = torch.Generator().manual_seed(rank)
        conv = nn.Parameter(torch.zeros(4, 3, 3, 3).contiguous(memory_format=torch.channels_last))
        lin = nn.Parameter(torch.zeros(5, 6))
        half = nn.Parameter(torch.zeros(7, dtype=torch.bfloat16))
        unused = nn.Parameter(torch.zeros(3))  # no gradient on rank 1
        frozen = nn.Parameter(torch.zeros(2), requires_grad=False)
        conv.grad = torch.randn(4, 3, 3, 3, generator=g).contiguous(memory_format=torch.channels_last)
        lin.grad = torch.randn(6, 5, generator=g).t()  # neither contiguous nor channels-last
        half.grad = torch.randn(7, generator=g).to(torch.bfloat16)
        if rank == 0:
            unused.grad = torch.randn(3, generator=g)
        sent = [None if p.grad is None else p.grad.clone() for p in (conv, lin, half, unused)]
        all_reduce_gradients([conv, lin, half, unused, frozen], world_size=2)
        buffers = [torch.full((3,), float(rank)), torch.arange(4) + 10 * rank]
        broadcast_from_rank_zero(buffers)
        results[rank] = {"sent": sent, "got": [p.grad for p in (conv, lin, half, unused)], "frozen": frozen.grad,
                         "channels_last": conv.grad.is_contiguous(memory_format=torch.channels_last),
                         # the float32 gradients are views of one averaged buffer (no copy back)
                         "one_buffer": len({p.grad.untyped_storage().data_ptr() for p in (conv, lin, unused)}) == 1,
                         "buffers": buffers}
    finally:
        torch.distributed.destroy_process_group()


def test_flat_reducer_averages_every_gradient_and_copies_rank_zeros_buffers(tmp_path):
    """The flat DDP reducer's collectives on two gloo processes: gradients of any layout and dtype (and one
    parameter that only rank 0 used) are averaged, each dtype's in one buffer that the gradients then view;
    buffers are rank 0's everywhere."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_reduce_worker, args=(str(tmp_path / "store"), results), nprocs=2, start_method="spawn")
        r = dict(results)
    for i in range(3):
        want = (r[0]["sent"][i].float() + r[1]["sent"][i].float()) / 2
        for rank in (0, 1):
            torch.testing.assert_close(r[rank]["got"][i].float(), want, rtol=0, atol=1e-2 if i == 2 else 1e-6)
    for rank in (0, 1):
        torch.testing.assert_close(r[rank]["got"][3], r[0]["sent"][3] / 2)  # rank 1 contributed zeros
        assert r[rank]["frozen"] is None and r[rank]["channels_last"] and r[rank]["one_buffer"]
        torch.testing.assert_close(r[rank]["buffers"][0], torch.zeros(3))
        torch.testing.assert_close(r[rank]["buffers"][1], torch.arange(4))


def test_flat_reducer_lets_the_step_be_captured_unless_batch_norm_is_synchronised():
    """The captured training step holds the flat reducer's all-reduce, but not sync_batchnorm's collectives
    inside the forward: the strategy tells which, from the Trainer it belongs to (however it was made)."""
    import lightning as L

    from snntrain.distributed import FlatGradientDDP

    for sync, capturable in ((False, True), (True, False)):
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy=FlatGradientDDP(), sync_batchnorm=sync,
                            plugins=[SyncBatchNorm()] if sync else [], logger=False, enable_checkpointing=False)
        assert trainer.strategy.step_capturable is capturable


def test_training_loop_gets_the_deferred_sigterm_check():
    import lightning as L

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert defer_sigterm_check(trainer)
    assert type(trainer.fit_loop.epoch_loop) is DeferredSigtermEpochLoop
    assert not defer_sigterm_check(trainer)  # once


def test_ddp_settings_reach_the_strategy():
    from lightning.pytorch.strategies import DDPStrategy

    from snntrain.distributed import FlatGradientDDP

    two = {"accelerator": "cpu", "devices": 2, "num_nodes": 1, "strategy": "auto"}
    # one node: the flat reducer, with rank 0's buffers copied to all (or not)
    assert type(ddp_strategy(two, {})) is FlatGradientDDP and ddp_strategy(two, {}).broadcast_buffers
    assert not ddp_strategy(two, {"broadcast_buffers": False}).broadcast_buffers
    # torch's reducer: asked for, on several nodes, or when one of its own settings is on
    strategy = ddp_strategy(two, {"reducer": "buckets", "broadcast_buffers": False})
    assert type(strategy) is DDPStrategy
    assert strategy._ddp_kwargs == {"broadcast_buffers": False, "gradient_as_bucket_view": False, "static_graph": False}
    assert ddp_strategy(two, {"static_graph": True})._ddp_kwargs["static_graph"] is True
    assert type(ddp_strategy({**two, "devices": 1, "num_nodes": 2}, {})) is DDPStrategy  # processes over nodes
    assert type(ddp_strategy({**two, "devices": [0, 1]}, {})) is FlatGradientDDP
    assert isinstance(ddp_strategy({**two, "devices": 1, "strategy": "ddp"}, {}), DDPStrategy)  # asked for by name
    assert ddp_strategy({**two, "devices": 1}, {"static_graph": True}) == "auto"  # one process: no DDP
    assert ddp_strategy({**two, "devices": "auto"}, {}) == "auto"  # CPU "auto": one process
    assert ddp_strategy({**two, "strategy": "ddp_spawn"}, {}) == "ddp_spawn"  # other strategies as given
    with pytest.raises(ValueError, match=r"unknown trainer.ddp setting\(s\) \['bucket_mb'\]; valid: reducer, broadcast"):
        ddp_strategy(two, {"bucket_mb": 25})
    with pytest.raises(ValueError, match=r"trainer.ddp.static_graph='yes' must be true or false"):
        ddp_strategy(two, {"static_graph": "yes"})
    with pytest.raises(ValueError, match=r"trainer.ddp.reducer='fast'; valid: auto, flat, buckets"):
        ddp_strategy(two, {"reducer": "fast"})
    with pytest.raises(ValueError, match=r"trainer.ddp.static_graph=true is a setting of reducer=buckets"):
        ddp_strategy(two, {"reducer": "flat", "static_graph": True})


@pytest.mark.slow
def test_two_nodes_of_one_process_each_through_the_command_line(tmp_path):
    """Several nodes as docs/multinode.md documents them: the same command on every node with
    ``trainer.num_nodes``, ``NODE_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and one shared run directory;
    here two "nodes" of one CPU process each on this machine, talking over gloo on the loopback."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "RANK", "WORLD_SIZE", JOB_ENV)}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYDRA_FULL_ERROR="1")
    cmd = [sys.executable, "-m", "snntrain", "debug=tiny", "data.batch_size=60", "trainer.limit_train_batches=null",
           "trainer.devices=1", "trainer.num_nodes=2", "trainer.limit_val_batches=2", "logger=csv",
           f"hydra.run.dir={run}"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env={**env, "NODE_RANK": str(node)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, out[-2000:] + err[-4000:]
    names = sorted(p.name for p in run.iterdir())
    assert names.count("config.yaml") == 1, names
    assert sorted(p.name for p in run.glob("cli*.log")) == ["cli.log", "cli_node1_rank0.log"], names
    lines = final_metrics_lines(run)
    assert len(lines) == 2 and lines[0] == lines[1], lines  # both nodes report the same validation metrics
    from snntrain.data import build_datamodule

    dm = build_datamodule({"name": "digits"}, seed=42)
    dm.setup("fit")
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    per_node = math.ceil(len(dm.train_set) / 2)
    assert last["global_step"] == math.ceil(per_node / 60)  # each node read half of the epoch
