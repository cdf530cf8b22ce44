"""NIR graphs in the libraries that read and write them, as shipped: snnTorch 1.0, Norse 1.1 and SpikingJelly 2.0
import what ``export.nir_target`` writes for each (the default classifier with its CIFAR and ImageNet stems, IF,
LIF and PLIF, and for Norse a detector's backbone), and ``snntrain.load_nir`` reads what they (and Sinabs) write.

Each importer steps one time step per call. snnTorch's and Norse's ``Flatten`` flattens from dimension 0 (the
batch-free NIR convention), so classifiers run there one sample at a time. The reference is the export folder
loaded with ``snntrain.load_exported`` (the unfolded model): the importers run the graph's folded convolutions,
so logits agree to float32 rounding and a membrane within rounding of a threshold may fire in one and not the
other; such inputs are counted (``EDGE_ATOL``) and printed, and the class must agree on every input.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import pytest
import torch

nir = pytest.importorskip("nir")

from hydra import compose, initialize_config_module  # noqa: E402  (after the importorskip above)

from snntrain import load_exported, load_nir  # noqa: E402
from snntrain.cli import resolved_config  # noqa: E402
from snntrain.export import export_checkpoint  # noqa: E402
from snntrain.models import build_model  # noqa: E402
from snntrain.nir import NIRError  # noqa: E402
from test_nir import firing  # noqa: E402

#: a logit further than this from load_exported's is a threshold-edge case (float32 rounding is ~1e-7 here)
EDGE_ATOL = 1e-4
T = 3
CLASSIFIER = ["backend=torch", f"T={T}", "model.width=4", "data.image_size=8", "logger=none"]
DETECTOR = ["task=detect", "backend=torch", f"T={T}", "model.width=4", "model.head.fpn_channels=8",
            "model.head.num_convs=1", "data.image_size=32", "logger=none"]
VARIANTS = {  # the default classifier (LIF, CIFAR stem), and IF, PLIF and the ImageNet stem's max pool
    "default": [],
    "IF-imagenet": ["model.neuron.type=IF", "~model.neuron.tau", "~model.neuron.decay_input", "model.stem=imagenet",
                    "data.image_size=16"],
    "PLIF": ["model.neuron.type=PLIF", "model.neuron.tau=3.0"],
}


def need(module: str):
    return pytest.importorskip(module, reason=f"{module} is a test dependency: pip install -e '.[dev]'")


def checkpoint(path: Path, overrides: list[str], seed: int = 0) -> Path:
    """An snntrain checkpoint of the model ``overrides`` configure, with BatchNorm statistics that keep every
    layer firing (what a trained model has; a few training batches leave most layers silent)."""
    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"paths.output_dir={path.parent}"])
    config = resolved_config(cfg)
    torch.manual_seed(seed)
    model = firing(build_model(config["model"], backend="torch"), dict(config["model"]["neuron"]), seed)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": {"config": config}, "epoch": 0, "global_step": 0}, path)
    return path


def images(card: dict, n: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn([n, *card["input_shape"][1:]], generator=torch.Generator().manual_seed(seed))


def run_snntorch(path: Path, x: torch.Tensor) -> torch.Tensor:
    """snnTorch 1.0: ``import_from_nir(nir.read(path))``, T calls per sample; the mean over T of the outputs."""
    from snntorch.import_nir import import_from_nir

    with contextlib.redirect_stdout(io.StringIO()):  # it prints what it does
        net = import_from_nir(nir.read(str(path)))
    logits = []
    for image in x:
        for m in net.modules():  # init_hidden neurons keep their membrane between calls
            if hasattr(m, "reset_mem"):
                m.reset_mem()
        with torch.no_grad():
            logits.append(torch.stack([net(image)[0] for _ in range(T)]).mean(0))
    return torch.stack(logits)


def run_norse(path: Path, x: torch.Tensor, dt: float) -> torch.Tensor:
    """Norse 1.1: ``norse.torch.from_nir(nir.read(path), dt=dt)``, T calls per sample with its state."""
    import norse.torch as norse

    net = norse.from_nir(nir.read(str(path)), dt=dt)
    logits = []
    for image in x:
        state, steps = None, []
        with torch.no_grad():
            for _ in range(T):
                out, state = net(image, state)
                steps.append(out)
        logits.append(torch.stack(steps).mean(0))
    return torch.stack(logits)


def run_spikingjelly(path: Path, x: torch.Tensor, dt: float) -> torch.Tensor:
    """SpikingJelly 2.0: ``import_from_nir(path, dt=dt)``, T calls on the batch with its state."""
    from spikingjelly.activation_based.nir_exchange import import_from_nir

    net = import_from_nir(str(path), dt=dt)
    state, steps = None, []
    with torch.no_grad():
        for _ in range(T):
            out, state = net(x, state)
            steps.append(out)
    return torch.stack(steps).mean(0)


RUNNERS = {"snntorch": lambda p, x, dt: run_snntorch(p, x), "norse": run_norse, "spikingjelly": run_spikingjelly}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("target", list(RUNNERS))
def test_exported_classifier_runs_in_the_importer(target, variant, tmp_path):
    need(target)
    logging.getLogger().setLevel(logging.ERROR)  # Norse logs a warning for every IF with r != 1
    ckpt = checkpoint(tmp_path / "model.ckpt", [*CLASSIFIER, *VARIANTS[variant]])
    card = export_checkpoint(ckpt, tmp_path / "export", formats=["safetensors", "nir"], backend="torch",
                             nir_target=target)
    assert card["nir_target"] == target and card["nir_max_abs_diff"] < 1e-5
    x = images(card)
    with torch.no_grad():
        want = load_exported(tmp_path / "export", backend="torch")(x)
    got = RUNNERS[target](tmp_path / "export" / "model.nir", x, card["nir_dt"])
    diff = (got - want).abs().amax(-1)
    edge = int((diff > EDGE_ATOL).sum())
    print(f"{target} {variant}: {len(x)} inputs, same class on {int((got.argmax(-1) == want.argmax(-1)).sum())}, "
          f"largest logit difference {float(diff.max()):.2g}, threshold-edge inputs {edge}")
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert edge == 0 and float(want.std()) > 0  # logits that differ between inputs: the network is not silent


def test_exported_detector_backbone_runs_in_norse(tmp_path):
    """Norse's executor returns the last node it runs and keeps every node's output of the step in its state's
    cache: the backbone's stage outputs, batched (no Flatten in a backbone). Norse ignores LIF's r, so the
    detector's default decay_input=false is refused, naming every neuron; with decay_input=true it runs."""
    norse = need("norse.torch")
    logging.getLogger().setLevel(logging.ERROR)
    with pytest.raises(NIRError, match=r"LIF with r=2: Norse 1.1's LIFBoxCell ignores r .*\(nodes: sn1, layer1.0.sn1"):
        export_checkpoint(checkpoint(tmp_path / "default.ckpt", DETECTOR), tmp_path / "refused", formats=["nir"],
                          nir_target="norse")
    assert not (tmp_path / "refused").exists()
    ckpt = checkpoint(tmp_path / "model.ckpt", [*DETECTOR, "model.neuron.decay_input=true"])
    card = export_checkpoint(ckpt, tmp_path / "export", formats=["safetensors", "nir"], backend="torch",
                             nir_target="norse")
    assert card["nir_dt"] == 1e-3  # Norse's convention, from_nir's default
    x = images(card, n=4)
    with torch.no_grad():
        want = load_exported(tmp_path / "export", backend="torch").model.backbone.forward_features(x)
    net = norse.from_nir(nir.read(str(tmp_path / "export" / "model.nir")))
    state, got = None, {f"stage{i}": [] for i in range(1, len(want) + 1)}
    with torch.no_grad():
        for _ in range(T):
            _, state = net(x, state)
            for name, steps in got.items():
                steps.append(state.cache[name])
    for i, w in enumerate(want, start=1):
        g = torch.stack(got[f"stage{i}"])
        print(f"norse detector stage{i}: {int((g != w).sum())} of {w.numel()} values differ, "
              f"mean {float(w.mean()):.2f}")
        assert torch.equal(g, w) and float(w.std()) > 0


