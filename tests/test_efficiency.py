"""The efficiency report: synaptic operations against hand-computed counts and NeuroBench's own counters,
the Triton counting kernel against the PyTorch reference, energy arithmetic, and the report end to end
(validation logs, task=report, the model card)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _testing import DEVICE
from snntrain import efficiency as E
from snntrain.efficiency import counter as counting
from snntrain.kernels.synops import count_synops
from snntrain.models import SpikingFCOS, sew_resnet18
from snntrain.models.common import DEFAULT_NEURON, LayerFactory
from snntrain.models.detector import FCOSHead
from snntrain.nn.layers import MultiStep, sew_connect


def definition(layer: nn.Module, x: torch.Tensor, dense: bool = False) -> int:
    """NeuroBench's definition: the sum of the layer's output with input and weights binarised (all ones for
    dense), without the bias."""
    xb = torch.ones_like(x, dtype=torch.float64) if dense else (x != 0).double()
    wb = torch.ones_like(layer.weight, dtype=torch.float64) if dense else (layer.weight != 0).double()
    y = F.linear(xb, wb) if isinstance(layer, nn.Linear) else layer._conv_forward(xb, wb, None)
    return int(y.sum())


def kernel_counts(layer: nn.Module, x: torch.Tensor) -> list[int]:
    """The Triton kernel's counts, run where kernel tests run (CUDA when present, else the interpreter)."""
    geo = E.geometry(layer, x.shape)
    fan = E.fanout_map(E.weight_fanin(layer), geo, x.shape[geo.channel_dim + 1:] if geo.spatial_dims else ())
    out = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    count_synops(x.to(DEVICE), fan, out, block_dims=x.dim() - geo.channel_dim)
    return out.tolist()


def both_counts(layer: nn.Module, x: torch.Tensor) -> list[int]:
    """[effective ops, nonzero inputs, inputs outside {-1, 0, 1}] from the reference, checked against the kernel."""
    ref = E.count_reference(x, E.weight_fanin(layer), E.geometry(layer, x.shape)).tolist()
    assert kernel_counts(layer, x) == ref
    return ref


def conv(cin: int, cout: int, k, **kw) -> nn.Conv2d:
    layer = nn.Conv2d(cin, cout, k, bias=False, **kw)
    nn.init.constant_(layer.weight, 0.5)
    return layer


# ----------------------------------------------------------------------------- hand-computed counts


def test_conv_3x3_padding_hand_counts():
    layer = conv(1, 1, 3, padding=1)
    # 3 x 3 input, 3 x 3 kernel, zero padding 1: a corner element is read by 4 outputs, an edge by 6, the centre by 9
    x = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1]]).view(1, 1, 3, 3)
    assert both_counts(layer, x) == [4 + 9 + 4, 3, 0]
    assert E.geometry(layer, x.shape).dense_per_frame == 4 * 4 + 4 * 6 + 9 == 49
    x[0, 0, 0, 1] = 2.0  # a SEW ADD-style value: the call's operations become MACs
    assert both_counts(layer, x) == [4 + 9 + 4 + 6, 4, 1]
    x[0, 0, 0, 1] = -1.0  # -1 counts as binary, as in NeuroBench
    assert both_counts(layer, x)[2] == 0


def test_conv_stride_hand_counts():
    layer = conv(1, 1, 3, stride=2, padding=1)
    # 4 x 4 input -> 2 x 2 output; output row o reads input rows 2o-1 .. 2o+1: rows 0..3 are read 1, 2, 1, 1 times
    x = torch.zeros(1, 1, 4, 4)
    x[0, 0, 1, 1] = 1.0  # 2 x 2
    x[0, 0, 3, 0] = 1.0  # 1 x 1
    x[0, 0, 2, 1] = 1.0  # 1 x 2
    assert both_counts(layer, x) == [4 + 1 + 2, 3, 0]
    assert E.geometry(layer, x.shape).dense_per_frame == (1 + 2 + 1 + 1) ** 2 == 25


def test_conv_1x1_stride_skips_unread_positions():
    layer = conv(2, 3, 1, stride=2)  # a downsample: odd rows and columns are never read
    x = torch.ones(1, 2, 3, 3)
    assert both_counts(layer, x) == [2 * 4 * 3, 18, 0]  # 4 read positions per channel, 3 outputs each


def test_groups_and_zero_weights_hand_counts():
    layer = conv(4, 2, 1, groups=2)  # input channels 0, 1 feed output 0; 2, 3 feed output 1
    x = torch.ones(2, 4, 2, 2)
    assert both_counts(layer, x)[0] == 2 * 4 * 4 * 1
    with torch.no_grad():
        layer.weight[1] = 0  # output 1's weights pruned: channels 2 and 3 reach nothing
    assert both_counts(layer, x)[0] == 2 * 2 * 4 * 1
    wide = conv(2, 6, 3, padding=1, groups=2)  # each input channel feeds 3 outputs
    with torch.no_grad():
        wide.weight[0, 0, 1, 1] = 0  # output 0 ignores the centre tap of channel 0
    x = torch.zeros(1, 2, 3, 3)
    x[0, 0, 1, 1] = 1.0  # centre of channel 0: 9 taps x 3 outputs, one weight zero
    x[0, 1, 0, 0] = 1.0  # corner of channel 1: 4 taps x 3 outputs
    assert both_counts(wide, x)[0] == 27 - 1 + 12


