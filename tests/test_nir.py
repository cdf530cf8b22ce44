"""NIR export and import: round trips for every neuron type, reset and target, the NIR package's own reader and
nirtorch's executor, the neuron parameter mapping, what load_nir reads of other libraries' conventions, and clear
refusals of what NIR, a target's importer or snntrain cannot express. tests/test_nir_importers.py runs the
graphs in snnTorch, Norse and SpikingJelly themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

nir = pytest.importorskip("nir")

from snntrain import load_nir  # noqa: E402
from snntrain.models import SEWResNet  # noqa: E402
from snntrain.nir import (  # noqa: E402
    NIR_TARGETS,
    NIRError,
    depth_first_order,
    fold_batchnorm,
    neuron_from_nir,
    neuron_to_nir,
    node_map,
    target_problems,
    to_nir,
    write_nir,
)
from snntrain.nn.neurons import build_neuron  # noqa: E402

SHAPE = (2, 8, 8)
NEURONS = {
    "LIF": {"type": "LIF", "tau": 2.0},
    "LIF-no-decay-input": {"type": "LIF", "tau": 1.5, "decay_input": False, "v_reset": -0.1},
    "IF": {"type": "IF", "v_threshold": 0.8},
    "IF-reset-0.2": {"type": "IF", "v_reset": 0.2, "v_threshold": 1.1},
    "PLIF": {"type": "PLIF", "init_tau": 3.0, "v_reset": -0.3},
    "PLIF-no-decay-input": {"type": "PLIF", "init_tau": 2.5, "decay_input": False},
}


def make_model(neuron: dict, stem: str = "cifar", num_classes: int = 5, seed: int = 0) -> SEWResNet:
    """A small SEW-ResNet with BatchNorm statistics that keep every layer firing."""
    torch.manual_seed(seed)
    model = SEWResNet(depth=18, num_classes=num_classes, in_channels=2, T=3, width=4, stem=stem, neuron=neuron,
                      backend="torch")
    return firing(model, neuron, seed)


def firing(model: torch.nn.Module, neuron: dict, seed: int = 0) -> torch.nn.Module:
    """``model`` (eval mode) with BatchNorm statistics that keep every layer firing (and, for PLIF, a learned
    time constant rather than the initial one)."""
    g = torch.Generator().manual_seed(seed)
    gain = 3.0 if neuron["type"] != "IF" and neuron.get("decay_input", True) else 1.0  # input divided by tau
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            with torch.no_grad():
                m.weight.copy_((torch.rand(n, generator=g) * 2 + 1) * gain)
                m.bias.copy_((torch.rand(n, generator=g) * 0.5 + 0.2) * gain)
    if neuron["type"] == "PLIF":
        for m in model.modules():
            if hasattr(m, "w"):
                m.w.data.add_(0.37)
    return model.eval()


def events(T: int = 3, B: int = 2, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(T, B, *SHAPE, generator=g) < 0.3).float() * torch.randint(1, 4, (T, B, *SHAPE), generator=g)


def run_recording_spikes(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's output and every neuron layer's spikes, in the order they ran."""
    spikes: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda mod, i, o: spikes.append(o)) for m in model.modules()
             if type(m).__name__ in ("IF", "LIF", "PLIF")]
    with torch.no_grad():
        out = model(x)
    for h in hooks:
        h.remove()
    return out, spikes


@pytest.mark.parametrize("name", list(NEURONS))
def test_round_trip_same_spikes_and_logits(name, tmp_path):
    model = make_model(NEURONS[name])
    path = tmp_path / "model.nir"
    write_nir(model, path, SHAPE)
    net = load_nir(path)
    x = events()
    with torch.no_grad():
        ref = model(x)
    want, ours = run_recording_spikes(fold_batchnorm(model), x)
    got, theirs = run_recording_spikes(net, x)
    assert torch.equal(got, want)  # the graph is exactly the folded network
    # (folding changes the rounding of every convolution: against the unfolded model `ref`, a membrane within
    # rounding of the threshold could fire in one and not the other; on these inputs none does)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert len(ours) == len(theirs) == 20
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    assert all(float(s.mean()) > 0 for s in ours)  # every layer fires: the comparison is not of zeros


