"""SEW-ResNet structure: shapes for every depth, connect function and stem; encoding; errors."""

from __future__ import annotations

import pytest
import torch

from snntrain.models import SEWResNet, build_model
from snntrain.nn import BaseNeuron
from snntrain.nn.layers import sew_connect


def tiny(**kw) -> SEWResNet:
    args = dict(num_classes=5, in_channels=2, T=2, width=4, backend="torch")
    args.update(kw)
    return SEWResNet(**args)


# SEW-ResNet-18 with ADD in the fast tier; the other networks (seconds each on a CPU) with the slow tests
@pytest.mark.parametrize("depth, blocks, expansion", [(18, 8, 1), pytest.param(34, 16, 1, marks=pytest.mark.slow),
                                                      pytest.param(50, 16, 4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("stem, size", [("cifar", 16), ("imagenet", 32)])
@pytest.mark.parametrize("connect", ["ADD", pytest.param("AND", marks=pytest.mark.slow),
                                     pytest.param("IAND", marks=pytest.mark.slow)])
def test_output_shapes(depth, blocks, expansion, stem, size, connect):
    m = tiny(depth=depth, stem=stem, connect=connect)
    n_blocks = sum(len(s) for s in (m.layer1, m.layer2, m.layer3, m.layer4))
    assert n_blocks == blocks
    assert m.fc.in_features == 4 * 8 * expansion
    x = torch.randn(3, 2, size, size)
    feats = m.forward_features(x)
    stride0 = 1 if stem == "cifar" else 4
    for i, f in enumerate(feats):
        s = size // stride0 // 2**i
        assert f.shape == (2, 3, 4 * 2**i * expansion, s, s)
    y = m(x)
    assert y.shape == (3, 5)
    y.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_temporal_input_used_as_is():
    m = tiny(T=2)
    x = torch.randn(5, 3, 2, 16, 16)  # T=5 event-like input, not the model's T
    feats = m.forward_features(x)
    assert feats[0].shape[:2] == (5, 3)
    assert m(x).shape == (3, 5)


def test_direct_encoding_equals_repeated_input():
    torch.manual_seed(0)
    m = tiny(T=3).eval()
    x = torch.randn(2, 2, 16, 16)
    assert torch.allclose(m(x), m(x.unsqueeze(0).repeat(3, 1, 1, 1, 1)), atol=1e-5)


def test_sew_connect_functions():
    a = torch.tensor([0.0, 0.0, 1.0, 1.0])
    s = torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert sew_connect(a, s, "ADD").tolist() == [0, 1, 1, 2]
    assert sew_connect(a, s, "AND").tolist() == [0, 0, 0, 1]
    assert sew_connect(a, s, "IAND").tolist() == [0, 1, 0, 0]


def test_neuron_settings_reach_every_neuron():
    m = tiny(neuron={"type": "PLIF", "init_tau": 3.0, "surrogate": "sigmoid", "v_reset": None})
    neurons = [n for n in m.modules() if isinstance(n, BaseNeuron)]
    assert len(neurons) == 1 + 16 + 3  # stem, two per basic block, three downsample shortcuts
    assert all(n.params.kind == "plif" and n.params.v_reset is None for n in neurons)
    assert all(abs(n.tau - 3.0) < 1e-5 for n in neurons)


def test_state_dict_keys_do_not_depend_on_backend():
    keys = {b: list(tiny(backend=b, neuron={"type": "PLIF"}).state_dict()) for b in ("torch", "triton", "auto")}
    assert keys["torch"] == keys["triton"] == keys["auto"]


def test_zero_init_residual():
    m = tiny(zero_init_residual=True)
    assert torch.count_nonzero(m.layer1[0].sn2.norm.weight) == 0


def test_build_model_from_config():
    m = build_model({"name": "sew_resnet", "depth": 18, "num_classes": 3, "in_channels": 1, "T": 2, "width": 4},
                    backend="torch")
    assert isinstance(m, SEWResNet) and m.fc.out_features == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"depth": 20}, "depth=20 is not valid; choose one of 18, 34, 50"),
        ({"stem": "tiny"}, "stem='tiny' is not valid; choose one of cifar, imagenet"),
        ({"connect": "OR"}, "connect='OR' is not valid; choose one of ADD, AND, IAND"),
        ({"T": 0}, "T=0 must be a positive integer"),
        ({"norm": "groupnorm"}, "norm='groupnorm' is not valid"),
        ({"neuron": {"type": "LIF", "tau": 0.5}}, "tau=0.5 must be > 1"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kwargs)


def test_bad_model_name_and_input():
    with pytest.raises(ValueError, match="model name='resnet' is not valid; choose one of sew_resnet"):
        build_model({"name": "resnet"})
    with pytest.raises(ValueError, match="model.layers is not a setting of model=sew_resnet"):
        build_model({"name": "sew_resnet", "layers": 3})
    with pytest.raises(ValueError, match="model.dept is not a setting of model=sew_resnet; did you mean model.depth"):
        build_model({"name": "sew_resnet", "dept": 18})
    with pytest.raises(ValueError, match=r"expected \[B, C, H, W\] or \[T, B, C, H, W\]"):
        tiny()(torch.randn(2, 16, 16))


@pytest.mark.parametrize("neuron,depth", [("LIF", 18), ("PLIF", 50)])
def test_checkpoints_in_the_unfused_naming_still_load(neuron, depth):
    """State dicts written before norm and neuron became one NormNeuron (``stem.1.*``,
    ``layerI.J.convK.1.*``, ``downsample.0.1.*``, PLIF's ``snK.w``) load into today's model."""
    import re

    from snntrain.models import SEWResNet

    torch.manual_seed(0)
    cfg = dict(depth=depth, num_classes=3, in_channels=1, T=2, width=4, neuron={"type": neuron}, backend="torch")
    src = SEWResNet(**cfg)
    for m in src.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(m.weight)
            m.running_mean.uniform_()
    old_names = [(r"^sn1\.norm\.(.+)$", r"stem.1.\1"), (r"^(.+\.)sn(\d)\.norm\.(.+)$", r"\1conv\2.1.\3"),
                 (r"^(.+\.)downsample\.1\.norm\.(.+)$", r"\1downsample.0.1.\2"),
                 (r"^((?:.+\.)?(?:sn\d|downsample\.1))\.neuron\.w$", r"\1.w")]
    old = {}
    for key, value in src.state_dict().items():
        for pattern, repl in old_names:
            key, n = re.subn(pattern, repl, key)
            if n:
                break
        old["model." + key] = value
    assert "model.stem.1.weight" in old and "model.layer1.0.conv1.1.running_var" in old
    wrapper = torch.nn.Module()
    wrapper.model = SEWResNet(**cfg)
    wrapper.load_state_dict(old)  # strict
    for key, value in src.state_dict().items():
        assert torch.equal(wrapper.model.state_dict()[key], value), key


def test_multistep_convolution_on_the_cpu_gets_the_weight_gradient_of_channels_last_maps():
    """PyTorch's CPU convolution returns a wrong (and changing) weight gradient for a strided 1x1 convolution of 4
    channels on channels-last input (spikes laid out from tokens, as QKFormer's second embedding reads them):
    MultiStep hands it contiguous maps, so every call gives the float64 reference."""
    from snntrain.nn import MultiStep

    torch.manual_seed(0)
    conv = MultiStep(torch.nn.Conv2d(4, 8, 1, stride=2, bias=False))
    x = (torch.rand(2, 3, 16, 16, 4) > 0.7).float().permute(0, 1, 4, 2, 3)  # [T, B, C, H, W], channels innermost
    g = torch.randn(2, 3, 8, 8, 8)
    ref = torch.nn.grad.conv2d_weight(x.flatten(0, 1).double().contiguous(), conv[0].weight.shape,
                                      g.flatten(0, 1).double(), stride=2)
    for _ in range(20):
        conv.zero_grad()
        conv(x).backward(g)
        torch.testing.assert_close(conv[0].weight.grad.double(), ref, rtol=1e-5, atol=1e-5)
