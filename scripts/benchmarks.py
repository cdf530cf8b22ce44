"""The registry of snntrain's benchmarks and user tools in ``scripts/``, and their runner.

Every ``scripts/bench_*.py`` but the harness is registered here with what it measures, the section of ``docs/benchmarks.md``
that holds its current results and the result files it writes into ``--out`` (each as ``<name>.csv`` and
``<name>.jsonl``, the one schema of ``scripts/bench_utils.py``'s :func:`write_rows`). The other scripts are
user tools, listed in :data:`TOOLS`; ``bench_utils.py`` (the CUDA-graph timer, the writer) and ``bench_dry.py``
(the ``--dry-run`` switch) are the shared harness and this file the registry.

    python scripts/benchmarks.py --list                 # every benchmark and tool
    python scripts/benchmarks.py NAME [ARGS ...]        # run one (e.g. ``pool --out $OUT --quick``)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str  #: file in scripts/
    measures: str
    section: str  #: heading of its section in docs/benchmarks.md (without the leading ``## ``)
    results: tuple[str, ...]  #: result names: each written as <out>/<name>.csv and <out>/<name>.jsonl
    example: str  #: a short command line (arguments after the script)


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("neurons", "bench_neurons.py",
              "multi-step LIF forward and forward+backward against SpikingJelly's implementations; --suite "
              "families|api-lif|psn: the generated neuron families, the step-function API and PSN",
              "Multi-step LIF neuron: `scripts/bench_neurons.py`",
              ("bench_neurons", "bench_neuron_families", "bench_neuron_api_lif", "bench_neurons_psn"),
              "--out $OUT --quick"),
    Benchmark("layer_norm", "bench_layer_norm.py",
              "the layer-norm kernels against torch, torch.compile and a same-bytes copy, in CUDA graphs",
              "Layer-norm (`scripts/bench_layer_norm.py`)", ("layer_norm",), "--out $OUT --quick"),
    Benchmark("giou", "bench_giou.py", "the GIoU loss kernels against torchvision's loss and a plain torch one",
              "GIoU loss (`scripts/bench_giou.py`)", ("giou",), "--out $OUT --quick"),
    Benchmark("pool", "bench_pool.py", "the max-pool of spikes against torch's pools, eager and in CUDA graphs; "
              "--stem: the stems' batch norm, neuron and max-pool fused against the separate ops",
              "Max-pool of spikes: `scripts/bench_pool.py`",
              ("bench_pool", "bench_pool_sweep", "bench_pool_stem", "bench_pool_stem_sweep"), "--out $OUT --quick"),
    Benchmark("pack", "bench_pack.py", "spikes packed into bits for a convolution's backward, against a uint8 cast",
              "Spikes packed for the backward: `scripts/bench_pack.py`", ("bench_pack",), "--out $OUT --quick"),
    Benchmark("spike_conv", "bench_spike_conv.py",
              "the FP8 convolutions of spikes against cuDNN's bf16 convolution on SEW-ResNet-18's layer shapes",
              "FP8 convolutions of spikes: `scripts/bench_spike_conv.py`", ("bench_spike_conv",),
              "--out $OUT --quick"),
    Benchmark("bn_neuron", "bench_bn_neuron.py",
              "batch norm fused with the neuron against the unfused pair and SpikingJelly, eager and in CUDA graphs",
              "Fused batch norm + neuron: `scripts/bench_bn_neuron.py`",
              ("bench_bn_neuron", "bench_bn_neuron_sweep", "bench_bn_neuron_kernels"), "--out $OUT --quick"),
    Benchmark("synops", "bench_synops.py", "the efficiency report's counting kernels against torch",
              "Efficiency report: counting kernels and validation time (`scripts/bench_synops.py`, "
              "`scripts/bench_report.py`)", ("synops",), "--out $OUT --quick"),
    Benchmark("report", "bench_report.py", "validation time with and without the efficiency report",
              "Efficiency report: counting kernels and validation time (`scripts/bench_synops.py`, "
              "`scripts/bench_report.py`)", ("bench_report",), "--out $OUT --tasks classify --repeats 2"),
    Benchmark("train", "bench_train.py",
              "whole training steps (eager, compiled, CUDA graph, the command line) against ResNet-18 and "
              "SpikingJelly", "Training steps: `scripts/bench_train.py`", ("bench_train",),
              "--out $OUT --cases sew18-32 --precisions bf16 --providers snntrain-eager resnet18-eager"),
    Benchmark("ddp", "bench_ddp.py", "multi-GPU (DDP) training speed-up over one GPU; --comm: the all-reduce",
              "Multi-GPU training (DDP): `scripts/bench_ddp.py`", ("bench_ddp", "bench_ddp_median", "bench_comm"),
              "--out $OUT --cases sew18 --devices 1 2"),
    Benchmark("loader", "bench_loader.py", "image-folder loading (CPU, GPU and DALI decode) alone and feeding a step",
              "Image-folder loading: `scripts/bench_loader.py`", ("bench_loader", "bench_loader_run"),
              "--out $OUT --quick --no-train-runs"),
    Benchmark("widerface", "bench_widerface.py", "the WIDER FACE recipe's training and validation steps",
              "WIDER FACE recipe: `scripts/bench_widerface.py`", ("bench_widerface", "bench_widerface_estimates"),
              "--out $OUT --steps 10"),
)}

#: user tools: file in scripts/ -> what it is for
TOOLS: dict[str, str] = {
    "profile_step.py": "where the time of a real training step goes (torch.profiler and cProfile over a run)",
    "real_faces.py": "a face detector on real photographs that ship with installed packages (real_faces.json)",
    "kernel_resources.py": "registers, spills and SASS digests of the Triton kernels, compiled for a GPU target "
                           "without a GPU (--family neuron|layer_norm|giou|attention|psn|spike_conv|step_neuron)",
}

#: the shared harness (the timer and writer, the --dry-run switch) and this registry
HARNESS = ("bench_utils.py", "bench_dry.py", "benchmarks.py")


def section_headings(path: Path = DOCS) -> set[str]:
    """The ``## `` headings of ``docs/benchmarks.md``."""
    return {line[3:].strip() for line in path.read_text().splitlines() if line.startswith("## ")}


