"""The benchmark scripts' rounds: scripts/bench_train.py's providers timed in rounds that take turns and their
ratios to the ResNet-18 floor; scripts/bench_ddp.py's speed-ups per round and their medians; scripts/bench_pool.py's
dry run."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from _testing import DEVICE

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch):
    module = load("bench_train")
    # the CUDA calls of the timing loop, on a CPU: memory grows by what the steps allocate
    allocated = {"now": 0, "peak": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: allocated["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: allocated["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: allocated.update(peak=allocated["now"]))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")
    return module, allocated


def test_rounds_take_turns_and_give_medians_and_per_round_ratios(bench):
    module, allocated = bench
    calls: list[str] = []
    clock = {"slow": 1.0}  # the host's speed, which drifts between rounds

    def make(provider: str, seconds: float, resident: int, transient: int):
        def build():
            allocated["now"] += resident  # the model, its inputs and optimizer state stay allocated

            def step():
                calls.append(provider)
                allocated["peak"] = max(allocated["peak"], allocated["now"] + transient)
                time.sleep(seconds * clock["slow"])
                if provider == "resnet18-eager" and len(calls) % 6 == 0:
                    clock["slow"] = 3.0 if clock["slow"] == 1.0 else 1.0

            return module.Bench("event", provider, "bf16", 16, step)
        return build

    args = SimpleNamespace(rounds=4, steps=2, warmup=1, profile=False)
    rows = module.interleaved([make("snntrain-eager", 0.004, 2**20, 2**21),
                               make("resnet18-eager", 0.003, 2**22, 2**20),
                               lambda: None], args)
    assert [r["provider"] for r in rows] == ["snntrain-eager", "resnet18-eager"]
    # warm-up of each, then rounds taking turns: 2 steps of one, 2 of the other
    assert calls[:2] == ["snntrain-eager", "resnet18-eager"]
    assert calls[2:] == (["snntrain-eager"] * 2 + ["resnet18-eager"] * 2) * 4
    ours, floor = rows
    assert ours["rounds"] == floor["rounds"] == 4 and len(ours["ms_rounds"]) == 4
    assert ours["ms_min"] <= ours["ms_per_step"] <= ours["ms_max"]
    assert ours["ms_max"] > 2 * ours["ms_min"]  # the host's drift is in the rounds...
    module.floor_ratios(rows)
    assert floor["vs_floor"] == ""
    # ...but not in the ratio of each round (sleep only ever overshoots: the ratio sits near 4/3)
    assert 1.0 < ours["vs_floor"] < 1.6
    # peak: the provider's own resident memory plus its steps' rise, not the other provider's memory
    assert ours["peak_mem_mib"] == pytest.approx((2**20 + 2**21) / 2**20)
    assert floor["peak_mem_mib"] == pytest.approx((2**22 + 2**20) / 2**20)


def test_each_row_is_set_against_the_resnet_of_its_mode_case_and_precision(bench):
    module, _ = bench

    def r(provider: str, ms: float, case: str = "event", precision: str = "bf16") -> dict:
        return module.row(case, provider, precision, 16, 0.0, ms, 0)

    rows = [r("snntrain-eager", 15.0), r("snntrain-graph", 7.0), r("snntrain-reduce-overhead", 8.0),
            r("snntrain-compile", 9.0), r("resnet18-eager", 10.0), r("resnet18-graph", 7.0),
            r("cli-eager", 20.0), r("spikingjelly", 30.0), r("snntrain-eager", 12.0, precision="fp32"),
            r("resnet18-eager", 6.0, case="sew18-224")]
    module.floor_ratios(rows)
    assert [x["vs_floor"] for x in rows] == [1.5, 1.0, "", "", "", "", 2.0, 3.0, "", ""]


def test_ddp_speedups_are_taken_per_round_and_their_median_reported():
    module = load("bench_ddp")
    rates = {(0, 1): 1000.0, (0, 2): 1900.0, (1, 1): 600.0, (1, 2): 1200.0, (2, 1): 1000.0, (2, 2): 1850.0}
    rows = [{"case": "sew18", "provider": "command line", "devices": n, "round": r, "images_per_s": v}
            for (r, n), v in rates.items()]
    rows.append({"case": "sew18", "provider": "command line", "devices": 2, "round": 3, "error": ["failed"]})
    rows += [{"case": "sew18", "provider": "bare step, whole-step graph", "devices": n, "images_per_s": v}
             for n, v in ((1, 4000.0), (2, 7800.0))]
    medians = module.speedups(rows, 1)
    assert [r.get("speedup") for r in rows] == pytest.approx([1.0, 1.9, 1.0, 2.0, 1.0, 1.85, None, 1.0, 1.95])
    two = next(m for m in medians if m["provider"] == "command line" and m["devices"] == 2)
    # the slow round's rates do not decide it: the median speed-up, not the ratio of median rates (1.85 x)
    assert two["rounds"] == 3 and two["speedup"] == pytest.approx(1.9)
    assert (two["speedup_min"], two["speedup_max"]) == pytest.approx((1.85, 2.0))
    assert two["images_per_s"] == 1850.0
    bare = next(m for m in medians if m["provider"] != "command line" and m["devices"] == 2)
    assert bare["rounds"] == 1 and bare["speedup"] == pytest.approx(1.95)


def test_model_zoo_cases_compare_equal_networks_and_their_relu_twins(bench):
    """Each model-zoo case builds the network that SpikingJelly's constructor of the same name builds (equal
    parameter counts; on the meta device, no memory), and its ReLU twin is the same network without a neuron."""
    from snntrain.models import build_model
    from snntrain.nn import BaseNeuron, NormNeuron, SpikeMaxPool2d

    module, _ = bench
    zoo = [case for case, c in module.CASES.items() if "model" in c and case not in module.TRANSFORMER_CASES]
    assert {module.CASES[c]["model"]["variant"] for c in zoo} == {"spiking_vgg11_bn", "ms_resnet18", "spiking_resnet18"}
    with torch.device("meta"):
        for case in zoo:
            ours, theirs = module.zoo_model(case, "torch"), module.sj_network(case)
            assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters()), case
    rows = [module.row("ms_resnet18-224", p, "bf16", 32, 0.0, ms, 0) for p, ms in
            (("snntrain-eager", 9.0), ("relu-eager", 6.0), ("spikingjelly", 30.0), ("snntrain-graph", 4.0))]
    module.floor_ratios(rows)
    assert [r["vs_floor"] for r in rows] == [1.5, "", 5.0, ""]  # no relu-graph row: no ratio for the graph

    torch.manual_seed(0)
    for name, variant in (("ms_resnet", "ms_resnet18"), ("spiking_vgg", "spiking_vgg11_bn")):
        net = build_model({"name": name, "variant": variant, "num_classes": 3, "in_channels": 1, "T": 1, "width": 2,
                           **({"classifier": "linear"} if name == "spiking_vgg" else {"stem": "cifar"})},
                          backend="torch")
        keys = {k for k in net.state_dict() if ".neuron." not in k}
        twin = module.relu_twin(net)
        assert not any(isinstance(m, (BaseNeuron, NormNeuron, SpikeMaxPool2d)) for m in twin.modules())
        assert set(twin.state_dict()) == keys  # the same weights, only the neurons gone
        out = twin(torch.randn(4, 1, 8, 8))
        out.sum().backward()
        assert out.shape == (4, 3) and all(p.grad is not None for p in twin.parameters())


@pytest.mark.slow  # a fresh interpreter running the script's code paths in Triton's interpreter
def test_bench_pool_dry_run(tmp_path):
    """scripts/bench_pool.py --dry-run (tiny shapes, fake times, no GPU) writes a row per case, mode and provider,
    with and without --stem."""
    import csv
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(SCRIPTS.parent)}
    res = subprocess.run([sys.executable, str(SCRIPTS / "bench_pool.py"), "--dry-run", "--quick", "--dtypes", "bf16",
                          "--formats", "cl", "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(tmp_path / "bench_pool.csv") as f:
        rows = list(csv.DictReader(f))
    # --quick: the 224 stem's max-pool (ours and torch) and the head's average pool (torch), four modes each
    assert len(rows) == 3 * 4
    assert {r["provider"] for r in rows} == {"ours-triton", "torch"}
    assert all(r["note"].startswith("saved for backward") for r in rows)
    # --stem --quick: the 224 stem's batch norm, neuron and max-pool, fused and separate, four modes each
    res = subprocess.run([sys.executable, str(SCRIPTS / "bench_pool.py"), "--dry-run", "--quick", "--stem", "--dtypes",
                          "bf16", "--formats", "cl", "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(tmp_path / "bench_pool_stem.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 4 and {r["provider"] for r in rows} == {"ours-fused", "ours-separate"}


def test_bench_spike_conv_dry_run(tmp_path):
    """scripts/bench_spike_conv.py --dry-run (tiny shapes, fake times, no GPU) checks the FP8 convolution against
    its reference on every shape and writes a row per shape and provider and the network's totals; --sweep writes
    a line per shape."""
    import csv
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(SCRIPTS.parent)}
    script = str(SCRIPTS / "bench_spike_conv.py")
    res = subprocess.run([sys.executable, script, "--dry-run", "--out", str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(tmp_path / "bench_spike_conv.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 10 * 3 + 3
    assert {r["provider"] for r in rows} == {"cudnn-bf16", "ours-fp8", "ours-fp8-conv"}
    total = {r["provider"]: float(r["ms"]) for r in rows if r["benchmark"] == "spike_conv/sew18-224/all"}
    assert total == {"cudnn-bf16": 19.0, "ours-fp8": 19.0, "ours-fp8-conv": 19.0}  # 19 layers of fake 1 ms
    res = subprocess.run([sys.executable, script, "--dry-run", "--sweep", "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = (tmp_path / "bench_spike_conv_sweep.txt").read_text().splitlines()
    assert len(lines) == 10 and lines[0].startswith("layer1 128x64x56x56 -> 64, 3x3/1: cudnn 1.0000; default (")
    assert "(128, 256, 128, 8, 8, 3)" not in lines[0] and "(128, 256, 128, 8, 8, 3): 1.0000" in lines[-1]
    assert "default in registers: 1.0000" in lines[0]


def test_bench_pack_dry_run(tmp_path):
    """scripts/bench_pack.py --dry-run (tiny shapes, fake times, no GPU) checks every provider's round trip and writes
    a row per case, width, provider and mode."""
    import csv
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(SCRIPTS.parent)}
    res = subprocess.run([sys.executable, str(SCRIPTS / "bench_pack.py"), "--dry-run", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(tmp_path / "bench_pack.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 3 * 3
    assert {r["provider"] for r in rows} == {"ours-triton", "ours-torch", "torch-uint8"}
    moved = {(r["benchmark"], r["op"], r["provider"], r["mode"]): int(r["bytes"]) for r in rows}
    n = 2 * 16 * 5 * 5  # the dry run's map: bf16, 2 bytes an element, kept in 1 or 2 bits, or a byte
    assert moved[("pack/sew18-224/stem", "pack1", "ours-triton", "pack")] == 2 * n + n // 8
    assert moved[("pack/sew18-224/stem", "pack2", "ours-torch", "pack+unpack")] == 2 * (2 * n + n // 4)
    assert moved[("pack/sew18-224/stem", "pack1", "torch-uint8", "unpack")] == 2 * n + n


def test_the_alif_case_is_the_lif_network_with_alif_neurons(bench):
    """``sew18-224-alif`` builds the ``sew18-224`` network (same parameters) with every neuron an ALIF, and its
    command line names the type."""
    from snntrain.nn import ALIF, LIF

    module, _ = bench
    with torch.device("meta"):
        lif, alif = module.sew_model("sew18-224", "torch"), module.sew_model("sew18-224-alif", "torch")
    assert sum(p.numel() for p in lif.parameters()) == sum(p.numel() for p in alif.parameters())
    kinds = {type(m) for m in alif.modules()} & {ALIF, LIF}
    assert kinds == {ALIF} and any(isinstance(m, LIF) for m in lif.modules())
    assert "model.neuron.type=ALIF" in module.cli_overrides("sew18-224-alif", "bf16", 10)


def test_the_addafter_case_holds_the_folded_add_off(bench):
    """``sew18-224-addafter`` is ``sew18-224`` (same weights) with every block's ADD as an addition after its last
    norm-neuron: at test size on the CPU, the same logits, and an addition of the blocks' size per block."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Adds(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func is torch.ops.aten.add.Tensor and args[0].dim() == 5
            return func(*args, **(kwargs or {}))

    module, _ = bench
    case = dict(module.CASES["sew18-224"])
    module.CASES["tiny"] = {**case, "size": 16, "batch": 1}
    module.CASES["tiny-addafter"] = {**case, "size": 16, "batch": 1, "add_after": True}
    try:
        folded, after = module.sew_model("tiny", "triton"), module.sew_model("tiny-addafter", "triton")
    finally:
        del module.CASES["tiny"], module.CASES["tiny-addafter"]
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0)).to(DEVICE)  # CUDA, or the interpreter
    counts = []
    with torch.no_grad():
        for m in (folded.to(DEVICE), after.to(DEVICE)):
            adds = Adds()
            with adds:
                y = m(x)
            counts.append((y, adds.n))
    assert torch.equal(counts[0][0], counts[1][0])
    assert counts[0][1] == 0 and counts[1][1] == 8
    with torch.device("meta"):  # Spiking ResNet's: each block's last neuron watched, nothing else
        plain, after = (module.zoo_model(c, "torch") for c in ("spiking_resnet18-224", "spiking_resnet18-224-addafter"))
    assert plain.state_dict().keys() == after.state_dict().keys()
    hooked = [n for n, m in after.named_modules() if m._forward_hooks]
    assert len(hooked) == 8 and all(n.endswith(".sn2") for n in hooked), hooked
    assert not any(m._forward_hooks for m in plain.modules())