def test_dilation_and_same_padding_hand_counts():
    layer = conv(1, 1, 3, padding="same", dilation=2)  # padding 2 on each side
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 0, 0] = 1.0  # taps reach rows/cols 0, 2, 4 from outputs 0..4: row 0 is read by outputs 0 and 2
    assert both_counts(layer, x)[0] == 2 * 2
    x[0, 0, 2, 2] = 1.0  # the centre: outputs 0, 2, 4 in each dim
    assert both_counts(layer, x)[0] == 4 + 9


def test_linear_on_time_major_input():
    layer = nn.Linear(3, 2, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0, 2.0], [1.0, 1.0, 0.0]]))  # fan-outs 2, 1, 1
    x = torch.tensor([[[1.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]])  # [T=2, B=1, 3]
    assert both_counts(layer, x) == [2 + 1 + 1, 3, 0]
    x[0, 0, 0] = 0.25  # an average-pooled rate: MACs
    assert both_counts(layer, x) == [4, 3, 1]
    geo = E.geometry(layer, x.shape)
    assert geo.frames == 2 and geo.dense_per_frame == 6


@pytest.mark.parametrize("connect, ops, binary", [
    # A (block output) and S (shortcut) spike maps below; the conv is 3x3, padding 1, on a 3 x 3 map
    ("ADD", 4 + 6 + 9 + 6 + 4, False),   # A + S: nonzero at (0,0), (0,1), (1,1), (2,1), (2,2); (1,1) is 2
    ("AND", 9, True),                    # A * S: only (1,1)
    ("IAND", 6 + 6 + 4, True),           # (1 - A) * S: (0,1), (2,1), (2,2)
])
def test_sew_connections_hand_counts(connect, ops, binary):
    a = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 0]])
    s = torch.tensor([[0.0, 1, 0], [0, 1, 0], [0, 1, 1]])
    x = sew_connect(a, s, connect).view(1, 1, 1, 3, 3)  # [T, B, C, H, W]
    model = MultiStep(conv(1, 2, 3, padding=1))  # two output channels: every count doubles
    counter = E.ActivityCounter(model, backend="torch").attach()
    with torch.no_grad():
        model(x)
    counter.detach()
    totals = counter.unpack(counter.totals())
    layer = totals["connections"]["0"]
    assert (layer["ac"], layer["mac"]) == ((2 * ops, 0) if binary else (0, 2 * ops))
    assert layer["dense"] == 2 * 49 and totals["samples"] == 1
    report = E.build_report(totals)
    assert report["layers"][0]["binary_input_calls"] == (1.0 if binary else 0.0)


class SpikesIntoConv(nn.Module):
    def __init__(self, scale_in_place: bool) -> None:
        super().__init__()
        from snntrain.nn import LIF, NormNeuron

        self.sn = NormNeuron(nn.BatchNorm2d(1), LIF(tau=2.0), backend="torch")
        self.conv = MultiStep(conv(1, 1, 3, padding=1))
        self.scale_in_place = scale_in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.sn(x)
        if self.scale_in_place:
            s.mul_(2.0)  # no longer spikes: the count must see the values the convolution reads
        return self.conv(s)


@pytest.mark.parametrize("scale_in_place", [False, True])
def test_spiking_outputs_changed_in_place_are_counted_as_read(scale_in_place):
    x = torch.tensor([0.0, 3.0, 0.0, 3.0, 3.0, 0.0]).view(1, 1, 1, 2, 3).expand(2, 1, 1, 2, 3).contiguous()
    model = SpikesIntoConv(scale_in_place).eval()
    counter = E.ActivityCounter(model, backend="torch").attach()
    with torch.no_grad():
        model(x)
    counter.detach()
    layer = counter.unpack(counter.totals())["connections"]["conv.0"]
    spikes = (model.sn(x) != 0).flatten(0, 1)
    expected = definition(model.conv[0], spikes.float())
    assert expected > 0
    assert (layer["ac"], layer["mac"]) == ((0, expected) if scale_in_place else (expected, 0))


def test_detector_head_hand_counts():
    f = LayerFactory(DEFAULT_NEURON, "batchnorm", "torch")
    head = FCOSHead(channels=2, num_classes=1, num_convs=0, num_levels=2, readout="membrane", f=f).eval()
    # no towers: cls_logits (1 output), box_ltrb (4) and centerness (1) read the feature maps directly, so every
    # nonzero element costs (1 + 4 + 1) x (taps reaching it) operations; a 3x3 padding-1 conv reaches rows 0..3 of
    # a 4-row map 2, 3, 3, 2 times and rows of a 2-row map 2, 2 times
    p1 = torch.zeros(1, 1, 2, 4, 4)
    p1[0, 0, 0, 0, 0] = p1[0, 0, 1, 1, 2] = p1[0, 0, 1, 3, 3] = 1.0  # 2x2, 3x3, 2x2
    p2 = torch.zeros(1, 1, 2, 2, 2)
    p2[0, 0, 0, 1, 0] = 2.0  # not binary: this level's calls are MACs; 2x2
    counter = E.ActivityCounter(head, backend="torch").attach()
    with torch.no_grad():
        head([p1, p2], [8, 16])
    counter.detach()
    layers = counter.unpack(counter.totals())["connections"]
    level1, level2 = 4 + 9 + 4, 4
    for name, outputs in (("cls_logits.0", 1), ("box_ltrb.0", 4), ("centerness.0", 1)):
        assert layers[name]["calls"] == 2 and layers[name]["nonbinary_calls"] == 1
        assert layers[name]["ac"] == outputs * level1
        assert layers[name]["mac"] == outputs * level2
        assert layers[name]["dense"] == outputs * 2 * ((2 + 3 + 3 + 2) ** 2 + (2 + 2) ** 2)