def problems() -> list[str]:
    """What is out of place: a script in scripts/ neither registered nor a tool, a registered script that does not
    exist, a benchmark whose section heading is not in docs/benchmarks.md."""
    found = []
    known = {b.script for b in BENCHMARKS.values()} | set(TOOLS) | set(HARNESS)
    for path in sorted(HERE.glob("*.py")):
        if path.name not in known:
            found.append(f"scripts/{path.name} is neither a registered benchmark nor a tool")
    headings = section_headings()
    for b in BENCHMARKS.values():
        if not (HERE / b.script).is_file():
            found.append(f"{b.name}: scripts/{b.script} does not exist")
        if b.section not in headings:
            found.append(f"{b.name}: no section '## {b.section}' in docs/benchmarks.md")
    for tool in TOOLS:
        if not (HERE / tool).is_file():
            found.append(f"tool scripts/{tool} does not exist")
    return found


def listing() -> str:
    lines = ["benchmarks (python scripts/benchmarks.py NAME [ARGS ...]):"]
    for b in BENCHMARKS.values():
        lines += [f"  {b.name:11s} scripts/{b.script}: {b.measures}",
                  f"  {'':11s} results: {', '.join(f'{r}.csv/.jsonl' for r in b.results)}",
                  f"  {'':11s} docs/benchmarks.md: {b.section}",
                  f"  {'':11s} e.g. python scripts/{b.script} {b.example}"]
    lines.append("tools:")
    lines += [f"  scripts/{tool}: {what}" for tool, what in TOOLS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and not argv[0].startswith("-"):  # NAME [ARGS ...]: the arguments are the benchmark's own
        name, rest = argv[0], argv[1:]
        if name not in BENCHMARKS:
            sys.exit(f"unknown benchmark {name!r}; registered: {', '.join(BENCHMARKS)} (see --list)")
        cmd = [sys.executable, str(HERE / BENCHMARKS[name].script), *rest]
        path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
        return subprocess.call(cmd, env={**os.environ, "PYTHONPATH": path})
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage="%(prog)s --list | --check | NAME [ARGS ...]")
    p.add_argument("--list", action="store_true", help="list every benchmark and tool")
    p.add_argument("--check", action="store_true", help="check the registry against scripts/ and the docs")
    args = p.parse_args(argv)
    if args.check:
        found = problems()
        print("\n".join(found) or "registry, scripts/ and docs/benchmarks.md agree")
        return 1 if found else 0
    print(listing())
    return 0


if __name__ == "__main__":
    sys.exit(main())
