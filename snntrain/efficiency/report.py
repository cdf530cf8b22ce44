"""The report from the counts: NeuroBench's static metrics, the energy models, :func:`build_report` (every
value with its unit and basis) and the report as markdown tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .geometry import connection_layers

#: Version of the report's layout (``report["format"]``).
FORMAT = "snntrain-efficiency-2"

#: What the report's values are per: the ``basis`` section of every report (its counts with them).
BASIS = {
    "per_sample": "one forward pass of one input (an image, or an event sequence) over all T time steps, summed "
                  "over the steps as NeuroBench does; a detector's flip test passes each image twice, each pass "
                  "a sample",
    "per_time_step": "per sample divided by T",
}

#: The unit of every value of a report, by its path (``layers[].x``: every layer's ``x``; ``energy[].x``: every
#: energy model's ``x``; a section's ``.*``: every value in it): the report's ``units`` section.
UNITS = {
    "T": "time steps per sample",
    "global_step": "optimizer steps trained when the report was counted",
    "metrics.*": "the task's validation metrics, as logged (task=report)",
    "model.*": "the checkpoint's model settings (task=report)",
    "samples": "samples counted (forward passes of one input)",
    "basis.batch_size": "inputs per forward pass (the largest batch counted, per process)",
    "basis.forward_passes": "batched forward passes counted, all processes",
    "basis.processes": "processes that counted (DDP), their counts added",
    "static.ParameterCount": "parameters",
    "static.Footprint": "bytes (parameters and buffers)",
    "static.ConnectionSparsity": "fraction of the connection layers' weights that are zero (0 to 1)",
    "workload.SynapticOperations.*": "operations per sample (Effective_ACs: accumulates, Effective_MACs: "
                                     "multiply-accumulates, Dense: every input-weight pair)",
    "workload.SynapticOperations_per_time_step.*": "operations per sample per time step",
    "workload.ActivationSparsity": "fraction of neuron outputs (neuron-steps) that are zero, all spiking layers "
                                   "(0 to 1)",
    "workload.firing_rate": "spikes per neuron-step, all spiking layers (0 to 1)",
    "workload.spikes": "spikes per sample",
    "workload.neuron_updates": "neuron-steps per sample",
    "workload.nonzero_inputs": "nonzero input elements of the connection layers per sample",
    "ann.MACs": "multiply-accumulates per sample of the same network as a ReLU ANN (one step, dense)",
    "ann.inputs": "input elements of the connection layers per sample, ANN",
    "ann.activations": "neuron outputs per sample, ANN",
    "energy[].snn_uJ": "microjoules per sample",
    "energy[].ann_uJ": "microjoules per sample, the same network as a ReLU ANN",
    "energy[].ann_over_snn": "ratio (ANN energy / SNN energy)",
    "layers[].Effective_ACs": "accumulates per sample",
    "layers[].Effective_MACs": "multiply-accumulates per sample",
    "layers[].Dense": "operations per sample, every input-weight pair",
    "layers[].ann_MACs": "multiply-accumulates per sample, ANN",
    "layers[].input_sparsity": "fraction of the layer's input elements that are zero (0 to 1)",
    "layers[].binary_input_calls": "fraction of the layer's calls whose input is all in {-1, 0, 1} (0 to 1)",
    "layers[].calls_per_pass": "calls of the layer per forward pass",
    "layers[].firing_rate": "spikes per neuron-step (0 to 1)",
    "layers[].ActivationSparsity": "fraction of the layer's neuron-steps without a spike (0 to 1)",
    "layers[].neurons": "neurons of the layer per time step of one sample",
    "layers[].spikes": "spikes per sample",
}


# ----------------------------------------------------------------------------- static metrics


def static_metrics(model: nn.Module, fanin: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """NeuroBench's static metrics of ``model``: ``ParameterCount``, ``Footprint`` (bytes of parameters and
    buffers) and ``ConnectionSparsity`` (zero weights over all weights of the connection layers).

    ``fanin`` (layer name -> :func:`weight_fanin` of its current weights, e.g. what an
    :class:`ActivityCounter` read this validation) saves reading those layers' weights again: its sum is the
    layer's nonzero weights."""
    fanin = fanin or {}
    params = sum(p.numel() for p in model.parameters())
    footprint = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    layers = connection_layers(model)
    total = sum(m.weight.numel() for _, m in layers)
    read = [fanin[name].flatten() for name, _ in layers if name in fanin]
    nonzero = [(m.weight.detach() != 0).sum() for name, m in layers if name not in fanin]
    if read:  # the counts the counter read: one concatenation and one sum, not a launch per layer
        nonzero.append(torch.cat([f.to(read[0].device) for f in read]).sum(dtype=torch.int64))
    zeros = total - int(torch.stack([n.to(nonzero[0].device) for n in nonzero]).sum()) if layers else 0
    return {"ParameterCount": params, "Footprint": footprint,
            "ConnectionSparsity": zeros / total if total else 0.0}


# ----------------------------------------------------------------------------- energy