# ----------------------------------------------------------------------------- kernel against the reference


CASES = [
    (lambda: nn.Conv2d(3, 5, 3, padding=1), (2, 3, 7, 5)),
    (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (3, 4, 9, 6)),
    (lambda: nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(0, 1), dilation=(2, 1)), (2, 3, 11, 7)),
    (lambda: nn.Conv2d(3, 4, 7, stride=2, padding=3), (2, 3, 13, 11)),
    (lambda: nn.Conv2d(5, 3, 1, stride=2), (3, 5, 5, 7)),
    (lambda: nn.Conv2d(2, 3, 3, padding="same", dilation=2), (2, 2, 6, 5)),
    (lambda: nn.Linear(7, 3), (2, 5, 7)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_matches_reference_and_definition(case, dtype, device):
    make, shape = CASES[case]
    gen = torch.Generator().manual_seed(case)
    layer = make().to(device)
    with torch.no_grad():
        layer.weight.masked_fill_(torch.rand(layer.weight.shape, generator=gen).to(device) < 0.2, 0.0)
    values = torch.tensor([0.0, 0.0, 0.0, 1.0, -1.0, 2.0, 0.5])
    x = values[torch.randint(0, len(values), shape, generator=gen)].to(device, dtype)
    layouts = [x]
    if x.dim() == 4:
        layouts += [x.contiguous(memory_format=torch.channels_last), x[:, :, :, 1:]]  # NHWC; a strided view
    for xx in layouts:
        ref = E.count_reference(xx, E.weight_fanin(layer), E.geometry(layer, xx.shape)).tolist()
        assert ref[0] == definition(layer, xx.float())
        assert ref[1] == int((xx != 0).sum()) and ref[2] == int(((xx != 0) & (xx.abs() != 1)).sum())
        assert kernel_counts(layer, xx) == ref
        assert E.geometry(layer, xx.shape).dense_per_frame * E.geometry(layer, xx.shape).frames == \
            definition(layer, xx.float(), dense=True)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fanout_block_is_the_fanout_map_in_memory_order(case):
    """The fan-out the kernel reads, built by one product with the shape's tap-reach matrix, equals the
    reference map laid out in memory order: channels-first, channels-last, a strided view (counted from a
    copy), 1x1 maps and a single channel."""
    from snntrain.kernels import synops

    make, shape = CASES[case]
    gen = torch.Generator().manual_seed(case)
    layer = make()
    with torch.no_grad():
        layer.weight.masked_fill_(torch.rand(layer.weight.shape, generator=gen) < 0.3, 0.0)
    x = torch.rand(shape, generator=gen)
    layouts = [x]
    if x.dim() == 4:
        layouts += [x.contiguous(memory_format=torch.channels_last), x[:, :, :, 1:], x[:, :, :1, :1],
                    x[:, :, :1, :1].contiguous(memory_format=torch.channels_last),
                    x[:, :1].contiguous(memory_format=torch.channels_last)]
    m = E.weight_fanin(layer)
    for xx in layouts:
        if xx.shape[1] != x.shape[1]:  # one input channel: a layer made for it
            layer1 = nn.Conv2d(1, 3, 3, stride=2, padding=1)
            m1, geo = E.weight_fanin(layer1), E.geometry(layer1, xx.shape)
        else:
            m1, geo = m, E.geometry(layer, xx.shape)
        if any(o < 1 for o in geo.out_size):
            continue
        frame = xx.shape[geo.channel_dim + 1:] if geo.spatial_dims else ()
        p = synops.plan(tuple(xx.shape), xx.stride(), xx.dim() - geo.channel_dim)
        block = E.fanout_block(m1, geo, p)
        assert block.dtype == torch.int32
        assert block.tolist() == synops.fan_block(E.fanout_map(m1, geo, frame), p).tolist(), (tuple(xx.shape), xx.stride())


def test_kernel_64_bit_offsets(device):
    from snntrain.kernels import synops

    layer = nn.Conv2d(3, 4, 3, padding=1).to(device)
    x = ((torch.rand(2, 3, 5, 6) < 0.5).float() * 2).to(device)
    geo, m = E.geometry(layer, x.shape), E.weight_fanin(layer)
    p = synops.plan(tuple(x.shape), x.stride(), 3, device=x.device)
    assert not p.int64  # 64-bit offsets only past 2**31 elements: forced here
    p = dataclasses.replace(p, int64=True)
    out = torch.zeros(3, dtype=torch.int64, device=device)
    synops.launch(p, x, synops.fan_block(E.fanout_map(m, geo, x.shape[2:]), p), out)
    assert out.tolist() == E.count_reference(x, m, geo).tolist()


@pytest.mark.parametrize("shape", [(2, 3, 4, 5, 6), (2, 2, 3, 4, 4), (3, 7), (2, 2, 5, 1, 3)])
def test_channel_sums_kernel_in_every_layout(shape, device):
    """Spikes per channel ([T, B, C, ...] or [T, N]) from the kernel equal torch's sums, for contiguous,
    channels-last and strided inputs, added over calls into the same row."""
    from snntrain.kernels import synops

    s = (torch.rand(shape, generator=torch.Generator().manual_seed(len(shape))) < 0.3).float().to(device)
    layouts = [s]
    if s.dim() == 5:
        cl = s.flatten(0, 1).contiguous(memory_format=torch.channels_last).view(s.shape)  # as NormNeuron gives
        layouts += [cl, s[..., 1:]]
    cdim = 2 if s.dim() >= 3 else 1
    for x in layouts:
        out = torch.zeros(x.shape[cdim], dtype=torch.float32, device=device)
        p = synops.plan(tuple(x.shape), x.stride(), x.dim() - cdim, device=x.device, sums=True)
        for _ in range(2):
            synops.launch_channel_sums(p, x, synops.channel_block(p, device), out)
        expected = 2 * x.sum(dim=[d for d in range(x.dim()) if d != cdim])
        assert out.tolist() == expected.tolist()


def test_reference_covers_conv1d_and_conv3d():
    for layer, shape in ((nn.Conv1d(3, 4, 3, padding=1, stride=2), (3, 3, 11)),
                         (nn.Conv3d(2, 3, 3, padding=1), (2, 2, 5, 4, 3))):
        x = (torch.rand(shape) < 0.4).float()
        geo = E.geometry(layer, shape)
        assert E.count_reference(x, E.weight_fanin(layer), geo)[0] == definition(layer, x)
        assert geo.dense_per_frame * geo.frames == definition(layer, x, dense=True)


def test_unsupported_layers_and_inputs_are_named():
    with pytest.raises(ValueError, match="padding_mode='reflect' cannot be counted"):
        E.geometry(nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"), (1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"Conv2d input has shape \(1, 4, 4\)"):
        E.geometry(nn.Conv2d(1, 1, 3), (1, 4, 4))
    with pytest.raises(ValueError, match=r"Linear\(3, 2\) got input of shape \(4,\)"):
        E.geometry(nn.Linear(3, 2), (4,))
    with pytest.raises(ValueError, match="out must be a contiguous int64"):
        count_synops(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 2, dtype=torch.int32), torch.zeros(3), block_dims=3)
    out = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="fan must hold integers"):
        count_synops(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 2), out, block_dims=3)
    with pytest.raises(ValueError, match=r"fan-out of shape \(1, 2, 3\) for frames of shape \(1, 2, 2\)"):
        count_synops(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 3, dtype=torch.int32), out, block_dims=3)
    with pytest.raises(ValueError, match="block_dims=5 must be between 1 and the input's 4 dims"):
        count_synops(torch.ones(1, 1, 2, 2), torch.ones(1, 2, 2, dtype=torch.int32), out, block_dims=5)


