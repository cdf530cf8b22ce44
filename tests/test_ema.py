"""The exponential moving average of the weights (``ema``): the update rule, what validation and
checkpoints see, and its order with precise batch norm."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from snntrain.callbacks import ExponentialMovingAverage, PreciseBatchNorm, ema_decay


def test_decay_warms_up_to_its_value():
    assert ema_decay(0.998, 0) == pytest.approx(0.1)
    assert ema_decay(0.998, 10) == pytest.approx(11 / 20)
    assert ema_decay(0.998, 100_000) == 0.998
    assert ema_decay(0.2, 3) == 0.2  # a decay below the warm-up value applies at once


def test_update_is_the_warmed_up_average_of_every_step():
    torch.manual_seed(0)
    model = nn.BatchNorm1d(3)
    callback = ExponentialMovingAverage(decay=0.9)
    averaged = AveragedModel(model, use_buffers=True, multi_avg_fn=callback._update)
    expected = None
    for n in range(6):
        with torch.no_grad():
            model.weight.add_(torch.randn(3))
        model.train()
        model(torch.randn(8, 3))  # moves the running statistics and the counter
        averaged.update_parameters(model)
        current = model.weight.detach().clone()
        if expected is None:
            expected = current  # the first update copies
        else:
            d = ema_decay(0.9, n)
            expected = d * expected + (1 - d) * current
        torch.testing.assert_close(averaged.module.weight, expected, rtol=1e-6, atol=1e-7)
    assert int(averaged.module.num_batches_tracked) == int(model.num_batches_tracked) == 6  # counters copied


def test_the_average_takes_the_layout_the_model_takes_after_it_was_copied():
    # the average is copied before the task turns the model channels-last; the update gives it the model's
    # strides (so foreach_lerp_ stays on its one-launch path) and keeps the values
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    callback = ExponentialMovingAverage(decay=0.9)
    callback._average_model = AveragedModel(model, use_buffers=True, multi_avg_fn=callback._update)
    callback._num_updates = None
    model.to(memory_format=torch.channels_last)
    weights = []
    for _ in range(3):
        with torch.no_grad():
            model[0].weight.add_(torch.randn_like(model[0].weight))
        model(torch.randn(2, 3, 6, 6))  # moves the statistics and the counter
        weights.append(model[0].weight.detach().clone())
        callback._update_average(model)
    average = callback._average_model.module
    assert average[0].weight.stride() == model[0].weight.stride() != torch.empty(4, 3, 3, 3).stride()
    expected = weights[0]
    for n, w in enumerate(weights[1:], start=1):
        d = ema_decay(0.9, n)
        expected = d * expected + (1 - d) * w
    torch.testing.assert_close(average[0].weight, expected, rtol=1e-6, atol=1e-7)
    assert int(average[1].num_batches_tracked) == int(model[1].num_batches_tracked) == 3


def test_tensors_are_looked_up_once_an_epoch_and_again_after_the_model_replaced_them(monkeypatch):
    # the update keeps the average's and the model's tensors for the epoch instead of walking the module tree
    # every step; a layout change between epochs (new buffer objects, as .to(memory_format=...) makes) is
    # picked up at the next epoch's first update
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    callback = ExponentialMovingAverage(decay=0.9)
    callback._average_model = AveragedModel(model, use_buffers=True, multi_avg_fn=callback._update)
    callback._num_updates = None
    walks = []
    original = nn.Module.buffers
    monkeypatch.setattr(nn.Module, "buffers", lambda self, *a, **k: walks.append(1) or original(self, *a, **k))
    stats = []
    for _epoch in range(2):
        callback.on_train_epoch_start(None, model)
        walks.clear()
        for _ in range(3):
            model(torch.randn(2, 3, 6, 6))  # moves the statistics
            stats.append(model[1].running_mean.clone())
            callback._update_average(model)
        assert len(walks) == 2, walks  # the average's and the model's tensors, once for the epoch's 3 updates
        model.to(memory_format=torch.channels_last)
        model[1].running_mean = model[1].running_mean.clone()  # a new buffer object
    expected = stats[0]
    for n, m in enumerate(stats[1:], start=1):
        d = ema_decay(0.9, n)
        expected = d * expected + (1 - d) * m
    torch.testing.assert_close(callback._average_model.module[1].running_mean, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1, "x", True])
def test_bad_decay_is_named(decay):
    with pytest.raises(ValueError, match="ema.decay"):
        ExponentialMovingAverage(decay=decay)


class Toy(L.LightningModule):
    """x -> Linear -> BatchNorm1d -> sum; validation records what it sees."""

    def __init__(self, data: torch.utils.data.Dataset) -> None:
        super().__init__()
        self.data = data
        self.linear = nn.Linear(2, 3)
        self.norm = nn.BatchNorm1d(3)
        self.seen: list[tuple[torch.Tensor, ...]] = []
        self.trained: list[torch.Tensor] = []

    def forward(self, x):
        return self.norm(self.linear(x))

    def training_step(self, batch, batch_idx):
        return (self(batch[0]) - batch[1]).pow(2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.trained.append(self.linear.weight.detach().clone())

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.seen.append((self.linear.weight.detach().clone(), self.linear.bias.detach().clone(),
                              self.norm.running_mean.clone()))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):  # precise batch norm draws its batches from here
        return torch.utils.data.DataLoader(self.data, batch_size=8)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=8)


@pytest.mark.slow
def test_validation_runs_on_the_average_with_statistics_for_it(tmp_path):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 2, generator=g) * 2 + 1, torch.randn(32, 3, generator=g))
    torch.manual_seed(0)
    model = Toy(data)
    ema = ExponentialMovingAverage(decay=0.7)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path,
                        callbacks=[ema, PreciseBatchNorm(num_batches=4)])
    trainer.fit(model)

    expected, n = None, 0
    for epoch in range(2):
        for w in model.trained[epoch * 4:(epoch + 1) * 4]:
            expected = w if expected is None else ema_decay(0.7, n) * expected + (1 - ema_decay(0.7, n)) * w
            n += 1
        seen_w, seen_b, seen_mean = model.seen[epoch]
        torch.testing.assert_close(seen_w, expected, rtol=1e-5, atol=1e-6)
        last = model.trained[(epoch + 1) * 4 - 1]
        assert not torch.allclose(seen_w, last, atol=1e-3)  # not the training weights
        # precise batch norm ran after the swap: its running mean (a cumulative average over the four
        # training batches, i.e. over all 32 samples) is that of the averaged layer's outputs
        xs = data.tensors[0]
        torch.testing.assert_close(seen_mean, (xs @ seen_w.t() + seen_b).mean(0), rtol=1e-5, atol=1e-5)
    # after the fit the model holds the average, and so does the checkpoint's state_dict
    torch.testing.assert_close(model.linear.weight.detach(), expected, rtol=1e-5, atol=1e-6)
    path = tmp_path / "final.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    torch.testing.assert_close(ckpt["state_dict"]["linear.weight"], expected, rtol=1e-5, atol=1e-6)