@dataclass(frozen=True)
class EnergyModel:
    """Energy per operation and per memory word, picojoules."""

    name: str
    description: str
    source: str
    ac: float = 0.9                 # 32-bit float add, 45 nm
    mac: float = 4.6                # 32-bit float multiply (3.7) + add (0.9), 45 nm
    word: float = 0.0               # one 32-bit word read or written in SRAM

    def snn(self, w: dict[str, float]) -> float:
        """pJ per sample of the spiking network from the per-sample workload ``w``."""
        access = self.word
        energy = w["Effective_ACs"] * (self.ac + 3 * access) + w["Effective_MACs"] * (self.mac + 3 * access)
        if access:
            energy += (w["nonzero_inputs"] * access + w["neuron_updates"] * (self.mac + 3 * access)
                       + w["spikes"] * access)
        return energy

    def ann(self, a: dict[str, float]) -> float:
        """pJ per sample of the same network as a ReLU ANN (one step, dense) from its workload ``a``."""
        access = self.word
        energy = a["MACs"] * (self.mac + 3 * access)
        if access:
            energy += a["inputs"] * access + a["activations"] * 2 * access
        return energy


HOROWITZ = ("M. Horowitz, \"Computing's energy problem (and what we can do about it)\", ISSCC 2014: 45 nm, "
            "32-bit float add 0.9 pJ, multiply 3.7 pJ, 8 KB SRAM 10 pJ per 64-bit access")
ENERGY_MODELS = (
    EnergyModel(
        "compute", "0.9 pJ per AC, 4.6 pJ per MAC; nothing else (the proxy most SNN papers report)", HOROWITZ),
    EnergyModel(
        "compute+memory",
        "0.9 pJ per AC and 4.6 pJ per MAC, plus 5 pJ per 32-bit SRAM word (half a 64-bit access), no data "
        "reuse: every synaptic operation reads its weight and reads and writes its target's partial sum; every "
        "nonzero input is read once; SNN: every neuron-step reads its input current and reads and writes its "
        "membrane (3 words) with one MAC for the update, every spike is written; ANN: every activation reads its "
        "sum and writes its output (2 words). Memory accesses counted beside arithmetic as in Lemaire et al., "
        "ICONIP 2022, and Dampfhoffer et al., IEEE TETCI 2023", HOROWITZ, word=5.0),
)


# ----------------------------------------------------------------------------- the report


def build_report(totals: dict[str, Any], static: dict[str, Any] | None = None,
                 energy_models: Sequence[EnergyModel] = ENERGY_MODELS) -> dict[str, Any]:
    """The efficiency report (plain values, JSON-ready) from :meth:`ActivityCounter.unpack` output and
    :func:`static_metrics`. Workload values are per sample (one forward pass of one input over all T steps) and
    per time step; the report says so itself: ``basis`` (what a sample is, T, the samples, batch size and forward
    passes counted) and ``units`` (:data:`UNITS`, the unit of every value)."""
    samples = max(1, totals["samples"])
    spiking, conns = totals["spiking"], totals["connections"]
    steps = max([s["steps"] for s in spiking.values()] or [1])
    spikes = sum(s["spikes"] for s in spiking.values())
    neuron_steps = sum(s["neuron_steps"] for s in spiking.values())
    ac = sum(c["ac"] for c in conns.values())
    mac = sum(c["mac"] for c in conns.values())
    dense = sum(c["dense"] for c in conns.values())
    synops = {"Effective_MACs": mac / samples, "Effective_ACs": ac / samples, "Dense": dense / samples}
    workload = {
        "SynapticOperations": synops,
        "SynapticOperations_per_time_step": {k: v / steps for k, v in synops.items()},
        "ActivationSparsity": 1.0 - spikes / neuron_steps if neuron_steps else 0.0,
        "firing_rate": spikes / neuron_steps if neuron_steps else 0.0,
        "spikes": spikes / samples,
        "neuron_updates": neuron_steps / samples,
        "nonzero_inputs": sum(c["nonzero"] for c in conns.values()) / samples,
    }
    ann = {"MACs": sum(c["ann_dense"] for c in conns.values()) / samples,
           "inputs": sum(c["ann_inputs"] for c in conns.values()) / samples,
           "activations": sum(s["ann_activations"] for s in spiking.values()) / samples}
    flat = {**synops, **{k: workload[k] for k in ("spikes", "neuron_updates", "nonzero_inputs")}}
    energy = []
    for model in energy_models:
        snn_uj, ann_uj = model.snn(flat) * 1e-6, model.ann(ann) * 1e-6
        energy.append({"model": model.name, "description": model.description, "source": model.source,
                       "snn_uJ": snn_uj, "ann_uJ": ann_uj, "ann_over_snn": ann_uj / snn_uj if snn_uj else None})
    layers = []
    for name in totals["order"]:
        if name in conns:
            c = conns[name]
            layers.append({
                "name": name, "type": c["type"], "kind": "connection",
                "Effective_ACs": c["ac"] / samples, "Effective_MACs": c["mac"] / samples, "Dense": c["dense"] / samples,
                "input_sparsity": 1.0 - c["nonzero"] / c["numel"] if c["numel"] else 0.0,
                "binary_input_calls": (c["calls"] - c["nonbinary_calls"]) / c["calls"] if c["calls"] else 0.0,
                "calls_per_pass": c["calls"] / max(1, totals["passes"]),
                "ann_MACs": c["ann_dense"] / samples,
            })
        elif name in spiking:
            s = spiking[name]
            rate = s["spikes"] / s["neuron_steps"] if s["neuron_steps"] else 0.0
            layers.append({"name": name, "type": s["type"], "kind": "spiking", "firing_rate": rate,
                           "ActivationSparsity": 1.0 - rate, "neurons": s["ann_activations"] / samples,
                           "spikes": s["spikes"] / samples})
    basis = {**BASIS, "T": steps, "samples": totals["samples"], "batch_size": totals.get("batch_size"),
             "forward_passes": totals["passes"], "processes": totals.get("processes", 1)}
    return {"format": FORMAT, "T": steps, "samples": totals["samples"], "basis": basis, "units": dict(UNITS),
            "static": dict(static or {}), "workload": workload, "ann": ann, "energy": energy, "layers": layers}