# ----------------------------------------------------------------------------- whole models


def sew(connect: str, threshold: float = 0.4) -> nn.Module:
    torch.manual_seed(0)
    neuron = {**DEFAULT_NEURON, "v_threshold": threshold}
    return sew_resnet18(num_classes=10, in_channels=1, T=2, width=4, connect=connect, neuron=neuron,
                        backend="torch").eval()


def counted(net: nn.Module, batches, backend: str = "torch") -> dict:
    counter = E.ActivityCounter(net, backend=backend).attach()
    with torch.inference_mode():  # as in validation
        for x in batches:
            net(x)
    counter.detach()
    return E.build_report(counter.unpack(counter.totals()), E.static_metrics(net))


@pytest.mark.slow  # the Triton interpreter over a network on a CPU
@pytest.mark.parametrize("net_backend", ["torch", "triton"])
def test_triton_counting_matches_reference_on_a_network(net_backend, device, monkeypatch):
    """The counting kernels against the PyTorch reference on one network's validation. With the network on the
    Triton backend its fused batch-norm kernels count the spikes as they fire them: no spike is read again."""
    from snntrain.kernels import synops
    from snntrain.nn import set_backend

    net = sew("ADD").to(device)
    set_backend(net, net_backend)
    batches = [torch.randn(3, 1, 12, 12, generator=torch.Generator().manual_seed(i)).to(device) for i in range(2)]
    ref = counted(net, batches, "torch")
    reads = []
    launch = synops.launch_channel_sums
    monkeypatch.setattr(synops, "launch_channel_sums", lambda *a: (reads.append(1), launch(*a)))
    kern = counted(net, batches, "triton")
    assert ref["workload"] == kern["workload"] and ref["layers"] == kern["layers"]
    assert ref["workload"]["ActivationSparsity"] < 1
    assert len(reads) == (0 if net_backend == "triton" else 2 * len(E.spiking_layers(net)))  # 2 batches
    # detached, the layers are as they were (a compiled training step guards on nothing the counter left)
    assert not any("activity" in vars(m) for m in net.modules())


