"""The model families (spiking_vgg, spiking_resnet, ms_resnet, sew_resnet): parameter counts equal to SpikingJelly
2.0.0's constructors of the same names, config composition of every variant, a training step per family, direct
encoding, the backends against each other, and the errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from snntrain.models import (
    MODELS,
    MSResNet,
    SEWResNet,
    SpikingResNet,
    SpikingVGG,
    build_model,
    ms_resnet,
    sew_resnet,
    spiking_resnet,
    spiking_vgg,
)
from snntrain.nn import BaseNeuron, NormNeuron, TemporalDropout, set_backend

FAMILIES = {"spiking_vgg": spiking_vgg, "spiking_resnet": spiking_resnet, "ms_resnet": ms_resnet,
            "sew_resnet": sew_resnet}
VARIANTS = [(family, v) for family, module in FAMILIES.items() for v in module.VARIANTS]


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def spikingjelly_model(family: str, variant: str, **kwargs) -> nn.Module:
    """SpikingJelly 2.0.0's constructor of ``variant`` (its LIF where it needs a neuron class)."""
    from spikingjelly.activation_based import neuron
    from spikingjelly.activation_based.model import ms_resnet as sj_ms
    from spikingjelly.activation_based.model import sew_resnet as sj_sew
    from spikingjelly.activation_based.model import spiking_resnet as sj_resnet
    from spikingjelly.activation_based.model import spiking_vgg as sj_vgg

    module = {"spiking_vgg": sj_vgg, "spiking_resnet": sj_resnet, "ms_resnet": sj_ms, "sew_resnet": sj_sew}[family]
    if family != "ms_resnet":
        kwargs["spiking_neuron"] = neuron.LIFNode
    if family == "sew_resnet":
        kwargs["cnf"] = "ADD"
    return getattr(module, variant)(**kwargs)


@pytest.mark.parametrize("family, variant", VARIANTS)
def test_parameter_count_equals_spikingjelly(family, variant):
    """Built on the meta device (no memory, no initialisation): counting VGG-19's 140 M parameters costs nothing.
    SpikingJelly's VGG and Spiking ResNet read 3 input channels, whatever the data."""
    with torch.device("meta"):
        theirs = spikingjelly_model(family, variant, num_classes=100)
        ours = build_model({"name": family, "variant": variant, "num_classes": 100, "in_channels": 3, "T": 4,
                            **({"stem": "imagenet"} if family == "sew_resnet" else {})}, backend="torch")
    assert count(ours) == count(theirs) > 0


def test_parameter_counts_of_the_options_match_spikingjelly():
    """The CIFAR stems and other input channels count as SpikingJelly's networks built the same way."""
    from spikingjelly.activation_based import layer
    from spikingjelly.activation_based.model import ms_resnet as sj_ms

    with torch.device("meta"):
        # MS-ResNet: SpikingJelly's class takes the stem's kernel and stride; its first stage always downsamples
        # (a shortcut convolution in its first block), the CIFAR stem's first stage does not
        class FullSizeFirstStage(sj_ms.MSResNet):
            _first_stage_stride = 1

        theirs = FullSizeFirstStage(in_channels=2, num_classes=7, layers=(3, 4, 6, 3), stem_kernel_size=3,
                                    stem_stride=1)
        ours = MSResNet("ms_resnet34", num_classes=7, in_channels=2, stem="cifar")
        assert count(ours) == count(theirs)
        # Spiking ResNet: a 3x3 stem convolution in place of the 7x7 (the max-pool has no weights)
        theirs = spikingjelly_model("spiking_resnet", "spiking_resnet50", num_classes=7)
        theirs.conv1 = layer.Conv2d(3, 64, 3, padding=1, bias=False)
        assert count(SpikingResNet("spiking_resnet50", num_classes=7, stem="cifar")) == count(theirs)
    # narrower networks scale every layer
    assert count(MSResNet("ms_resnet18", width=8, num_classes=7)) < count(ours) / 50


@pytest.mark.parametrize("family", list(FAMILIES))
def test_unknown_variant_lists_the_valid_ones(family):
    valid = ", ".join(FAMILIES[family].VARIANTS)
    with pytest.raises(ValueError, match=f"variant='resnet9' is not valid; choose one of {valid}"):
        build_model({"name": family, "variant": "resnet9", "num_classes": 2, "in_channels": 1, "T": 2})


@pytest.mark.parametrize("family", ["spiking_vgg", "spiking_resnet", "ms_resnet"])
def test_config_composes_for_every_variant(family, compose_run):
    """``python -m snntrain model=<family> model.variant=<v>`` for every variant: the resolved model section
    builds the network the variant names, with the run's T, classes and input channels."""
    from omegaconf import OmegaConf

    for variant in FAMILIES[family].VARIANTS:
        cfg = compose_run(None, f"model={family}", f"model.variant={variant}", "data=digits_dvs", "T=3")
        model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
        assert model_cfg["name"] == family and model_cfg["variant"] == variant and model_cfg["T"] == 3
        assert (model_cfg["num_classes"], model_cfg["in_channels"]) == (10, 2)
        with torch.device("meta"):
            model = build_model(model_cfg, backend="torch")
        assert type(model) is MODELS[family] and model.T == 3


