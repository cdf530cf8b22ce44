"""The spiking transformers (Spikformer, Spike-driven Transformer, QKFormer): parameter counts equal to SpikingJelly
2.0's, structure, encoding, a training step per family, the Triton backend against the PyTorch one, the efficiency
report, NIR's refusal, and the command line."""

from __future__ import annotations

import pytest
import torch

from _testing import DEVICE
from snntrain.models import QKFormer, SpikeDrivenTransformer, Spikformer, build_model
from snntrain.nn import BaseNeuron, NormNeuron, set_backend
from snntrain.nn.attention import QKVNeuron

TINY = {
    "spikformer": dict(name="spikformer", variant="spikformer_cifar10", embed_dim=16, depth=1, heads=2, patch_size=4),
    "spike_driven_transformer": dict(name="spike_driven_transformer", variant="sdt_2_512", embed_dim=16, depth=1,
                                     pooling="0011"),
    "qkformer": dict(name="qkformer", variant="qkformer_4_384", embed_dim=16, heads=[2, 2, 2], depths=[1, 1, 1],
                     pooling="0011"),
}


def tiny(family: str, backend: str = "torch", **kw) -> torch.nn.Module:
    return build_model({**TINY[family], "num_classes": 5, "in_channels": 2, "T": 2, **kw}, backend=backend)


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _sj(variant: str, classes: int, in_channels: int):
    """SpikingJelly 2.0.0's model of the same name (or, for the variants it has no constructor for, its classes
    built alike)."""
    from spikingjelly.activation_based.model import qkformer, spike_driven_transformer, spikformer

    by_name = {
        "spikformer_ti": lambda: spikformer.spikformer_ti(num_classes=classes, in_channels=in_channels),
        "spikformer_s": lambda: spikformer.spikformer_s(num_classes=classes, in_channels=in_channels),
        "spikformer_cifar10": lambda: spikformer.spikformer_cifar10(num_classes=classes),
        "sdt_8_384": lambda: spike_driven_transformer.sdt_8_384(num_classes=classes, in_channels=in_channels),
        "sdt_2_512": lambda: spike_driven_transformer.SpikeDrivenTransformer(
            embed_dims=512, depths=2, pooling_stat="0011", num_classes=classes, in_channels=in_channels),
        "sdt_2_256": lambda: spike_driven_transformer.SpikeDrivenTransformer(
            embed_dims=256, depths=2, pooling_stat="0111", num_classes=classes, in_channels=in_channels),
        "qkformer_10_384": lambda: qkformer.qkformer_10_384(num_classes=classes, in_channels=in_channels),
        "qkformer_4_384": lambda: qkformer.QKFormer(embed_dims=384, num_heads=(8, 8, 8), depths=(1, 1, 2),
                                                    num_classes=classes, in_channels=in_channels),
        "qkformer_2_256": lambda: qkformer.QKFormer(embed_dims=256, num_heads=(8, 8, 8), depths=(0, 1, 1),
                                                    num_classes=classes, in_channels=in_channels),
    }
    return by_name[variant]()


VARIANTS = [("spikformer", v) for v in ("spikformer_ti", "spikformer_s", "spikformer_cifar10")] + \
    [("spike_driven_transformer", v) for v in ("sdt_8_384", "sdt_2_512", "sdt_2_256")] + \
    [("qkformer", v) for v in ("qkformer_10_384", "qkformer_4_384", "qkformer_2_256")]
#: the parameter counts SpikingJelly 2.0.0 gives (1000 classes, 3 channels; for the CIFAR and event variants the
#: paper's classes and channels), so that a change on either side shows
EXPECTED = {"spikformer_ti": 4_400_392, "spikformer_s": 13_244_824, "sdt_8_384": 16_816_744,
            "qkformer_10_384": 16_472_584}


@pytest.mark.parametrize("family, variant", VARIANTS)
def test_parameter_count_equals_spikingjelly(family, variant):
    imagenet = variant in EXPECTED
    classes, channels = (1000, 3) if imagenet else (10, 2 if variant.endswith("256") else 3)
    if variant == "spikformer_cifar10":
        channels = 3  # SpikingJelly's CIFAR-10 Spikformer takes RGB only
    with torch.device("meta"):  # counted, not allocated
        ours = build_model({"name": family, "variant": variant, "num_classes": classes, "in_channels": channels})
        theirs = _sj(variant, classes, channels)
    assert count(ours) == count(theirs)
    if imagenet:
        assert count(ours) == EXPECTED[variant]
    # more classes and input channels change both alike
    with torch.device("meta"):
        ours = build_model({"name": family, "variant": variant, "num_classes": 7, "in_channels": 3})
        theirs = _sj(variant, 7, 3)
    assert count(ours) == count(theirs)