def test_the_bytes_case_keeps_spike_inputs_packed_and_relu_twins_have_plain_convolutions(bench):
    """``sew18-224-bytes`` builds ``sew18-224`` (same state dict) with its convolutions of spikes as ``SpikeConv2d``,
    and says so on its command line; a ReLU twin's convolutions are plain (their inputs are real values), with the
    network's parameters."""
    from snntrain.nn.layers import SpikeConv2d

    module, _ = bench
    with torch.device("meta"):
        off, on = module.sew_model("sew18-224", "torch"), module.sew_model("sew18-224-bytes", "torch")
    assert on.state_dict().keys() == off.state_dict().keys()
    assert sum(isinstance(m, SpikeConv2d) for m in on.modules()) == 19
    assert on.layer1[0].conv2[0].bits == 1 and on.layer1[1].conv1[0].bits == 2  # spikes; ADD's sums up to 2
    assert not any(isinstance(m, SpikeConv2d) for m in off.modules())
    assert "model.spike_bytes=true" in module.cli_overrides("sew18-224-bytes", "bf16", 10)
    assert not any("spike_bytes" in o for o in module.cli_overrides("sew18-224", "bf16", 10))
    fp8 = module.cli_overrides("sew18-224-fp8", "bf16", 10)
    assert "model.spike_fp8=true" in fp8 and "model.spike_bytes=true" in fp8
    assert not any("spike_fp8" in o for o in module.cli_overrides("sew18-224-bytes", "bf16", 10))
    weight = on.layer1[0].conv1[0].weight
    twin = module.relu_twin(on)
    assert not any(isinstance(m, SpikeConv2d) for m in twin.modules())
    assert twin.layer1[0].conv1[0].weight is weight