def test_imagenet_stem_max_pool_and_static_input(tmp_path):
    model = make_model(NEURONS["LIF"], stem="imagenet")
    graph = write_nir(model, tmp_path / "m.nir", SHAPE)
    assert isinstance(graph.nodes["pool.0.sum"], nir.SumPool2d) and isinstance(graph.nodes["pool.0.threshold"],
                                                                                 nir.Threshold)
    net = load_nir(tmp_path / "m.nir")
    x = events()
    with torch.no_grad():
        assert torch.equal(net(x), fold_batchnorm(model)(x))
        img = torch.rand(2, *SHAPE) * 2  # a static image: the same input at every one of the T steps
        assert torch.equal(net(img), fold_batchnorm(model)(img.unsqueeze(0).expand(3, *img.shape)))


def test_graph_structure_reads_back_with_nir(tmp_path):
    model = make_model(NEURONS["LIF"])
    write_nir(model, tmp_path / "m.nir", SHAPE, dt=1e-3)
    graph = nir.read(str(tmp_path / "m.nir"))
    assert graph.metadata["dt"] == 1e-3 and graph.metadata["T"] == 3 and graph.metadata["readout"] == "mean_over_time"
    types = {type(n).__name__ for n in graph.nodes.values()}
    assert types == {"Input", "Conv2d", "LIF", "AvgPool2d", "Flatten", "Affine", "Output"}
    assert graph.metadata["target"] == "spec"
    # SEW ADD: the residual branch and the shortcut both feed the nodes that read the block's output (NIR sums
    # the edges into a node); an identity shortcut is itself such a sum, so the terms accumulate within a stage
    into = {name: sorted(a for a, b in graph.edges if b == name) for name in graph.nodes}
    assert into["layer1.1.conv1.0"] == ["layer1.0.sn2", "sn1"]
    assert into["layer2.0.conv1.0"] == into["layer2.0.downsample.0.0"] == ["layer1.0.sn2", "layer1.1.sn2", "sn1"]
    assert into["layer2.1.conv1.0"] == ["layer2.0.downsample.1", "layer2.0.sn2"]
    assert into["avgpool.0"] == ["layer4.0.downsample.1", "layer4.0.sn2", "layer4.1.sn2"]
    lif = graph.nodes["layer1.0.sn1"]
    assert lif.tau.shape == (4, 8, 8) and np.allclose(lif.tau, 2.0 * 1e-3) and np.all(lif.r == 1.0)
    conv = graph.nodes["stem.0"]
    assert conv.weight.shape == (4, 2, 3, 3) and conv.bias.shape == (4,) and np.any(conv.bias != 0)  # BN folded
    # dt comes from the graph's metadata on import
    x = events()
    with torch.no_grad():
        assert torch.equal(load_nir(graph)(x), fold_batchnorm(model)(x))


def test_nirtorch_runs_the_graph(tmp_path):
    """The NIR reference tooling (nir.read + nirtorch's graph executor) reproduces the model's outputs."""
    nirtorch = pytest.importorskip("nirtorch")
    model = make_model(NEURONS["IF"])
    write_nir(model, tmp_path / "m.nir", SHAPE)
    graph = nir.read(str(tmp_path / "m.nir"))
    module = nirtorch.nir_to_torch(graph, node_map(graph.metadata["dt"]))
    x = events()
    with torch.no_grad():
        per_step, _state = module(x)
        assert torch.equal(per_step.mean(0), fold_batchnorm(model)(x))