@pytest.mark.parametrize("family", list(TINY))
def test_training_step_on_the_cpu(family):
    torch.manual_seed(0)
    model = tiny(family)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 2, 16, 16), torch.tensor([0, 1, 2, 3])
    before = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    assert sum(not torch.equal(a, p) for a, p in zip(before, model.parameters())) > len(before) // 2
    # event input [T, B, C, H, W] is used as it is (its own number of steps)
    assert model(torch.randn(3, 4, 2, 16, 16)).shape == (4, 5)


@pytest.mark.parametrize("family", list(TINY))
def test_direct_encoding_equals_the_repeated_image(family):
    torch.manual_seed(0)
    model = tiny(family, T=3)
    x = torch.randn(2, 2, 16, 16)
    torch.testing.assert_close(model(x), model(x.unsqueeze(0).repeat(3, 1, 1, 1, 1)), atol=1e-5, rtol=1e-5)


def test_every_neuron_follows_the_neuron_settings_and_the_attention_threshold():
    model = tiny("qkformer", neuron={"type": "PLIF", "tau": 3.0, "surrogate": "atan", "v_reset": None},
                 attn_v_threshold=0.25)
    neurons = {n: m for n, m in model.named_modules() if isinstance(m, BaseNeuron)}
    assert neurons and all(m.params.kind == "plif" and m.params.v_reset is None and m.params.surrogate == "atan"
                           for m in neurons.values())
    attention = {n for n in neurons if n.endswith("attn_neuron") or n.endswith("attn.attn.neuron")}
    assert attention  # token attention's neurons and the last stage's QKVNeuron's
    assert all(neurons[n].params.v_threshold == 0.25 for n in attention)
    assert all(m.params.v_threshold == 1.0 for n, m in neurons.items() if n not in attention)
    # every norm followed by a neuron in a projection is one fused NormNeuron
    assert sum(isinstance(m, NormNeuron) for m in model.modules()) >= 10