# ----------------------------------------------------------------------------- presentation


def _si(value: float | None, digits: int = 3) -> str:
    """``12.3 M``-style numbers for the tables."""
    if value is None:
        return "n/a"
    value = float(value)
    for factor, suffix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def markdown(report: dict[str, Any], title: str = "Efficiency report", layers: bool = True) -> str:
    """The report as markdown tables: totals, energy estimates beside the ANN, and (``layers``) per layer."""
    w, syn, steps = report["workload"], report["workload"]["SynapticOperations"], report["T"]
    st = report.get("static") or {}
    batch = (report.get("basis") or {}).get("batch_size")
    intro = (f"{report['samples']} samples (forward passes of one input) of the validation data"
             + (f" in batches of {batch}" if batch else "") + f", T = {steps}; "
             "values per sample (one forward pass over all T steps) and per time step. Synaptic operations "
             "follow NeuroBench's rules: inputs all in {-1, 0, 1}: accumulates (ACs), otherwise "
             "multiply-accumulates (MACs); zero inputs and zero weights skipped; bias, norms, pooling, "
             "element-wise ops and neuron updates not included.")
    lines = [f"## {title}", "", intro, "", "| metric (NeuroBench name) | per sample | per time step |", "|---|---|---|"]
    per_step = w["SynapticOperations_per_time_step"]
    for key, label in (("Effective_ACs", "effective ACs (Effective_ACs)"),
                       ("Effective_MACs", "effective MACs (Effective_MACs)"), ("Dense", "dense operations (Dense)")):
        lines.append(f"| {label} | {_si(syn[key])} | {_si(per_step[key])} |")
    lines.append(f"| spikes | {_si(w['spikes'])} | {_si(w['spikes'] / steps)} |")
    lines.append(f"| activation sparsity (ActivationSparsity) | {w['ActivationSparsity']:.4f} | |")
    lines.append(f"| firing rate | {w['firing_rate']:.4f} | |")
    if st:
        lines.append(f"| parameters (ParameterCount) | {_si(st['ParameterCount'])} | |")
        lines.append(f"| footprint, bytes (Footprint) | {_si(st['Footprint'])} | |")
        lines.append(f"| connection sparsity (ConnectionSparsity) | {st['ConnectionSparsity']:.4f} | |")
    lines.append(f"| same network as an ANN (ReLU, one step): MACs | {_si(report['ann']['MACs'])} | |")
    lines += ["", "| energy model | SNN, µJ per sample | same network as ANN (ReLU, one step), µJ | ANN / SNN |",
              "|---|---|---|---|"]
    for e in report["energy"]:
        ratio = "n/a" if e["ann_over_snn"] is None else f"{e['ann_over_snn']:.2f}"
        lines.append(f"| {e['model']} | {e['snn_uJ']:.4g} | {e['ann_uJ']:.4g} | {ratio} |")
    lines.append("")
    sources = []
    for e in report["energy"]:
        lines.append(f"- {e['model']}: {e['description']}.")
        if e["source"] not in sources:
            sources.append(e["source"])
    lines += [f"- Energy per operation and per memory access: {source}." for source in sources]
    if layers and report["layers"]:
        lines += ["", "| layer | type | firing rate | input sparsity | ACs | MACs | dense | binary-input calls |",
                  "|---|---|---|---|---|---|---|---|"]
        for lay in report["layers"]:
            if lay["kind"] == "spiking":
                lines.append(f"| {lay['name']} | {lay['type']} | {lay['firing_rate']:.4f} | | | | | |")
            else:
                lines.append(f"| {lay['name']} | {lay['type']} | | {lay['input_sparsity']:.4f} | "
                             f"{_si(lay['Effective_ACs'])} | {_si(lay['Effective_MACs'])} | {_si(lay['Dense'])} | "
                             f"{lay['binary_input_calls']:.2f} |")
    lines.append("")
    return "\n".join(lines)