def test_graph_timer_times_eagerly_and_says_so_where_nothing_can_be_captured(monkeypatch):
    """scripts/bench_utils.graph_ms: calls that cannot be captured in a CUDA graph (here: no CUDA at all) are
    timed eagerly, every call once per timed run, the time divided by the number of calls, and the note says so."""
    bu = load("bench_utils")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def no_capture(*args, **kwargs):
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(torch.cuda, "Stream", no_capture)
    ran: list[int] = []
    timed: list[int] = []

    def timer(fn):
        before = len(ran)
        fn()
        timed.append(len(ran) - before)
        return 6.0

    ms, note = bu.graph_ms([lambda: ran.append(0), lambda: ran.append(1), lambda: ran.append(2)], timer=timer)
    assert ms == pytest.approx(2.0) and note == "eager timing (RuntimeError)"
    assert timed == [3] and ran == [0, 1, 2]
    ms, note = bu.graph_ms(lambda: ran.append(3), timer=timer)  # one callable
    assert ms == pytest.approx(6.0) and note.startswith("eager timing")
    with pytest.raises(ValueError, match="at least one call"):
        bu.graph_ms([], timer=timer)


def test_result_writer_writes_csv_and_json_lines_in_one_schema(tmp_path):
    """scripts/bench_utils.write_rows: kernel rows and a system benchmark's dicts alike give <name>.csv and
    <name>.jsonl with their own columns first, then the common fields; a row's own value of a common field wins."""
    import csv
    import json

    bu = load("bench_utils")
    kernel = bu.Row("neurons/tutorial", "lif", "fwd", "ours-triton", "bf16", "4x8", 0.5, 1000, gpu="H200")
    system = {"case": "sew18", "devices": 2, "images_per_s": 1850.0, "error": ["failed"]}
    for name, rows, own in (("k", [kernel], ["benchmark", "op", "mode", "provider", "dtype", "shape", "ms", "bytes"]),
                            ("s", [system], ["case", "devices", "images_per_s", "error"])):
        csv_path, jsonl_path = bu.write_rows(rows, tmp_path, name, gpus=2)
        assert (csv_path, jsonl_path) == (tmp_path / f"{name}.csv", tmp_path / f"{name}.jsonl")
        with open(csv_path) as f:
            reader = csv.DictReader(f)
            header, got = reader.fieldnames, list(reader)
        lines = [json.loads(line) for line in jsonl_path.read_text().splitlines()]
        assert header[:len(own)] == own and set(bu.COMMON) | {"gpus"} <= set(header)
        assert list(lines[0]) == header and len(got) == len(lines) == 1
        assert lines[0]["torch"] == torch.__version__ and lines[0]["command"].startswith("python ")
        assert lines[0]["gpus"] == 2 and lines[0]["date"]
    assert lines[0]["error"] == ["failed"] and got[0]["error"] == '["failed"]'  # lists as JSON text in the CSV
    assert json.loads((tmp_path / "k.jsonl").read_text())["gpu"] == "H200"  # the row's own device
    assert json.loads((tmp_path / "s.jsonl").read_text())["gpu"] == bu.gpu_name()