@pytest.mark.parametrize("build, arg, message", [
    (Spikformer, dict(variant="spikformer_xl"), "spikformer_ti, spikformer_s, spikformer_cifar10"),
    (SpikeDrivenTransformer, dict(variant="sdt_8_512"), "sdt_8_384"),
    (QKFormer, dict(variant="qkformer_10_512"), "qkformer_10_384"),
    (Spikformer, dict(variant=None, embed_dim=64), "needs depth, heads, patch_size"),
    (Spikformer, dict(heads=5), "multiple of 8 (the stem's first stage has E/8 channels) and of heads=5"),
    (Spikformer, dict(patch_size=3), "patch_size=3 is not valid"),
    (SpikeDrivenTransformer, dict(pooling="11"), "four characters 0/1"),
    (QKFormer, dict(heads=[5, 6, 6]), "96 channels does not split into 5 heads"),
    (QKFormer, dict(depths=[1, 2]), "three integers"),
])
def test_bad_settings_name_the_value_and_what_is_valid(build, arg, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        with torch.device("meta"):
            build(**arg)


def test_nir_export_is_refused_with_the_reason():
    from snntrain.nir import NIRError, to_nir

    with pytest.raises(NIRError, match="Spikformer has no NIR graph: spiking self-attention multiplies spike"):
        to_nir(tiny("spikformer"), (2, 16, 16))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_efficiency_counter_counts_the_attention_neuron_and_token_projections(backend):
    from snntrain.efficiency import ActivityCounter

    torch.manual_seed(0)
    model = tiny("spikformer", backend=backend, neuron={"type": "LIF", "v_threshold": 0.2}, attn_v_threshold=0.05)
    model.to(DEVICE).train()  # batch statistics: the layers fire
    counter = ActivityCounter(model, backend="torch").attach()
    with torch.no_grad():
        model(torch.randn(3, 2, 16, 16).to(DEVICE))
    report = counter.unpack(counter.totals())
    counter.detach()
    attn = report["spiking"]["blocks.0.attn.attn"]
    assert attn["type"] == "QKV+LIF" and attn["neuron_steps"] == 2 * 3 * 16 * 16  # T B N C
    assert len(attn["channel_spikes"]) == 16 and attn["spikes"] > 0
    assert "blocks.0.attn.attn.neuron" not in report["spiking"]  # counted once, as the fused layer
    qkv = report["connections"]["blocks.0.attn.qkv.fc"]
    assert qkv["dense"] == 2 * 3 * 16 * 16 * 48 and qkv["ann_dense"] == qkv["dense"] / 2  # every token, one step


@pytest.mark.slow
@pytest.mark.parametrize("family", list(TINY))
def test_triton_backend_equals_torch_on_a_tiny_model(family, device):
    """The fused kernels (norm-neuron on token maps, the attention's product-neuron), on the GPU or in Triton's
    interpreter, against the PyTorch backend: the same spikes, so the same logits, and gradients to rounding."""
    torch.manual_seed(0)
    model = tiny(family).to(device)
    x = torch.randn(2, 2, 16, 16, device=device)
    out = model(x)
    out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    set_backend(model, "triton")
    if family == "spikformer":
        assert isinstance(model.blocks[0].attn.attn, QKVNeuron)
    got = model(x)
    got.square().sum().backward()
    torch.testing.assert_close(got, out, rtol=1e-5, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-3, atol=1e-4 * max(1.0, grads[n].abs().max().item()),
                                   msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("family", list(TINY))
def test_command_line_trains_each_family(family, compose_run, tmp_path):
    from snntrain.cli import run

    acc = run(compose_run(tmp_path, f"model={family}", "debug=tiny"))
    assert 0.0 <= acc <= 1.0
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("family", list(TINY))
def test_recomputation_gives_the_same_step(family):
    """``checkpoint=true``: the same outputs, gradients and running statistics (the recomputed forward leaves the
    batch-norm buffers as the first one set them), bit for bit."""
    runs = []
    for checkpoint in (False, True):
        torch.manual_seed(0)
        model = tiny(family, checkpoint=checkpoint)
        out = model(torch.randn(3, 2, 16, 16, generator=torch.Generator().manual_seed(1)))
        out.square().sum().backward()
        runs.append((out, {n: p.grad for n, p in model.named_parameters()}, dict(model.named_buffers())))
    (out0, grads0, bufs0), (out1, grads1, bufs1) = runs
    assert torch.equal(out0, out1)
    assert all(torch.equal(grads0[n], grads1[n]) for n in grads0)
    assert all(torch.equal(bufs0[n], bufs1[n]) for n in bufs0)


@pytest.mark.parametrize("dtype, autocast", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)])
@pytest.mark.parametrize("input_max, bits", [(1, 1), (255, 8)], ids=["spikes", "counts"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_spike_linear_keeps_its_input_packed_and_equals_linear(dtype, autocast, input_max, bits, backend):
    from _testing import DEVICE
    from snntrain.nn.attention import SpikeLinear

    dev = DEVICE if backend == "triton" else torch.device("cpu")  # the kernels: CUDA, or the interpreter
    torch.manual_seed(0)
    ours = SpikeLinear(6, 5, input_max=input_max, backend=backend).to(dtype).to(dev)
    ref = torch.nn.Linear(6, 5).to(dtype).to(dev)
    ref.load_state_dict(ours.state_dict())
    assert ours.bits == bits and f"kept in {bits} bit" in repr(ours)
    x = torch.randint(0, min(input_max, 4) + 1, (2, 3, 6)).to(dtype).to(dev)  # spikes, or spike counts
    saved = []
    results = []
    for m in (ours, ref):
        leaf = x.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), \
                torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            y = m(leaf)
        (y.float() * torch.arange(5.0, device=dev)).sum().backward()
        results.append((y, leaf.grad, m.weight.grad, m.bias.grad))
        saved.append(None)
    kept = [t for t in saved[:saved.index(None)] if t.dtype == torch.uint8]
    assert len(kept) == 1 and kept[0].numel() == -(-x.numel() * bits // 8)  # the input, packed
    for a, b in zip(*results):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("family", ["spikformer", "spike_driven_transformer", "qkformer"])
def test_projections_of_spikes_keep_one_bit_and_of_counts_one_byte(family):
    """Spikformer's and QKFormer's attention and MLP read the residual stream's spike counts in their first
    projection (a byte) and spikes in their second (a bit); every projection of the Spike-driven Transformer reads a
    neuron's spikes."""
    from snntrain.nn.attention import SpikeLinear

    bits = {name: m.bits for name, m in tiny(family).named_modules() if isinstance(m, SpikeLinear)}
    assert bits
    if family == "spike_driven_transformer":
        assert set(bits.values()) == {1}
    else:
        assert {n for n, b in bits.items() if b == 8} == {n for n in bits if n.endswith(("qkv.fc", "qk.fc", "fc1.fc"))}
        assert {n for n, b in bits.items() if b == 1} == {n for n in bits if n.endswith(("proj.fc", "fc2.fc"))}


@pytest.mark.gpu
@pytest.mark.parametrize("family", list(TINY))
@pytest.mark.parametrize("mode, checkpoint", [(None, False), (None, True), ("default", False)])
def test_whole_step_cuda_graph_and_compile_train_like_eager(family, mode, checkpoint):
    """Six steps of each family (Triton kernels, channels-last, bf16 autocast) through the whole-step CUDA graph
    (eager or ``torch.compile``d objective; with or without recomputation) follow the eager steps: nothing in a
    forward or backward synchronises with the host, and the captured step computes what the eager one does."""
    import copy

    from snntrain.tasks.optim import build_optimizer
    from snntrain.tasks.speed import compile_model, to_channels_last
    from snntrain.tasks.step_graph import StepGraph, training_step_fn

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 2, 16, 16, generator=g).cuda(), torch.randint(0, 5, (4,), generator=g).cuda())
               for _ in range(6)]
    torch.manual_seed(0)
    base = to_channels_last(tiny(family, backend="triton", checkpoint=checkpoint).cuda())
    runs = {}
    for graphed in (False, True):
        model = copy.deepcopy(base)
        opt = build_optimizer(model, {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0})
        fn = compile_model(model, mode)

        def objective(x, y, f=fn):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return {"loss": torch.nn.functional.cross_entropy(f(x), y)}

        step = training_step_fn(objective, opt)
        run_step = StepGraph(step, opt) if graphed else None
        losses = []
        for x, y in batches:
            if graphed:
                out = run_step(x, y)
            else:
                opt.zero_grad(set_to_none=True)
                out = step(x, y)
            losses.append(out["loss"].clone())
        assert run_step is None or run_step.captured
        runs[graphed] = torch.stack(losses)
    torch.testing.assert_close(runs[True], runs[False], rtol=2e-2, atol=1e-3)
    assert torch.isfinite(runs[True]).all()