def test_backbone_exports_stage_outputs(tmp_path):
    model = make_model(NEURONS["LIF"], num_classes=0)
    graph = write_nir(model, tmp_path / "b.nir", SHAPE)
    assert sorted(n for n, v in graph.nodes.items() if isinstance(v, nir.Output)) == [f"stage{i}" for i in range(1, 5)]
    net = load_nir(tmp_path / "b.nir")
    x = events()
    with torch.no_grad():
        got, want = net(x), fold_batchnorm(model).forward_features(x)
    for i, w in enumerate(want, start=1):
        assert torch.equal(got[f"stage{i}"], w)


@pytest.mark.parametrize("dt", [1e-4, 1e-3, 1.0])
def test_neuron_parameter_mapping(dt):
    """LIF: tau_nir = tau * dt, v_leak = v_reset, r = 1 (decay_input) or tau (not); IF: r = 1 / dt."""
    lif = build_neuron("LIF", tau=4.0, v_threshold=0.5, v_reset=-0.2, decay_input=True, backend="torch")
    node = neuron_to_nir(lif, (3,), dt)
    assert np.allclose(node.tau, 4.0 * dt) and np.all(node.r == 1.0) and np.all(node.v_leak == -0.2)
    assert np.all(node.v_reset == -0.2) and np.all(node.v_threshold == 0.5)
    # forward Euler of tau dv/dt = (v_leak - v) + r I with step dt is snntrain's charge equation
    v, i = 0.3, 0.7
    euler = v + dt / node.tau[0] * ((node.v_leak[0] - v) + node.r[0] * i)
    assert euler == pytest.approx(v + (i - (v - (-0.2))) / 4.0)
    no_decay = neuron_to_nir(build_neuron("LIF", tau=4.0, decay_input=False, backend="torch"), (3,), dt)
    assert np.allclose(no_decay.r, 4.0)
    assert v + dt / no_decay.tau[0] * ((0 - v) + no_decay.r[0] * i) == pytest.approx(v - v / 4.0 + i)
    if_node = neuron_to_nir(build_neuron("IF", backend="torch"), (3,), dt)
    assert isinstance(if_node, nir.IF) and np.allclose(if_node.r * dt, 1.0)
    for n in (node, no_decay, if_node):
        back = neuron_from_nir(n, dt)
        assert back.params.v_reset == n.v_reset[0] and back.params.v_threshold == n.v_threshold[0]


def test_soft_reset_and_multiplying_connections_are_refused():
    with pytest.raises(NIRError, match="soft reset"):
        to_nir(make_model({"type": "LIF", "v_reset": None}), SHAPE)
    for connect in ("AND", "IAND"):
        model = SEWResNet(depth=18, num_classes=3, in_channels=2, T=2, width=4, connect=connect, backend="torch")
        with pytest.raises(NIRError, match=f"connect={connect}.*model.connect=ADD"):
            to_nir(model.eval(), SHAPE)
    ln = SEWResNet(depth=18, num_classes=3, in_channels=2, T=2, width=4, norm="layernorm", backend="torch")
    with pytest.raises(NIRError, match="LayerNorm2d has no NIR equivalent"):
        to_nir(ln.eval(), SHAPE)
    with pytest.raises(NIRError, match="dt=0"):
        to_nir(make_model(NEURONS["LIF"]), SHAPE, dt=0)


def _tiny_graph(neuron) -> nir.NIRGraph:
    w = np.eye(3)
    return nir.NIRGraph.from_list(nir.Affine(weight=w, bias=np.zeros(3)), neuron)