def test_detector_backbone_is_refused_for_snntorch_and_spikingjelly(tmp_path):
    """nirtorch.nir_to_torch, which both import with, never returns on a graph with several Output nodes: the
    export names them instead of writing a file that hangs the importer."""
    ckpt = checkpoint(tmp_path / "model.ckpt", DETECTOR)
    for target in ("snntorch", "spikingjelly"):
        with pytest.raises(NIRError, match=r"loops forever .*\(nodes: stage1, stage2, stage3\)"):
            export_checkpoint(ckpt, tmp_path / target, formats=["safetensors", "nir"], nir_target=target)
        assert not (tmp_path / target).exists()


def test_cli_export_for_a_target(tmp_path):
    """task=export with export.nir_target: the graph for that reader with its dt; a name that is no target
    fails before anything is read or written."""
    from snntrain.cli import run

    ckpt = checkpoint(tmp_path / "model.ckpt", CLASSIFIER)

    def export(*overrides):
        with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
            return run(compose(config_name="config", overrides=[
                "task=export", f"ckpt_path={ckpt}", "export.formats=[nir]", f"paths.output_dir={tmp_path}",
                *overrides]))

    card = export(f"export.dir={tmp_path / 'norse'}", "export.nir_target=norse")
    graph = nir.read(str(tmp_path / "norse" / "model.nir"))
    assert card["nir_target"] == "norse" and graph.metadata["target"] == "norse" and graph.metadata["dt"] == 1e-3
    assert "NIR graph for norse" in card["files"]["model.nir"]
    with pytest.raises(ValueError, match="export.nir_target='loihi' is not valid; choose one of spec, snntorch, norse"):
        export(f"export.dir={tmp_path / 'loihi'}", "export.nir_target=loihi")
    assert not (tmp_path / "loihi").exists()