RECIPES = {  # experiment -> (model, variant, data, T)
    "cifar10_spikformer": ("spikformer", "spikformer_cifar10", "cifar10", 4),
    "cifar100_spikformer": ("spikformer", "spikformer_cifar10", "cifar100", 4),
    "imagenet_spikformer": ("spikformer", "spikformer_s", "image_folder", 4),
    "cifar10_dvs_spikformer": ("spikformer", "spikformer_ti", "cifar10_dvs", 16),
    "dvs_gesture_spikformer": ("spikformer", "spikformer_ti", "dvs_gesture", 16),
    "cifar10_sdt": ("spike_driven_transformer", "sdt_2_512", "cifar10", 4),
    "cifar100_sdt": ("spike_driven_transformer", "sdt_2_512", "cifar100", 4),
    "imagenet_sdt": ("spike_driven_transformer", "sdt_8_384", "image_folder", 4),
    "cifar10_dvs_sdt": ("spike_driven_transformer", "sdt_2_256", "cifar10_dvs", 16),
    "dvs_gesture_sdt": ("spike_driven_transformer", "sdt_2_256", "dvs_gesture", 16),
    "cifar10_qkformer": ("qkformer", "qkformer_4_384", "cifar10", 4),
    "cifar100_qkformer": ("qkformer", "qkformer_4_384", "cifar100", 4),
    "imagenet_qkformer": ("qkformer", "qkformer_10_384", "image_folder", 4),
    "cifar10_dvs_qkformer": ("qkformer", "qkformer_2_256", "cifar10_dvs", 16),
    "dvs_gesture_qkformer": ("qkformer", "qkformer_2_256", "dvs_gesture", 16),
    "digits_spikformer": ("spikformer", "spikformer_cifar10", "digits", 4),
    "digits_sdt": ("spike_driven_transformer", "sdt_2_512", "digits", 4),
    "digits_qkformer": ("qkformer", "qkformer_4_384", "digits", 4),
    "digits_dvs_spikformer": ("spikformer", "spikformer_cifar10", "digits_dvs", 4),
    "digits_dvs_sdt": ("spike_driven_transformer", "sdt_2_512", "digits_dvs", 4),
    "digits_dvs_qkformer": ("qkformer", "qkformer_4_384", "digits_dvs", 4),
}