def test_import_refuses_what_snntrain_cannot_run(tmp_path):
    three = np.ones(3)
    # another library's graph that snntrain does run: an affine layer into LIF neurons, r = tau / dt
    ok = load_nir(_tiny_graph(nir.LIF(tau=three * 2e-4, r=three * 2.0, v_leak=three * 0, v_threshold=three)), dt=1e-4)
    assert ok(torch.ones(2, 1, 3)).shape == (2, 1, 3)
    with pytest.raises(NIRError, match="CubaLIF with tau_syn=1 s .*no synaptic current"):
        load_nir(_tiny_graph(nir.CubaLIF(tau_syn=three, tau_mem=three, r=three, v_leak=three * 0, v_threshold=three)))
    with pytest.raises(NIRError, match="Delay, which has no snntrain layer"):
        load_nir(_tiny_graph(nir.Delay(delay=three)))
    with pytest.raises(NIRError, match="tau differs between neurons"):
        load_nir(_tiny_graph(nir.LIF(tau=np.array([2e-4, 3e-4, 2e-4]), r=three, v_leak=three * 0, v_threshold=three)),
                 dt=1e-4)
    with pytest.raises(NIRError, match="v_leak=0.5 != v_reset=0"):
        load_nir(_tiny_graph(nir.LIF(tau=three * 2e-4, r=three, v_leak=three * 0.5, v_threshold=three)), dt=1e-4)
    with pytest.raises(NIRError, match="r=0.5"):
        load_nir(_tiny_graph(nir.LIF(tau=three * 2e-4, r=three * 0.5, v_leak=three * 0, v_threshold=three)), dt=1e-4)
    with pytest.raises(NIRError, match="IF with r=0.5 at dt=0.0001.*r = 1/dt = 10000 .* or r = 1"):
        load_nir(_tiny_graph(nir.IF(r=three * 0.5, v_threshold=three)), dt=1e-4)
    recurrent = _tiny_graph(nir.IF(r=three * 1e4, v_threshold=three))
    recurrent.edges.append(("if", "affine"))
    with pytest.raises(NIRError, match="recurrent"):
        load_nir(recurrent, dt=1e-4)


# ----------------------------------------------------------------------------- targets