# ----------------------------------------------------------------------------- graphs they write


def events(n: int = 8, shape: tuple[int, ...] = (2, 8, 8), steps: int = 20) -> torch.Tensor:
    return (torch.rand(steps, n, *shape, generator=torch.Generator().manual_seed(3)) < 0.3).float()


def test_load_nir_reads_what_snntorch_writes():
    """snnTorch's export_to_nir: Conv2d, Leaky (LIF with r = tau/dt at dt = 1e-4), Synaptic with alpha = 0
    (a CubaLIF with tau_syn = dt), Linear. Its neurons match NIR's with reset_mechanism="zero" and
    reset_delay=False; export_to_nir needs per-neuron beta and threshold tensors (a scalar fails nir's type
    inference) and ignore_dims=[0]."""
    snn = need("snntorch")
    from snntorch.export_nir import export_to_nir

    def neuron(kind, shape, beta, threshold=1.0, **kw):
        full = {"beta": torch.full(shape, beta), "threshold": torch.full(shape, threshold)}
        if kind is snn.Synaptic:
            full["alpha"] = torch.zeros(shape)
        return kind(**full, init_hidden=True, reset_mechanism="zero", reset_delay=False, **kw)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), neuron(snn.Leaky, (4, 8, 8), 0.8),
                              torch.nn.Flatten(), torch.nn.Linear(256, 6), neuron(snn.Synaptic, (6,), 0.7, 0.5),
                              torch.nn.Linear(6, 3), neuron(snn.Leaky, (3,), 0.9, 0.5, output=True))
    with torch.no_grad():
        net[0].weight.mul_(3)
        net[3].weight.mul_(3)
        net[5].weight.mul_(3)
    with contextlib.redirect_stdout(io.StringIO()):
        graph = export_to_nir(net, torch.zeros(1, 2, 8, 8), ignore_dims=[0])
    x = events()
    with torch.no_grad():
        want = torch.stack([net(step)[0] for step in x])
    got = load_nir(graph)(x)  # no metadata: dt = 1e-4, snnTorch's
    print(f"snnTorch -> load_nir: {int((got != want).sum())} of {want.numel()} spikes differ, "
          f"rate {float(want.mean()):.2f}")
    assert torch.equal(got, want) and 0 < float(want.mean()) < 1
    graph.nodes["4"].tau_syn = graph.nodes["4"].tau_syn * 3  # alpha > 0: a synaptic current snntrain lacks
    with pytest.raises(NIRError, match="node '4': CubaLIF with tau_syn=0.0003 s .*no synaptic current"):
        load_nir(graph)