@pytest.mark.parametrize("rows", [64, 2])
def test_one_counter_over_many_validations_counts_each_from_zero(rows, monkeypatch):
    """A counter keeps its device buffers over attaches (as the monitor does over validations): each validation
    is counted from zero, also after one that ended without its totals, and also when the per-call rows fill up
    and are folded mid-validation (``rows=2``)."""
    monkeypatch.setattr(counting, "ROWS", rows)  # the counter module's buffer length
    net = sew("ADD")
    a = [torch.randn(3, 1, 12, 12, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    b = [torch.randn(2, 1, 12, 12, generator=torch.Generator().manual_seed(10 + i)) for i in range(2)]
    counter = E.ActivityCounter(net, backend="torch")

    def validation(batches, totals=True):
        counter.attach()
        with torch.inference_mode():
            for x in batches:
                net(x)
        counter.detach()
        return E.build_report(counter.unpack(counter.totals()), E.static_metrics(net)) if totals else None

    first = validation(a)
    validation(b, totals=False)  # interrupted: its counts are left in the buffers
    second = validation(b)
    assert first == counted(net, a) and second == counted(net, b) and first != second


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_layer_called_with_many_input_shapes_counts_them_all(backend, device, monkeypatch):
    """Each kind of call (input shape, batch) keeps its own host sums, and batches of another size read the same
    fan-out; a layer that sees more kinds than it keeps (as multi-scale inference would) adds up the ones it lets
    go: the same report either way, by the kernels and by the reference."""
    net = sew("ADD").to(device)
    gen = torch.Generator().manual_seed(5)
    batches = [torch.randn(b, 1, size, size, generator=gen).to(device)
               for b, size in [(2, 12), (3, 12), (2, 16), (1, 8), (2, 12)]]
    full = counted(net, batches)
    assert counted(net, batches, backend) == full
    monkeypatch.setattr(counting._Connection, "MAX_CALLS", 2)
    assert counted(net, batches, backend) == full
    assert full["samples"] == 10 and full["layers"][0]["calls_per_pass"] == 1


def test_sew_resnet_report_structure():
    net = sew("ADD")
    x = torch.randn(5, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    report = counted(net, [x[:3], x[3:]])
    w = report["workload"]
    assert report["samples"] == 5 and report["T"] == 2
    conns = [lay for lay in report["layers"] if lay["kind"] == "connection"]
    assert [lay["name"] for lay in conns][:2] == ["stem.0", "layer1.0.conv1.0"]  # execution order
    assert conns[0]["Effective_MACs"] > 0 and conns[0]["Effective_ACs"] == 0  # the image: MACs
    assert conns[1]["Effective_ACs"] > 0 and conns[1]["Effective_MACs"] == 0  # stem spikes: ACs
    assert w["SynapticOperations"]["Effective_ACs"] == pytest.approx(sum(c["Effective_ACs"] for c in conns))
    assert w["SynapticOperations_per_time_step"]["Dense"] == w["SynapticOperations"]["Dense"] / 2
    # the static image enters the stem once per sample: the ANN runs every layer once, the SNN T times
    stem_dense = conns[0]["Dense"]
    assert report["ann"]["MACs"] == pytest.approx((w["SynapticOperations"]["Dense"] - stem_dense) / 2 + stem_dense)
    assert 0 < w["firing_rate"] < 1 and w["ActivationSparsity"] == pytest.approx(1 - w["firing_rate"])
    md = E.markdown(report)
    assert "Effective_ACs" in md and "layer1.0.sn1" in md and "compute+memory" in md and "in batches of 3" in md
    assert E.layer_chart(report).shape[2] == 3


def _unit_paths(value, path=""):
    """The path of every number in a report, as :data:`snntrain.efficiency.UNITS` names them."""
    if isinstance(value, dict):
        for key, v in value.items():
            yield from _unit_paths(v, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for v in value:
            yield from _unit_paths(v, f"{path}[]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path


def test_report_says_its_units_and_basis():
    # a reader of report.json learns what every number is per (sample, time step), and the batch size and samples
    net = sew("ADD")
    x = torch.randn(5, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    report = counted(net, [x[:3], x[3:]])
    basis = report["basis"]
    assert (basis["T"], basis["samples"], basis["batch_size"], basis["forward_passes"], basis["processes"]) == \
        (2, 5, 3, 2, 1)
    assert "per sample divided by T" in basis["per_time_step"] and "over all T time steps" in basis["per_sample"]
    units = report["units"]
    for path in _unit_paths({k: v for k, v in report.items() if k != "units"}):
        if path in ("basis.T", "basis.samples"):
            path = path.split(".")[1]
        section = path.rsplit(".", 1)[0] + ".*"
        assert path in units or section in units, f"{path} has no unit in the report"
    assert units["energy[].snn_uJ"] == "microjoules per sample" and units["static.Footprint"].startswith("bytes")
    assert "per time step" in units["workload.SynapticOperations_per_time_step.*"]
    # the counts themselves are those the report had before it said its units
    assert report["workload"]["SynapticOperations"]["Dense"] == pytest.approx(
        sum(lay["Dense"] for lay in report["layers"] if lay["kind"] == "connection"))


def test_chart_has_axes_and_values():
    """The per-layer chart draws each bar on an axis whose end is a round number above the largest value, with
    the tick values written under it, and each layer's value at the end of its row."""
    import numpy as np

    from snntrain.efficiency import chart

    x = torch.randn(2, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    report = counted(sew("ADD"), [x])
    img = E.chart_indices(report)
    lay_out = chart._layout(img.shape[1], len(report["layers"]), {"connection", "spiking"})
    start, span, top = lay_out["start"], lay_out["span"], lay_out["top"]
    black = chart.CHART_PALETTE.index((0, 0, 0))

    def written(x0: int, y: int, text: str, right: bool = False) -> bool:
        ink = np.concatenate([chart._glyph(c) for c in text], axis=1)
        x0 = x0 - ink.shape[1] if right else x0
        return bool((img[y: y + ink.shape[0], x0: x0 + ink.shape[1]][ink] == black).all())

    layers = report["layers"]
    ops_end = chart._nice(max(lay["Dense"] for lay in layers if lay["kind"] == "connection"))
    rate_end = chart._nice(max(lay["firing_rate"] for lay in layers if lay["kind"] == "spiking"))
    assert ops_end >= max(lay["Dense"] for lay in layers if "Dense" in lay) and str(ops_end)[0] in "125"
    dense = chart.CHART_PALETTE.index((215, 215, 215))
    for i, lay in enumerate(layers):
        y = top + i * chart._ROW
        if lay["kind"] == "connection":
            # the grey bar (dense operations) ends where its value lies on the axis; its value ends the row
            covered = np.isin(img[y + 5, start:start + span + 1], [dense, 3, 4])
            assert covered.sum() == round(span * lay["Dense"] / ops_end), lay["name"]
            text = f"{E.report._si(lay['Effective_ACs'] + lay['Effective_MACs'])} / {E.report._si(lay['Dense'])}"
        else:
            text = f"{lay['firing_rate']:.3f}"
        assert written(lay_out["value_x"], y, text, right=True), lay["name"]
    for kind, end, name in (("connection", ops_end, chart.OPS_AXIS), ("spiking", rate_end, chart.RATE_AXIS)):
        y = lay_out["axes"][kind]
        assert (img[y, start:start + span] == black).all()  # the axis line
        label = E.report._si(end) if kind == "connection" else f"{end:.3g}"
        assert written(start + span + 1, y + 3, label, right=True) and written(start, y + 3, "0")
        assert written(start, y + 4 + chart._ROW, name)


def test_energy_arithmetic():
    totals = {"samples": 2, "passes": 1, "order": ["c", "s"],
              "connections": {"c": {"type": "Conv2d", "ac": 2000.0, "mac": 200.0, "nonzero": 40.0, "numel": 100.0,
                                    "dense": 10000.0, "ann_dense": 5000.0, "ann_inputs": 60.0, "calls": 1,
                                    "nonbinary_calls": 0, "frames": 4}},
              "spiking": {"s": {"type": "LIF", "channel_spikes": torch.tensor([10.0]), "spikes": 10.0,
                                "neuron_steps": 100.0, "ann_activations": 50.0, "steps": 2, "calls": 1}}}
    r = E.build_report(totals)
    compute, memory = r["energy"]
    # per sample: 1000 ACs, 100 MACs, 20 nonzero inputs, 50 neuron-steps, 5 spikes; ANN: 2500 MACs, 30 inputs,
    # 25 activations
    assert compute["snn_uJ"] == pytest.approx((1000 * 0.9 + 100 * 4.6) * 1e-6)
    assert compute["ann_uJ"] == pytest.approx(2500 * 4.6 * 1e-6)
    assert memory["snn_uJ"] == pytest.approx((1000 * 15.9 + 100 * 19.6 + 20 * 5 + 50 * 19.6 + 5 * 5) * 1e-6)
    assert memory["ann_uJ"] == pytest.approx((2500 * 19.6 + 30 * 5 + 25 * 10) * 1e-6)
    assert compute["ann_over_snn"] == pytest.approx(compute["ann_uJ"] / compute["snn_uJ"])
    assert r["workload"]["ActivationSparsity"] == pytest.approx(0.9)
    assert r["layers"][0]["input_sparsity"] == pytest.approx(0.6)


def test_static_metrics():
    layer = nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        layer[0].weight[0] = 0
    s = E.static_metrics(layer)
    assert s["ParameterCount"] == 4 + 2 + 2 + 2 + 8
    assert s["Footprint"] == 4 * (4 + 2 + 2 + 2 + 8 + 2 + 2) + 8  # + running mean/var, num_batches_tracked int64
    assert s["ConnectionSparsity"] == pytest.approx(2 / 12)
    # the counter's weight counts (read at each layer's first call) give the same, without a second read
    net = sew("ADD")
    with torch.no_grad():
        net.get_submodule("layer1.0.conv1.0").weight[:2] = 0
    counter = E.ActivityCounter(net, backend="torch").attach()
    with torch.inference_mode():
        net(torch.randn(2, 1, 12, 12))
    counter.detach()
    assert counter.static_metrics() == E.static_metrics(net) and E.static_metrics(net)["ConnectionSparsity"] > 0


# ----------------------------------------------------------------------------- NeuroBench's own counters


def neurobench_run(net: nn.Module, batches) -> dict:
    pytest.importorskip("neurobench")
    from neurobench.benchmarks import Benchmark
    from neurobench.metrics.static import ConnectionSparsity, Footprint, ParameterCount
    from neurobench.metrics.workload import ActivationSparsity, SynapticOperations
    from neurobench.models import TorchModel
    from torch.utils.data import DataLoader, TensorDataset

    from snntrain.nn import BaseNeuron, NormNeuron

    x = torch.cat(batches)
    loader = DataLoader(TensorDataset(x, torch.zeros(len(x))), batch_size=len(batches[0]))
    model = TorchModel(net)
    model.add_activation_module(NormNeuron)  # our spiking layers; the neuron inside a NormNeuron is not visited
    model.add_activation_module(BaseNeuron)
    bench = Benchmark(model, loader, [], [], [[ParameterCount, Footprint, ConnectionSparsity],
                                              [SynapticOperations, ActivationSparsity]])
    try:
        return bench.run(quiet=True)
    finally:
        model.cleanup_hooks()


def assert_same_as_neurobench(net: nn.Module, batches) -> dict:
    ours = counted(net, batches)  # first: NeuroBench's hooks stay on the network afterwards
    theirs = neurobench_run(net, batches)
    assert ours["workload"]["SynapticOperations"] == theirs["SynapticOperations"]
    assert ours["workload"]["ActivationSparsity"] == pytest.approx(theirs["ActivationSparsity"], rel=1e-12)
    st = ours["static"]
    assert (st["ParameterCount"], st["Footprint"]) == (theirs["ParameterCount"], theirs["Footprint"])
    assert round(st["ConnectionSparsity"], 4) == theirs["ConnectionSparsity"]
    return ours


@pytest.mark.parametrize("connect", ["ADD", "IAND"])
def test_sew_resnet_counts_equal_neurobench(connect):
    net = sew(connect)
    with torch.no_grad():  # pruned weights: both skip them
        net.layer1[0].conv1[0].weight[:, :, 0, 0] = 0
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(4, 1, 12, 12, generator=gen) for _ in range(2)]
    ours = assert_same_as_neurobench(net, batches)
    syn = ours["workload"]["SynapticOperations"]
    assert syn["Effective_ACs"] > 0 and syn["Effective_MACs"] > 0 and ours["static"]["ConnectionSparsity"] > 0


@pytest.mark.parametrize("readout", ["membrane", "rate"])
def test_detector_counts_equal_neurobench(readout):
    torch.manual_seed(0)
    net = SpikingFCOS(T=2, width=4, head={"fpn_channels": 8, "num_convs": 1, "readout": readout,
                                           "fpn_levels": [1, 2, 3]},
                      neuron={**DEFAULT_NEURON, "v_threshold": 0.5}, backend="torch").eval()
    gen = torch.Generator().manual_seed(2)
    ours = assert_same_as_neurobench(net, [torch.randn(2, 3, 32, 32, generator=gen) for _ in range(2)])
    head = {lay["name"]: lay for lay in ours["layers"]}
    assert head["head.cls_logits.0"]["calls_per_pass"] == 3  # the head is shared by the three pyramid levels
    assert head["fpn.output.0.0"]["binary_input_calls"] == 0  # lateral sums: MACs


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_validation_logs_report_and_task_report_and_card(tmp_path, compose_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from snntrain import export as ex
    from snntrain.cli import run
    from snntrain.data import build_datamodule
    from snntrain.export import load_checkpoint

    run(compose_run(tmp_path / "run", "debug=tiny", "logger=tensorboard", "trainer.limit_val_batches=2"))
    ea = EventAccumulator(str(next((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))),
                          size_guidance={"scalars": 0, "images": 0})
    ea.Reload()
    for tag in ("efficiency/Effective_ACs", "efficiency/Effective_MACs", "efficiency/Dense",
                "efficiency/ActivationSparsity", "efficiency/compute_uJ", "efficiency/ann_compute+memory_uJ",
                "firing_rate/mean", "firing_rate/layer4.1.sn2"):
        assert tag in ea.Tags()["scalars"], tag
    assert "efficiency/per_layer" in ea.Tags()["images"]
    ckpt_path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["efficiency"]["samples"] == 64 and ckpt["efficiency"]["global_step"] == 2
    assert not [k for k in ckpt["snntrain"]["metrics"] if k.startswith("efficiency")]

    # task=report over the whole validation split, recounted here with the loaded model
    result = run(compose_run(tmp_path / "rep", "debug=tiny", "task=report", f"ckpt_path={ckpt_path}"))
    saved = json.loads((tmp_path / "rep" / "report" / "report.json").read_text())
    assert saved == json.loads(json.dumps(result)) and saved["task"] == "classify" and "val/acc" in saved["metrics"]
    assert "## Efficiency report: classify, last.ckpt" in (tmp_path / "rep" / "report" / "report.md").read_text()
    # the per-layer chart beside them: the report's own, a PNG a viewer opens
    import numpy as np
    from PIL import Image

    assert saved["chart"] == "report.png"
    with Image.open(tmp_path / "rep" / "report" / "report.png") as png:
        assert (np.asarray(png.convert("RGB")) == E.layer_chart(saved, 760)).all()
    config = ckpt["hyper_parameters"]["config"]
    dm = build_datamodule(config["data"], seed=config["seed"])
    dm.setup("validate")
    net = load_checkpoint(ckpt_path, backend="torch").model
    again = counted(net, [x for x, _ in dm.val_dataloader()])
    assert saved["samples"] == again["samples"] == len(dm.val_dataloader().dataset)
    assert saved["basis"]["batch_size"] == dm.val_dataloader().batch_size and saved["basis"]["processes"] == 1
    assert saved["basis"]["samples"] == saved["samples"] and saved["units"] == E.UNITS
    for path in _unit_paths({k: v for k, v in saved.items() if k != "units"}):
        path = path.removeprefix("basis.") if path in ("basis.T", "basis.samples") else path
        assert path in E.UNITS or path.rsplit(".", 1)[0] + ".*" in E.UNITS, f"{path} of report.json has no unit"
    assert saved["workload"] == again["workload"] and saved["layers"] == again["layers"]

    # the model card carries the checkpoint's report
    card = ex.export_checkpoint(ckpt_path, tmp_path / "export", formats=["safetensors"], backend="torch")
    assert card["efficiency"]["workload"] == ckpt["efficiency"]["workload"]
    assert json.loads((tmp_path / "export" / "model_card.json").read_text())["efficiency"]["T"] == 2
    readme = (tmp_path / "export" / "README.md").read_text()
    assert "## Efficiency (validation at step 2)" in readme and "| compute |" in readme


@pytest.mark.slow
def test_detector_report_task(tmp_path, compose_run):
    from snntrain.cli import run

    run(compose_run(tmp_path / "run", "debug=tiny", "task=detect", "trainer.limit_train_batches=1"))
    result = run(compose_run(tmp_path / "rep", "debug=tiny", "task=report", "report.limit_batches=1",
                             f"report.dir={tmp_path / 'out'}", f"ckpt_path={tmp_path / 'run/checkpoints/last.ckpt'}"))
    assert (tmp_path / "out" / "report.md").exists() and result["model"]["detector_head"] is True
    assert result["samples"] == 2 * 8  # one batch of 8 images, each passed twice (flip test)
    assert {"head.cls_logits.0", "fpn.lateral.0.0"} <= {lay["name"] for lay in result["layers"]}


def test_report_task_errors(tmp_path, compose_run):
    from snntrain.cli import run

    with pytest.raises(ValueError, match="task=report needs ckpt_path"):
        run(compose_run(tmp_path, "debug=tiny", "task=report"))


def test_chart_and_histograms_reach_tensorboard(tmp_path):
    """The monitor's summaries, written without ``add_image``/``add_histogram``: the chart's PNG decodes to
    :func:`layer_chart`'s picture; the histograms, all in one event, each hold every value in the buckets
    ``numpy.histogram`` gives (values on bucket edges included), a constant tensor's values one bucket."""
    import io

    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from snntrain.callbacks import add_histograms, add_png

    report = counted(sew("ADD"), [torch.randn(2, 1, 12, 12, generator=torch.Generator().manual_seed(0))])
    gen = torch.Generator().manual_seed(1)
    tensors = {"rates": torch.rand(37, dtype=torch.float64, generator=gen),
               "edges": torch.arange(15, dtype=torch.float32) / 14,  # many values on bucket edges
               "constant": torch.full((5,), 0.25), "one": torch.tensor([3.0]),
               "counts": torch.randint(0, 9, (4, 6), generator=gen).float()}
    writer = SummaryWriter(str(tmp_path))
    add_png(writer, "chart", *E.chart_png(report), 4)
    add_histograms(writer, tensors, 4, bins=7)
    writer.close()
    with pytest.raises(ValueError, match=r"empty values for histograms \['none'\]"):
        add_histograms(writer, {"none": torch.zeros(0)}, 5)
    ea = EventAccumulator(str(next(tmp_path.glob("events.out.tfevents.*"))),
                          size_guidance={"images": 0, "histograms": 0})
    ea.Reload()
    (image,) = ea.Images("chart")
    assert image.step == 4
    decoded = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)).convert("RGB"))
    assert (decoded == E.layer_chart(report)).all() and (image.height, image.width) == decoded.shape[:2]
    png, height, width = E.chart_png(report, width=331)  # an odd width: the last byte of a row holds one pixel
    odd = Image.open(io.BytesIO(png))
    assert odd.mode == "P" and (height, width) == (odd.height, odd.width) == E.chart_indices(report, 331).shape
    assert (np.asarray(odd.convert("RGB")) == E.layer_chart(report, 331)).all()
    for tag, values in tensors.items():
        (event,) = ea.Histograms(tag)
        h, v = event.histogram_value, values.double().flatten().numpy()
        assert event.step == 4 and h.num == v.size and h.min == v.min() and h.max == v.max(), tag
        assert h.sum == pytest.approx(v.sum()) and h.sum_squares == pytest.approx((v ** 2).sum()), tag
        if v.min() < v.max():
            counts, edges = np.histogram(v, bins=7)
            assert list(h.bucket) == counts.tolist() and h.bucket_limit == pytest.approx(edges[1:].tolist()), tag
        else:
            assert sum(h.bucket) == v.size and max(h.bucket) == v.size, tag