@pytest.mark.parametrize("experiment", list(RECIPES))
def test_recipes_compose_and_build(experiment, compose_run, tmp_path):
    from omegaconf import OmegaConf

    model, variant, data, T = RECIPES[experiment]
    extra = ["data.root=/nonexistent"] if data == "image_folder" else []  # ImageNet's folder is required
    cfg = OmegaConf.to_container(compose_run(tmp_path, f"experiment={experiment}", *extra), resolve=True)
    assert (cfg["model"]["name"], cfg["model"]["variant"], cfg["data"]["name"], cfg["T"]) == (model, variant, data, T)
    if cfg["data"].get("num_classes") is None:
        cfg["model"]["num_classes"] = 1000  # ImageNet's, read from its folders in a run
    with torch.device("meta"):
        build_model(cfg["model"])


def test_cifar100_names_the_archive_to_fetch(tmp_path):
    from snntrain.data import CIFAR100DataModule

    dm = CIFAR100DataModule(root=str(tmp_path / "c100"), download=False)
    assert dm.num_classes == len(dm.classes) == 100
    with pytest.raises(RuntimeError, match=r"CIFAR-100 is not in .*c100 \(download=false\).*cifar-100-python.tar.gz"):
        dm.prepare_data()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qkformer"])  # the most varied layers; ONNX's export takes most of a minute
def test_trained_transformer_exports_and_nir_is_refused(family, compose_run, tmp_path):
    """A ``debug=tiny`` run's checkpoint exports to safetensors, ONNX (checked with onnxruntime) and a torch.export
    program that reloads; NIR is refused with the reason before anything is written."""
    from snntrain.cli import run
    from snntrain.export import export_checkpoint, load_exported
    from snntrain.nir import NIRError

    run(compose_run(tmp_path / "run", f"model={family}", "debug=tiny"))
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    card = export_checkpoint(ckpt, tmp_path / "export", backend="torch")
    assert card["onnx_max_abs_diff"] < 1e-4 and card["torch_export_max_abs_diff"] < 1e-4
    assert {"model.safetensors", "model.onnx", "model.pt2"} <= set(card["files"])
    model = load_exported(tmp_path / "export", backend="torch")
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 10)
    with pytest.raises(NIRError, match="has no NIR graph: .* multipl(y|ies) spike tensors"):
        export_checkpoint(ckpt, tmp_path / "nir", formats=["nir"])
    assert not (tmp_path / "nir").exists()


def test_token_map_view_has_channels_last_strides_and_exact_norm_gradients():
    """Tokens as a map are a view with a channels-last map's strides (also on the size-1 last dim: PyTorch's CPU batch
    norm takes a stride of 1 there for another layout and gets the input gradient wrong), so a norm and neuron over it
    give the gradients of the same map laid out contiguously."""
    from snntrain.nn import NormNeuron, build_neuron
    from snntrain.nn.attention import map_as_tokens, tokens_as_map

    T, B, N, C = 2, 3, 5, 4
    x = torch.randn(T, B, N, C, generator=torch.Generator().manual_seed(0)) * 2
    view = tokens_as_map(x)
    assert view.shape == (T, B, C, N, 1) and view.stride() == (B * N * C, N * C, 1, C, C)
    assert view.data_ptr() == x.data_ptr() and torch.equal(map_as_tokens(view), x)
    grads = []
    for make in (tokens_as_map, lambda t: tokens_as_map(t).contiguous()):
        leaf = x.clone().requires_grad_()
        torch.manual_seed(1)
        layer = NormNeuron(torch.nn.BatchNorm2d(C), build_neuron(type="LIF", detach_reset=True, backend="torch"),
                           "torch")
        layer(make(leaf)).mul(torch.arange(N, dtype=torch.float32).view(N, 1)).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1])