def test_load_nir_reads_what_norse_writes():
    """Norse's to_nir: Conv2d and IAFCell (IF with r = 1: the input added unscaled each step), an Input with
    the sample's batch dimension, scalar parameters; nir.write cannot store such a graph (scalars, and a
    Conv2d without input_type), so it is read from memory. Its LIFBoxCell comes out with tau multiplied by dt
    (norse/norse#411), which load_nir refuses, saying so."""
    norse = need("norse.torch")
    torch.manual_seed(0)
    net = norse.SequentialState(torch.nn.Conv2d(2, 4, 3, padding=1),
                                norse.IAFCell(norse.IAFParameters(v_th=torch.tensor(0.8))),
                                torch.nn.Conv2d(4, 3, 3), norse.IAFCell())
    with torch.no_grad():
        net[0].weight.mul_(3)
        net[2].weight.mul_(3)
    graph = norse.to_nir(net, torch.zeros(1, 2, 8, 8))
    assert list(graph.nodes["input"].input_type["input"]) == [1, 2, 8, 8]
    x, state, spikes = events(), None, []
    with torch.no_grad():
        for step in x:
            out, state = net(step, state)
            spikes.append(out)
    want, got = torch.stack(spikes), load_nir(graph, dt=1e-3)(x)
    print(f"Norse -> load_nir: {int((got != want).sum())} of {want.numel()} spikes differ, "
          f"rate {float(want.mean()):.2f}")
    assert torch.equal(got, want) and 0 < float(want.mean()) < 1
    lif = norse.to_nir(norse.SequentialState(torch.nn.Linear(4, 3), norse.LIFBoxCell()), torch.zeros(1, 4))
    with pytest.raises(NIRError, match=r"norse/norse#411.*time constant is 0.01 s \(10 steps of 0.001 s\)"):
        load_nir(lif, dt=1e-3)


def test_load_nir_reads_what_spikingjelly_writes(tmp_path):
    """SpikingJelly's export_to_nir uses snntrain's conventions (IF r = 1/dt, LIF tau = tau_steps dt, r = 1 or
    tau_steps, v_leak = v_reset) at dt = 1e-4, and writes files nir.read reads."""
    need("spikingjelly")
    from spikingjelly.activation_based import functional, layer, neuron
    from spikingjelly.activation_based.nir_exchange import export_to_nir

    torch.manual_seed(0)
    net = torch.nn.Sequential(layer.Conv2d(2, 4, 3, padding=1), neuron.IFNode(v_threshold=0.8), layer.AvgPool2d(2),
                              layer.Flatten(), layer.Linear(64, 5), neuron.LIFNode(tau=2.5, decay_input=False),
                              layer.Linear(5, 3), neuron.ParametricLIFNode(init_tau=3.0, v_threshold=0.3))
    with torch.no_grad():
        net[0].weight.mul_(3)
        for lin in (net[4], net[6]):
            lin.weight.mul_(6)
            lin.bias.add_(0.5)
    functional.set_step_mode(net, "m")
    export_to_nir(net, torch.zeros(1, 1, 2, 8, 8), save_path=str(tmp_path / "sj.nir"))
    x = events()
    functional.reset_net(net)
    with torch.no_grad():
        want = net(x)
    got = load_nir(tmp_path / "sj.nir")(x)
    print(f"SpikingJelly -> load_nir: {int((got != want).sum())} of {want.numel()} spikes differ, "
          f"rate {float(want.mean()):.2f}")
    assert torch.equal(got, want) and 0 < float(want.mean()) < 1


def test_load_nir_reads_what_sinabs_writes():
    """Sinabs' to_nir: IAF as IF with r = 1 (unscaled each step), SumPool2d, no input_type on convolutions
    (read from memory). NIR's IF is a single spike with a reset to 0, which in Sinabs is
    spike_fn=SingleSpike, reset_fn=MembraneReset (its defaults, MultiSpike and MembraneSubtract, are not
    recorded in the graph)."""
    pytest.importorskip("sinabs", reason="sinabs 3.1 requires nir<=1.0.4 and snntrain nir>=1.0.6: it is not a "
                                         "test dependency")
    import sinabs.layers as sl
    from sinabs.activation import MembraneReset, SingleSpike
    from sinabs.nir import to_nir as sinabs_to_nir

    steps, n = 20, 4

    def iaf(threshold):
        return sl.IAFSqueeze(batch_size=n, spike_threshold=threshold, spike_fn=SingleSpike, reset_fn=MembraneReset())

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), iaf(0.8), sl.SumPool2d(2), torch.nn.Flatten(),
                              torch.nn.Linear(64, 5), iaf(0.5))
    with torch.no_grad():
        net[0].weight.mul_(3)
        net[4].weight.mul_(3)
    x = events(n=n, steps=steps)
    with torch.no_grad():  # Sinabs' squeeze layers take [B * T, ...], batch major
        want = net(x.transpose(0, 1).reshape(n * steps, 2, 8, 8)).reshape(n, steps, 5).transpose(0, 1)
    got = load_nir(sinabs_to_nir(net, torch.zeros(n * steps, 2, 8, 8)))(x)
    assert torch.equal(got, want) and 0 < float(want.mean()) < 1