def test_sew_resnet_takes_variant_names_and_depths():
    def depth(**kw) -> int:
        m = build_model({"name": "sew_resnet", "num_classes": 2, "in_channels": 1, "T": 2, "width": 2, **kw})
        return sum(len(s) for s in (m.layer1, m.layer2, m.layer3, m.layer4))

    assert depth() == depth(depth=18) == depth(variant="sew_resnet18") == 8
    assert depth(variant="sew_resnet34") == depth(depth=34, variant="sew_resnet34") == 16
    with pytest.raises(ValueError, match="variant='sew_resnet50' is depth 50 but depth=34; set one of them"):
        depth(depth=34, variant="sew_resnet50")


def tiny_step(model: nn.Module, x: torch.Tensor, classes: int) -> None:
    """One SGD step on a batch: the loss is finite, every parameter gets a gradient (as DDP needs) and moves."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    logits = model(x)
    assert logits.shape == (x.shape[-4], classes)
    loss = nn.functional.cross_entropy(logits, torch.arange(x.shape[-4]) % classes)
    loss.backward()
    assert torch.isfinite(loss)
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize("family", ["spiking_vgg", "spiking_resnet", "ms_resnet"])
def test_one_training_step_at_the_tiny_size(family, compose_run):
    """``debug=tiny`` shrinks every family (conf/debug/model/tiny_<family>.yaml) to a step on 8x8 digits."""
    from omegaconf import OmegaConf

    cfg = compose_run(None, "debug=tiny", f"model={family}")
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    assert model_cfg["width"] == 4
    torch.manual_seed(0)
    model = build_model(model_cfg, backend="torch")
    assert count(model) < 50_000
    tiny_step(model, torch.randn(4, cfg.data.in_channels, cfg.data.image_size, cfg.data.image_size), 10)


def test_vgg_without_norms_and_with_its_own_classifier():
    """The plain variants put the neuron right after each (biased) convolution; the ``vgg`` classifier's hidden
    layers are spiking and its dropout masks are shared over T."""
    torch.manual_seed(0)
    model = SpikingVGG("spiking_vgg13", num_classes=3, in_channels=2, T=2, width=2, hidden=8, backend="torch")
    assert not any(isinstance(m, NormNeuron) for m in model.modules())
    assert sum(isinstance(m, BaseNeuron) for m in model.features) == 10
    assert sum(isinstance(m, BaseNeuron) for m in model.classifier) == 2
    tiny_step(model, torch.randn(3, 2, 8, 8), 3)  # 8x8 maps keep 1x1 through all five max-pools (ceil_mode)


def test_temporal_dropout_keeps_one_mask_for_every_step():
    drop = TemporalDropout(0.5)
    x = torch.ones(4, 3, 50)
    y = drop(x)
    assert set(y.unique().tolist()) == {0.0, 2.0} and torch.equal(y, y[:1].expand_as(y))
    assert torch.equal(drop.eval()(x), x)
    with pytest.raises(ValueError, match=r"dropout p=1.0 must be a number in \[0, 1\)"):
        TemporalDropout(1.0)


@pytest.mark.parametrize("make", [
    lambda: SpikingVGG("spiking_vgg11_bn", classifier="linear", num_classes=3, in_channels=2, T=3, width=2),
    lambda: SpikingResNet("spiking_resnet18", stem="imagenet", num_classes=3, in_channels=2, T=3, width=2),
    lambda: MSResNet("ms_resnet18", stem="cifar", num_classes=3, in_channels=2, T=3, width=2),
    lambda: MSResNet("ms_resnet18", stem="imagenet", num_classes=3, in_channels=2, T=3, width=2),
], ids=["vgg", "spiking_resnet", "ms_resnet-cifar", "ms_resnet-imagenet"])
def test_direct_encoding_equals_the_repeated_image(make):
    """A static image runs the first layers once (MS-ResNet: the stem and the first block's shortcut too) and is
    the input of every step: the logits equal those of the image repeated over T."""
    torch.manual_seed(0)
    model = make().eval()
    set_backend(model, "torch")
    x = torch.randn(2, 2, 16, 16)
    with torch.no_grad():
        assert torch.allclose(model(x), model(x.unsqueeze(0).repeat(3, 1, 1, 1, 1)), atol=1e-5)
        assert model(torch.randn(5, 2, 2, 16, 16)).shape == (2, 3)  # [T', B, C, H, W] input, any T'


@pytest.mark.slow
def test_triton_and_torch_backends_agree(device):
    """An MS-ResNet-18 of width 2 (plain neurons, fused norm-neurons, a static image over T) gives the same logits
    and gradients with the Triton kernels (on the GPU, or interpreted on a CPU) as with the PyTorch reference."""
    torch.manual_seed(0)
    model = MSResNet("ms_resnet18", stem="cifar", num_classes=3, in_channels=1, T=2, width=2, backend="torch")
    model = model.to(device)
    x = torch.randn(2, 1, 8, 8, device=device)
    grads = {}
    for backend in ("torch", "triton"):
        set_backend(model, backend)
        model.zero_grad()
        logits = model(x)
        logits.square().sum().backward()
        grads[backend] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (ref, ref_grads), (got, got_grads) = grads["torch"], grads["triton"]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    for name in ref_grads:
        torch.testing.assert_close(got_grads[name], ref_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_the_families_fuse_every_norm_that_feeds_a_neuron():
    """A norm runs alone only where a residual sum comes between it and the neuron; every other norm is one
    NormNeuron with the neuron after it."""
    kw = dict(num_classes=3, in_channels=1, T=2, width=2, backend="torch")
    for model, alone in ((SpikingVGG("spiking_vgg16_bn", classifier="linear", **kw), 0),
                         (SpikingResNet("spiking_resnet50", **kw), 16 + 4),  # bn3 of 16 blocks, 4 shortcuts
                         (MSResNet("ms_resnet34", **kw), 16 + 1 + 4),  # bn2 of 16 blocks, the stem, 4 shortcuts
                         (SEWResNet(variant="sew_resnet34", **kw), 0)):
        fused = sum(isinstance(m, NormNeuron) for m in model.modules())
        norms = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
        assert norms - fused == alone, type(model).__name__


RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "experiment").glob("*.yaml")
                 if any(family in p.stem for family in ("spiking_vgg", "spiking_resnet", "ms_resnet")))


def test_every_recipe_composes_and_builds_its_network(compose_run):
    """conf/experiment's recipes for the model zoo: each composes and its model section builds the network it
    names (on the meta device: ImageNet-size networks cost nothing)."""
    from omegaconf import OmegaConf

    assert len(RECIPES) == 13, RECIPES
    for recipe in RECIPES:
        cfg = compose_run(None, f"experiment={recipe}")
        if cfg.data.num_classes is None:  # an image folder: filled in from its class folders when it is read
            cfg = compose_run(None, f"experiment={recipe}", "data.num_classes=1000")
        model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
        assert recipe.endswith(model_cfg["variant"].removesuffix("_bn")), recipe
        with torch.device("meta"):
            model = build_model(model_cfg, backend="torch")
        assert model.T == cfg.T and type(model) is MODELS[model_cfg["name"]]


GPU_NETS = {
    "spiking_vgg": dict(variant="spiking_vgg11_bn", classifier="linear"),
    "spiking_resnet": dict(variant="spiking_resnet18", stem="imagenet"),
    "ms_resnet": dict(variant="ms_resnet18", stem="imagenet"),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", list(GPU_NETS))
def test_compiled_and_whole_step_graph_steps_match_eager_on_gpu(family):
    """Each family, channels-last on the Triton kernels: three steps under torch.compile and three captured as one
    CUDA graph (StepGraph, as cuda_graph=true runs them) give the eager steps' losses and weights (fp32; a spike
    that flips on a rounding difference changes a gradient locally, so weights are compared in norm: all of them
    together within 3e-3, each within 5e-2 (a norm's bias starts at zero, so after three steps it is its updates
    alone, which one flipped spike moves by a few percent), with norms below 2e-4 counted as 2e-4 (a parameter
    whose gradient is zero in exact arithmetic, the bias of a convolution in front of a batch norm, holds only
    rounding noise of about 1e-12; and MS-ResNet's layer1.0.bn2.0.bias, whose three updates add up to a norm of
    1.4e-4, moved by 6 % (8.5e-6) under compile on an H200 on 2026-12-03, one flipped spike))."""
    import copy

    from snntrain.tasks.speed import compile_model, to_channels_last
    from snntrain.tasks.step_graph import StepGraph, training_step_fn

    def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(2e-4))

    torch._dynamo.reset()
    torch.manual_seed(0)
    base = to_channels_last(MODELS[family](num_classes=5, in_channels=3, T=2, width=8, backend="triton",
                                           **GPU_NETS[family]).cuda())
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 64, 64, generator=g).cuda(), torch.randint(0, 5, (4,), generator=g).cuda())
               for _ in range(3)]
    runs = {}
    for mode in ("eager", "compile", "graph"):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        fn = compile_model(model, "default" if mode == "compile" else None)

        def objective(x, y, f=fn):
            return {"loss": nn.functional.cross_entropy(f(x), y)}

        step = training_step_fn(objective, opt)
        graph = StepGraph(step, opt) if mode == "graph" else None
        losses = []
        for x, y in batches:
            if graph is None:
                opt.zero_grad(set_to_none=True)
            losses.append((graph or step)(x, y)["loss"].clone())
        runs[mode] = torch.stack(losses), {n: p.detach().clone() for n, p in model.named_parameters()}
    for mode in ("compile", "graph"):
        torch.testing.assert_close(runs[mode][0], runs["eager"][0], rtol=1e-4, atol=1e-5, msg=mode)
        flat = {m: torch.cat([p.flatten() for p in runs[m][1].values()]) for m in (mode, "eager")}
        assert rel_err(flat[mode], flat["eager"]) <= 3e-3, mode
        for name, p in runs["eager"][1].items():
            assert rel_err(runs[mode][1][name], p) <= 5e-2, f"{mode}: {name}"