def spikes_by_name(model: torch.nn.Module, x: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """The spikes of the neuron layers called ``names`` (NIR node names), from a NIRNetwork or a SEW-ResNet."""
    spikes: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        layer = model.layers[name.replace(".", "_")] if hasattr(model, "layers") else model.get_submodule(name)
        layer = getattr(layer, "neuron", layer)
        hooks.append(layer.register_forward_hook(lambda m, i, o, name=name: spikes.__setitem__(name, o)))
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return spikes


@pytest.mark.parametrize("target,name,stem", [
    ("snntorch", "LIF", "imagenet"), ("snntorch", "IF", "cifar"), ("snntorch", "PLIF-no-decay-input", "imagenet"),
    ("norse", "LIF", "cifar"), ("norse", "IF", "imagenet"),
    ("spikingjelly", "LIF-no-decay-input", "cifar"), ("spikingjelly", "IF-reset-0.2", "imagenet"),
    ("spikingjelly", "PLIF", "cifar"),
])
def test_every_target_is_exact_in_load_nir(target, name, stem, tmp_path):
    """Whatever the target, load_nir runs the written graph as the folded model: the same spikes in every
    neuron layer of the model, the same logits (to float32 rounding where Norse's readout takes the pooling's
    1 / (H W)). snnTorch and Norse take v_reset = 0 (Norse also decay_input), SpikingJelly every neuron here;
    test_round_trip_same_spikes_and_logits covers spec."""
    model = make_model(NEURONS[name], stem=stem)
    graph = write_nir(model, tmp_path / "m.nir", SHAPE, target=target)
    assert graph.metadata["target"] == target and graph.metadata["dt"] == NIR_TARGETS[target].dt
    assert target_problems(nir.read(str(tmp_path / "m.nir")), target) == []
    net, folded = load_nir(tmp_path / "m.nir"), fold_batchnorm(model)
    x = events()
    neurons = [n for n, node in graph.nodes.items() if isinstance(node, (nir.IF, nir.LIF)) and not n.startswith("pool")]
    assert len(neurons) == 20
    theirs, ours = spikes_by_name(net, x, neurons), spikes_by_name(folded, x, neurons)
    for n in neurons:
        assert torch.equal(theirs[n], ours[n]), n
    with torch.no_grad():
        torch.testing.assert_close(net(x), folded(x), atol=1e-6, rtol=1e-6)
    kinds = {type(node).__name__ for node in graph.nodes.values()}
    assert kinds <= set(NIR_TARGETS[target].nodes)
    if target == "snntorch":  # IF as a LIF without leak, which load_nir reads back as an IF
        assert "IF" not in kinds and (name != "IF" or isinstance(net.layers["sn1"], type(build_neuron("IF"))))
    if stem == "imagenet" and target != "spec":  # max pool: a Conv2d of ones with the padding, and a neuron
        assert isinstance(graph.nodes["pool.0.sum"], nir.Conv2d) and tuple(graph.nodes["pool.0.sum"].padding) == (1, 1)


def test_target_refusals_name_every_node_and_write_nothing(tmp_path):
    # snnTorch: v_reset != 0 (it resets to 0) and a dt other than its fixed 1e-4, on every neuron layer
    path = tmp_path / "m.nir"
    with pytest.raises(NIRError) as err:
        write_nir(make_model(NEURONS["IF-reset-0.2"]), path, SHAPE, dt=1e-3, target="snntorch")
    text = str(err.value)
    assert "export.nir_target=snntorch" in text and "v_reset=0.2: snnTorch 1.0 asserts v_leak = 0" in text
    assert "dt=0.001 s: snnTorch 1.0 steps with dt = 1e-4 s" in text
    assert "nodes: sn1, layer1.0.sn1, layer1.0.sn2" in text and "layer4.1.sn2" in text and not path.exists()
    # Norse ignores r: decay_input=false is refused (and v_reset=-0.1)
    with pytest.raises(NIRError, match=r"LIF with r=1.5: Norse 1.1's LIFBoxCell ignores r .*\(nodes: sn1, layer1"):
        to_nir(make_model(NEURONS["LIF-no-decay-input"]), SHAPE, target="norse")
    # everything the model cannot express, at once: soft reset, AND, layer norm
    model = SEWResNet(depth=18, num_classes=3, in_channels=2, T=2, width=4, connect="AND", norm="layernorm",
                      neuron={"type": "LIF", "v_reset": None}, backend="torch").eval()
    with pytest.raises(NIRError) as err:
        to_nir(model, SHAPE, target="spikingjelly")
    text = str(err.value)
    assert "connect=AND multiplies spikes" in text and "(nodes: layer1.0, layer1.1, layer2.0" in text
    assert "LayerNorm2d has no NIR equivalent" in text and "soft reset" in text
    # snnTorch's and SpikingJelly's importer (nirtorch.nir_to_torch) loop forever on several Output nodes
    for target in ("snntorch", "spikingjelly"):
        with pytest.raises(NIRError, match=r"loops forever .* \(nodes: stage1, stage2, stage3, stage4\)"):
            to_nir(make_model(NEURONS["LIF"], num_classes=0), SHAPE, target=target)
    with pytest.raises(ValueError, match="export.nir_target='loihi' is not valid; choose one of spec, snntorch"):
        to_nir(make_model(NEURONS["LIF"]), SHAPE, target="loihi")


def test_norse_target_orders_the_graph_for_a_depth_first_executor():
    """Norse 1.1 runs nodes depth first from the input (nirtorch.load): in a downsampling block the shortcut
    would run after the sum that reads it. The norse graph adds an edge of zeros from the end of the branch to
    the start of the shortcut; the spec graph, run so, reads stale values."""
    model = make_model(NEURONS["LIF"], stem="imagenet")
    spec, norse = to_nir(model, SHAPE), to_nir(model, SHAPE, target="norse")
    late = {node for node, reason in target_problems(spec, "norse") if "depth first" in reason}
    assert late == {b for a, b in spec.edges if a.endswith("downsample.1")}  # what reads a downsampling block
    assert late >= {"layer2.1.conv1.0", "layer3.0.downsample.0.0", "avgpool.0"}
    order = depth_first_order(norse)
    assert sorted(order) == sorted(norse.nodes) and order[-1] == "output"
    position = {n: i for i, n in enumerate(order)}
    assert all(position[a] < position[b] for a, b in norse.edges)
    zeros = norse.nodes["layer2.0.order"]
    assert isinstance(zeros, nir.Conv2d) and not np.any(zeros.weight) and not np.any(zeros.bias)
    assert {("layer2.0.sn2", "layer2.0.order"), ("layer2.0.order", "layer2.0.downsample.0.0")} <= set(norse.edges)


def test_load_nir_reads_other_libraries_conventions():
    three, x = np.ones(3), torch.tensor([[[0.6, 0.3, 1.2]]]).expand(4, 1, 3)
    # IF with r = 1 (Norse, Sinabs): the input is added unscaled each step, whatever dt
    per_step = load_nir(_tiny_graph(nir.IF(r=three, v_threshold=three)), dt=1e-3)
    assert torch.equal(per_step(x)[:, 0], torch.tensor([[0, 0, 1], [1, 0, 1], [0, 0, 1], [1, 1, 1]]).float())
    # a batch-shaped Input (nirtorch's exporter, Norse): [1, 3] before an Affine of 3 inputs
    graph = _tiny_graph(nir.IF(r=three, v_threshold=three))
    graph.nodes["input"] = nir.Input(input_type={"input": np.array([1, 3])})
    assert torch.equal(load_nir(graph, dt=1e-3)(x), per_step(x))
    # a LIF without leak is an IF: tau = r = inf (snnTorch's Leaky(beta=1)) or tau = 2**60 steps, r = tau / dt
    for tau, r in ((np.inf, np.inf), (2.0**60 * 1e-4, 2.0**60)):
        net = load_nir(_tiny_graph(nir.LIF(tau=three * tau, r=three * r, v_leak=three * 0, v_threshold=three)),
                       dt=1e-4)
        assert type(net.layers["lif"]).__name__ == "IF" and torch.equal(net(x), per_step(x))
    # CubaLIF with tau_syn = dt (snnTorch's Synaptic(alpha=0)): the current is the step's input, a LIF
    cuba = nir.CubaLIF(tau_syn=three * 1e-4, tau_mem=three * 4e-4, r=three * 2.0, w_in=three * 2.0,
                       v_leak=three * 0, v_threshold=three)
    lif = load_nir(_tiny_graph(cuba), dt=1e-4).layers["cubalif"]
    assert lif.params.kind == "lif" and lif.params.tau == pytest.approx(4.0) and not lif.params.decay_input
    # Norse 1.1's to_nir writes tau * dt (norse/norse#411): tau_mem = 10 ms comes out as 1e-5 s
    norse_lif = nir.LIF(tau=three * 1e-5, r=three, v_leak=three * 0, v_threshold=three)
    with pytest.raises(NIRError, match=r"0.01 steps.*norse/norse#411.*its time constant is 0.01 s \(10 steps"):
        load_nir(_tiny_graph(norse_lif), dt=1e-3)


def test_old_module_name_warns_and_names_the_package():
    # snntrain.nir_graph became the package snntrain.nir: the old import still works, with a warning naming the new one
    import importlib
    import sys

    import snntrain.nir as package

    sys.modules.pop("snntrain.nir_graph", None)
    with pytest.warns(DeprecationWarning, match=r"snntrain\.nir_graph is now snntrain\.nir"):
        old = importlib.import_module("snntrain.nir_graph")
    assert old.to_nir is package.to_nir and old.NIRError is package.NIRError and old.load_nir is package.load_nir