def test_every_benchmark_is_registered_exists_and_has_its_section():
    """scripts/benchmarks.py: every scripts/bench_*.py is registered (and every other script a tool or the harness),
    every registered script exists, and its section heading is in docs/benchmarks.md."""
    reg = load("benchmarks")
    registered = {b.script for b in reg.BENCHMARKS.values()}
    assert {p.name for p in SCRIPTS.glob("bench_*.py")} - set(reg.HARNESS) == registered
    assert all((SCRIPTS / s).is_file() for s in registered | set(reg.TOOLS))
    headings = reg.section_headings()
    assert all(b.section in headings for b in reg.BENCHMARKS.values())
    assert reg.problems() == []
    listing = reg.listing()
    assert all(f"scripts/{b.script}" in listing for b in reg.BENCHMARKS.values())


def test_the_runner_refuses_an_unknown_benchmark_naming_the_registered_ones():
    reg = load("benchmarks")
    with pytest.raises(SystemExit, match="unknown benchmark 'nope'; registered: neurons, "):
        reg.main(["nope"])


def test_a_sweep_sets_each_configuration_restores_it_and_reports_failures(capsys):
    """``bench_neurons.run_sweep`` (the PSN and layer-norm tile sweeps): each configuration's names are set while its
    cases run and restored after, the plans are forgotten on each change, a case that raises is named by its error
    and one past the deadline is reported as out of time."""
    bn = load("bench_neurons")
    tuning = SimpleNamespace(TILE=512, WARPS=4)
    cleared = []

    def cell(case):
        if case == "bad":
            raise RuntimeError("launch failed")
        return f"{tuning.TILE}/{tuning.WARPS}"

    configs = (("default", {}), ("tile 256", {"TILE": 256}), ("8 warps", {"WARPS": 8}))
    bn.run_sweep(configs, tuning, lambda: cleared.append(1), ["ok", "bad"], str, cell, time.time() + 60)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["default: ok: 512/4; bad: RuntimeError", "tile 256: ok: 256/4; bad: RuntimeError",
                     "8 warps: ok: 512/8; bad: RuntimeError"]
    assert (tuning.TILE, tuning.WARPS) == (512, 4) and len(cleared) == 6
    bn.run_sweep(configs[:1], tuning, lambda: None, ["ok"], str, cell, time.time() - 1)
    assert capsys.readouterr().out.strip() == "default: skipped, out of time budget"


