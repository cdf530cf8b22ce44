"""Crash and resume: a run killed with SIGKILL in the middle of an epoch, resumed from its last
checkpoint, ends with exactly the weights of the uninterrupted run (deterministic mode, CPU), the
training weights and their moving average (``ema``) alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from snntrain.checkpoint import read_checkpoint

# The child composes the config and runs it. With KILL_AT_STEP it SIGKILLs itself while writing the
# checkpoint of that step: the file is complete under its temporary name but not yet renamed.
CHILD = r"""
import os, signal, sys
from hydra import compose, initialize_config_module
import lightning.fabric.plugins.io.torch_io as tio
from snntrain.cli import run

kill_at = int(os.environ.get("KILL_AT_STEP", "0"))
if kill_at:
    original = tio.TorchCheckpointIO.save_checkpoint

    def save_then_die(self, checkpoint, path, storage_options=None):
        original(self, checkpoint, path, storage_options)
        if checkpoint["global_step"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    tio.TorchCheckpointIO.save_checkpoint = save_then_die
with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
    cfg = compose(config_name="config", overrides=sys.argv[1:])
run(cfg)
"""

RUN = [
    "debug=tiny", "trainer.max_epochs=2", "trainer.limit_train_batches=6", "trainer.limit_val_batches=2",
    "trainer.deterministic=true", "callbacks.checkpoint.every_n_steps=2", "callbacks.precise_bn.num_batches=3",
    "task.optimizer.lr=0.01", "callbacks.ema.enabled=true", "callbacks.ema.decay=0.9",
]


def start(out: Path, *extra: str, kill_at: int = 0) -> subprocess.Popen:
    env = dict(os.environ, KILL_AT_STEP=str(kill_at), HYDRA_FULL_ERROR="1")
    return subprocess.Popen([sys.executable, "-c", CHILD, *RUN, f"paths.output_dir={out}", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_gives_identical_weights(tmp_path):
    full, killed, resumed = tmp_path / "full", tmp_path / "killed", tmp_path / "resumed"
    # 6 steps per epoch; interval checkpoints at steps 2, 4, 8, 10 and epoch-end ones at 6 and 12.
    # The killed run dies while writing step 10's, in the middle of its second epoch.
    procs = [start(full), start(killed, kill_at=10)]
    (rc_full, err_full), (rc_killed, err_killed) = (finish(p) for p in procs)
    assert rc_full == 0, err_full[-3000:]
    assert rc_killed == -9, f"the run was meant to die by SIGKILL: rc={rc_killed}\n{err_killed[-3000:]}"

    ckpt_dir = killed / "checkpoints"
    leftovers = [p for p in ckpt_dir.iterdir() if p.name.startswith(".")]
    assert leftovers and all(p.name.endswith(".tmp") for p in leftovers), leftovers  # the interrupted write
    for p in ckpt_dir.glob("*.ckpt"):  # everything named like a checkpoint is a complete one
        read_checkpoint(p)
    last = read_checkpoint(ckpt_dir / "last.ckpt")
    assert (last["epoch"], last["global_step"]) == (1, 8), "resume point should be mid-way through epoch 1"
    loader_state = last["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (loader_state["epoch"], loader_state["batches_done"]) == (1, 2)

    rc, err = finish(start(resumed, f"ckpt_path={ckpt_dir / 'last.ckpt'}"))
    assert rc == 0, err[-3000:]
    assert "not resumable" not in err

    a = torch.load(full / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(resumed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == 12
    for key in ("state_dict", "current_model_state"):  # the average, and the weights being trained
        assert a[key].keys() == b[key].keys()
        different = [k for k in a[key] if not torch.equal(a[key][k], b[key][k])]
        assert not different, f"{key}: weights differ after resume: {different[:5]}"
    assert a["averaging_state"]["n_averaged"] == b["averaging_state"]["n_averaged"] == 12
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a["lr_schedulers"] == b["lr_schedulers"]
    assert not [p for p in (resumed / "checkpoints").iterdir() if p.name.startswith(".")]


class RandomItems(torch.utils.data.Dataset):
    """Item i is (i, a draw from torch's global generator): the draw stands for random augmentation."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i):
        return i, torch.rand(())


def test_loader_state_continues_the_epoch_with_the_same_order_and_augmentation():
    from snntrain.data.common import ResumableLoader

    taken = {"n": 0}
    loader = ResumableLoader(RandomItems(), batch_size=4, seed=3, progress=lambda: (taken["n"], 6))
    loader.sampler.set_epoch(2)
    batches = list(loader)
    assert len(batches) == 6 and sorted(torch.cat([b[0] for b in batches]).tolist()) == list(range(23))
    torch.manual_seed(0)
    again = list(loader)  # the global generator does not matter
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))
    loader.sampler.set_epoch(3)
    assert not torch.equal(next(iter(loader))[0], batches[0][0])  # another epoch, another order

    loader.sampler.set_epoch(2)
    taken["n"] = 4
    state = loader.state_dict()
    assert state == {"seed": 3, "epoch": 2, "batches_done": 4, "batch_size": 4, "size": 23, "processes": 1}
    fresh = ResumableLoader(RandomItems(), batch_size=4, seed=3)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert len(rest) == 2
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches[4:], rest))
    assert len(list(fresh)) == 6  # the skip applies once

    taken["n"] = 6  # a state taken at the end of the epoch continues with the next one
    assert loader.state_dict()["epoch"] == 3 and loader.state_dict()["batches_done"] == 0
    with pytest.warns(UserWarning, match="batch_size was 4, is 5.*starts from its beginning"):
        ResumableLoader(RandomItems(), batch_size=5, seed=3).load_state_dict(state)


