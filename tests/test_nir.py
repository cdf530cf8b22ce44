"""NIR export and import: round trips for every neuron type and reset, the NIR package's own reader and
nirtorch's executor, the neuron parameter mapping, and clear refusals of what NIR (or snntrain) cannot express."""

from __future__ import annotations

import numpy as np
import pytest
import torch

nir = pytest.importorskip("nir")

from snntrain import load_nir  # noqa: E402
from snntrain.models import SEWResNet  # noqa: E402
from snntrain.nir_graph import NIRError, fold_batchnorm, neuron_from_nir, neuron_to_nir, node_map, to_nir, write_nir  # noqa: E402
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
    if neuron["type"] == "PLIF":  # a learned time constant, not the initial one
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
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)  # and the folding changes nothing here
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
    assert types == {"Input", "Conv2d", "LIF", "Scale", "AvgPool2d", "Flatten", "Affine", "Output"}
    # SEW ADD: the block's summing node takes the residual branch and the shortcut
    assert sorted(a for a, b in graph.edges if b == "layer1.0.add") == ["layer1.0.sn2", "sn1"]
    assert sorted(a for a, b in graph.edges if b == "layer2.0.add") == ["layer2.0.downsample.1", "layer2.0.sn2"]
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
    with pytest.raises(NIRError, match="CubaLIF, which has no snntrain layer"):
        load_nir(_tiny_graph(nir.CubaLIF(tau_syn=three, tau_mem=three, r=three, v_leak=three * 0, v_threshold=three)))
    with pytest.raises(NIRError, match="tau differs between neurons"):
        load_nir(_tiny_graph(nir.LIF(tau=np.array([2e-4, 3e-4, 2e-4]), r=three, v_leak=three * 0, v_threshold=three)),
                 dt=1e-4)
    with pytest.raises(NIRError, match="v_leak=0.5 != v_reset=0"):
        load_nir(_tiny_graph(nir.LIF(tau=three * 2e-4, r=three, v_leak=three * 0.5, v_threshold=three)), dt=1e-4)
    with pytest.raises(NIRError, match="r=0.5"):
        load_nir(_tiny_graph(nir.LIF(tau=three * 2e-4, r=three * 0.5, v_leak=three * 0, v_threshold=three)), dt=1e-4)
    with pytest.raises(NIRError, match="r = 1/dt"):
        load_nir(_tiny_graph(nir.IF(r=three, v_threshold=three)), dt=1e-4)
    recurrent = _tiny_graph(nir.IF(r=three * 1e4, v_threshold=three))
    recurrent.edges.append(("if", "affine"))
    with pytest.raises(NIRError, match="recurrent"):
        load_nir(recurrent, dt=1e-4)