def test_a_sweep_can_be_narrowed_to_named_configurations_and_refuses_an_unknown_one(monkeypatch):
    """``--config TEXT``: the default plus the configurations whose label contains TEXT, in their order; a text
    that matches no label names the labels."""
    bn = load("bench_neurons")
    configs = (("default", {}), ("tile 256", {"TILE": 256}), ("8 warps", {"WARPS": 8}), ("tile 1024", {"TILE": 1024}))
    assert bn.select_configs(configs, None) == configs
    assert [label for label, _ in bn.select_configs(configs, ["tile"])] == ["default", "tile 256", "tile 1024"]
    assert [label for label, _ in bn.select_configs(configs, ["warps", "1024"])] == ["default", "8 warps", "tile 1024"]
    with pytest.raises(SystemExit, match="'16 warps' matches no sweep configuration; the labels are: 'default', "):
        bn.select_configs(configs, ["16 warps"])
    with pytest.raises(SystemExit, match="needs --sweep with --suite psn or api-lif"):
        monkeypatch.setattr(sys, "argv", ["bench_neurons.py", "--out", "x", "--suite", "families", "--config", "tile"])
        bn.main()


def test_generated_summary_sets_the_graph_time_beside_the_eager_ratio():
    """``bench_neurons.generated_summary``: a family's line gives the eager ratio against the target and our GPU
    time from the graph replay (flagging an eager row that the host decides); the StepNeuron LIF's line the graph
    ratio beside the eager one."""
    bn = load("bench_neurons")
    row = dict(family="KLIF", dtype="bf16", T=16, output_sum=5)
    rows = [dict(row, bench="families", provider="ours", ms=0.857, graph_ms=0.34, peak_mib=144),
            dict(row, bench="families", provider="sj-node", ms=11.07, peak_mib=1584),
            dict(row, bench="families", provider="sj-flexsn", ms=1.399, peak_mib=1584),
            dict(row, bench="api_lif", family="LIF", provider="api", ms=0.5, graph_ms=0.3, peak_mib=1),
            dict(row, bench="api_lif", family="LIF", provider="hand-written", ms=0.45, graph_ms=0.25, peak_mib=1)]
    family, api = bn.generated_summary(rows)
    assert "vs sj-flexsn 1.399 ms = 1.63x (target >= 2x: MISS)" in family
    assert "our GPU time (graph) 0.340 ms = 4.11x (the eager row is host-bound)" in family
    assert "= 1.11x (target <= 1.15x: PASS); graph 0.300 vs 0.250 ms = 1.20x" in api
    rows[0]["ms"] = 0.36  # an eager row near its GPU time is not flagged
    assert "host-bound" not in bn.generated_summary(rows)[0]


def test_graph_replays_start_from_no_input_gradient(monkeypatch):
    """``bench_neurons._graph_ms``: each captured call sets the input's gradient to None first, as the eager timing
    does, so a replay does not also add it to the last replay's; a capture that fails gives None."""
    bn = load("bench_neurons")
    leaf = torch.ones(3, requires_grad=True)
    seen = []

    def step():
        seen.append(leaf.grad)
        (leaf * 2).sum().backward()

    def graph_ms(fn, quick):
        fn()
        fn()
        return 0.5, ""

    monkeypatch.setattr(bn.bu, "graph_ms", graph_ms)
    assert bn._graph_ms(leaf, step) == 0.5 and seen == [None, None]
    monkeypatch.setattr(bn.bu, "graph_ms", lambda fn, quick: (0.7, "eager timing (no CUDA)"))
    assert bn._graph_ms(leaf, step) is None