def test_seeded_items_leave_other_generators_alone(monkeypatch):
    """Item (epoch, i) is drawn from the CPU generator seeded by (seed, epoch, i), as torch.manual_seed
    would seed it; CUDA generators (the training process's, when the loader runs in it) are neither
    reseeded nor queued for seeding, and the caller's CPU state is restored."""
    from snntrain.data.common import SeededDataset, derive_seed

    def forbidden(*args):
        raise AssertionError("a per-sample seed must not reach the CUDA generators")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", forbidden)
    monkeypatch.setattr(torch.cuda, "manual_seed", forbidden)
    data = SeededDataset(RandomItems(), seed=5)
    torch.default_generator.manual_seed(123)
    before = torch.get_rng_state()
    items = [data[(1, i)] for i in (0, 7, 7)]
    assert torch.equal(torch.get_rng_state(), before)
    expected = torch.rand((), generator=torch.Generator().manual_seed(derive_seed(5, 1, 7)))
    assert items[1][1] == items[2][1] == expected
    assert items[0][1] != items[1][1]


def test_seeded_items_do_not_depend_on_other_threads_reading_items():
    """Two threads read items at once (the image folder's GPU path fetches batches on a thread of its own beside
    the training loop's loader): every item is what one thread alone draws. A dataset declaring
    ``reads_global_torch_random = False`` draws from its item's generator, the same numbers as the global
    generator seeded alike; items drawn from the global generator are read one thread at a time. Without either,
    one thread's seeding lands between the other's seeding and its draw."""
    import threading
    import time

    from snntrain.data.common import SeededDataset, derive_seed, item_generator

    class GlobalDraws(RandomItems):
        def __getitem__(self, i):
            first = float(torch.rand(()))
            time.sleep(0.0002)  # releases the interpreter between the two draws, as reading a file does
            return first, float(torch.rand(()))

    class OwnDraws(RandomItems):
        reads_global_torch_random = False

        def __getitem__(self, i):
            first = float(torch.rand((), generator=item_generator()))
            time.sleep(0.0002)
            return first, float(torch.rand((), generator=item_generator()))

    keys = [(e, i) for e in range(4) for i in range(8)]
    for data in (SeededDataset(GlobalDraws(), seed=5), SeededDataset(OwnDraws(), seed=5)):
        alone = [data[k] for k in keys]
        g = torch.Generator().manual_seed(derive_seed(5, 2, 3))
        assert alone[keys.index((2, 3))] == (float(torch.rand((), generator=g)), float(torch.rand((), generator=g)))
        got: list = [None] * 3
        start = threading.Barrier(3)

        def read(slot, data=data):
            start.wait()
            got[slot] = [data[k] for k in keys]

        threads = [threading.Thread(target=read, args=(slot,)) for slot in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [alone] * 3, type(data.dataset).__name__
    assert item_generator() is None  # set only while an item is read


def test_numpy_state_is_seeded_unless_the_dataset_never_reads_it():
    """NumPy's global state is seeded per item (tonic's transforms read it) and restored after; a dataset
    declaring ``reads_numpy_random = False`` (also behind a Subset) gets its torch draws as before and
    leaves NumPy's state untouched."""
    import numpy as np
    from torch.utils.data import Subset

    from snntrain.data.common import SeededDataset, derive_seed

    class NumpyItems(RandomItems):
        def __getitem__(self, i):
            return float(np.random.rand()), float(torch.rand(()))

    class TorchOnly(NumpyItems):
        reads_numpy_random = False

    np.random.seed(11)
    before = np.random.get_state()[1].copy()
    seeded = SeededDataset(NumpyItems(), seed=5)[(2, 3)]
    assert np.array_equal(np.random.get_state()[1], before)  # restored
    assert seeded[0] == np.random.RandomState(derive_seed(5, 2, 3) % 2**32).rand()

    for data in (TorchOnly(), Subset(TorchOnly(), [0, 1, 2, 3])):
        wrapped = SeededDataset(data, seed=5)
        assert not wrapped.numpy_random
        np.random.seed(11)
        item = wrapped[(2, 3)]
        assert item[1] == seeded[1]  # the same torch draw
        assert item[0] == np.random.RandomState(11).rand()  # drawn from the caller's unseeded stream
