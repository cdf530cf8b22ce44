"""The readers a NIR graph is written for (:data:`NIR_TARGETS`) and what each of them imports: every node
of a graph that a reader cannot import as NIR defines it, with the reason (:func:`target_problems`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Seconds per time step of graphs written for target ``spec`` (snnTorch's convention; Norse's is 1e-3).
DEFAULT_DT = 1e-4
READOUT_MEAN = "mean_over_time"
#: A LIF with ``tau = 2**60`` steps and ``r = tau / dt`` is an IF: ``V - V / 2**60`` rounds to ``V`` in
#: float32 and float64 (and snnTorch's ``beta = 1 - dt / tau`` to 1.0).
NO_LEAK_STEPS = 2.0**60


class NIRError(ValueError):
    """A network or graph that the NIR mapping cannot express, with the reason."""


@dataclass(frozen=True)
class NIRTarget:
    """A reader of exported graphs: how it imports one, the ``dt`` it steps with and the node types it maps.

    ``fixed_dt``: the importer assumes ``dt`` whatever the graph was written for (snnTorch 1.0); otherwise
    the importer takes the graph's ``dt`` as an argument (``dt`` is the export's default)."""

    name: str
    reader: str
    dt: float
    fixed_dt: bool
    nodes: tuple[str, ...]


#: ``export.nir_target``: the readers an exported graph can be written for (docs/nir.md has a table for each).
NIR_TARGETS: dict[str, NIRTarget] = {
    "spec": NIRTarget("spec", "snntrain.load_nir(path) (NIR's node definitions)", DEFAULT_DT, False,
                      ("Input", "Output", "Conv2d", "Affine", "Linear", "Flatten", "SumPool2d", "AvgPool2d",
                       "Threshold", "Scale", "IF", "LIF", "CubaLIF")),
    "snntorch": NIRTarget("snntorch", "snntorch.import_nir.import_from_nir(nir.read(path)) (snnTorch 1.0)", 1e-4,
                          True, ("Input", "Output", "Affine", "Linear", "Conv2d", "Flatten", "AvgPool2d",
                                 "SumPool2d", "IF", "LIF", "CubaLIF")),
    "norse": NIRTarget("norse", "norse.torch.from_nir(nir.read(path), dt=dt) (Norse 1.1)", 1e-3, False,
                       ("Input", "Output", "Affine", "Linear", "Conv2d", "Flatten", "SumPool2d", "IF", "LIF",
                        "CubaLIF")),
    "spikingjelly": NIRTarget("spikingjelly", "spikingjelly.activation_based.nir_exchange.import_from_nir(path, "
                              "dt=dt) (SpikingJelly 2.0)", 1e-4, False,
                              ("Input", "Output", "Affine", "Linear", "Conv1d", "Conv2d", "AvgPool2d", "Flatten",
                               "SumPool2d", "IF", "LIF", "CubaLIF")),
}


def check_target(target: object) -> NIRTarget:
    """The :class:`NIRTarget` named ``target``, or a ValueError listing the valid names."""
    if not isinstance(target, str) or target not in NIR_TARGETS:
        raise ValueError(f"export.nir_target={target!r} is not valid; choose one of {', '.join(NIR_TARGETS)}")
    return NIR_TARGETS[target]


def format_problems(target: str, problems: list[tuple[str, str]]) -> str:
    """One line per reason, naming every node it applies to."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in problems:
        by_reason.setdefault(reason, []).append(node)
    reader = NIR_TARGETS[target].reader if target in NIR_TARGETS else target
    lines = [f"the model has no NIR graph that {reader} reads (export.nir_target={target}):"]
    for reason, nodes in by_reason.items():
        lines.append(f"  - {reason} (nodes: {', '.join(dict.fromkeys(nodes))})")
    return "\n".join(lines)


def _values(node: Any, field: str) -> np.ndarray:
    value = getattr(node, field, None)
    return np.zeros(1) if value is None else np.asarray(value, dtype=np.float64).reshape(-1)


def _one(values: np.ndarray) -> float | None:
    """The value every element has, or None when they differ."""
    return float(values[0]) if values.size and np.all(values == values[0]) else None


def _fmt(values: np.ndarray) -> str:
    one = _one(values)
    return f"{one:g}" if one is not None else f"{values.min():g} to {values.max():g}"


_GROUPED = ("a grouped convolution (groups={g}): the importer builds torch.nn.Conv2d(in_channels=weight.shape[1], "
            "groups={g}), which fails (in_channels is weight.shape[1] * groups)")


def _snntorch_node(node: Any, dt: float) -> list[str]:
    import nir

    out = []
    if isinstance(node, nir.Conv2d) and int(node.groups) != 1:
        out.append(_GROUPED.format(g=int(node.groups)))
    if isinstance(node, nir.SumPool2d) and np.any(np.asarray(node.padding) != 0):
        out.append("a padded SumPool2d: snnTorch 1.0 runs nirtorch's default, an LPPool2d without padding "
                   "(NIRTorch#44)")
    if isinstance(node, nir.IF):
        out.append("IF: snnTorch 1.0 imports it as a Leaky neuron with beta=0.9 and subtractive reset, and only "
                   "with r=1 (snnTorch#416, fixed after 1.0 by snnTorch#452); target=snntorch writes IF as a LIF "
                   "without leak")
    if isinstance(node, (nir.LIF, nir.CubaLIF)):
        kind = type(node).__name__
        v_leak, v_reset = _values(node, "v_leak"), _values(node, "v_reset")
        if np.any(v_leak != 0.0) or np.any(v_reset != 0.0):
            out.append(f"{kind} with v_leak={_fmt(v_leak)}, v_reset={_fmt(v_reset)}: snnTorch 1.0 asserts v_leak = 0 "
                       "and ignores v_reset (its neurons start at 0 and reset to 0); export models trained with "
                       "model.neuron.v_reset=0.0")
        if _one(_values(node, "v_threshold")) is None:
            out.append(f"{kind} thresholds differ between neurons: snnTorch 1.0 asserts one value per layer")
        if not math.isclose(dt, 1e-4, rel_tol=1e-9):
            out.append(f"dt={dt:g} s: snnTorch 1.0 steps with dt = 1e-4 s whatever the graph was written for "
                       "(beta = 1 - 1e-4 / tau); export with export.nir_dt=null or 0.0001")
    if isinstance(node, nir.LIF) and _one(_values(node, "r") / _values(node, "tau")) is None:
        out.append("LIF with r / tau that differs between neurons: snnTorch 1.0 takes one input scale per layer")
    return out


def _norse_node(node: Any, dt: float) -> list[str]:
    import nir

    out = []
    if isinstance(node, nir.Conv2d) and int(node.groups) != 1:
        out.append(_GROUPED.format(g=int(node.groups)))
    if isinstance(node, nir.SumPool2d) and np.any(np.asarray(node.padding) != 0):
        out.append("a padded SumPool2d: Norse 1.1 maps it to an LPPool2d without padding")
    if isinstance(node, (nir.IF, nir.LIF)) and np.any(_values(node, "v_reset") != 0.0):
        out.append(f"{type(node).__name__} with v_reset={_fmt(_values(node, 'v_reset'))}: Norse 1.1's from_nir passes "
                   "no v_reset (its neurons reset to 0); export models trained with model.neuron.v_reset=0.0")
    if isinstance(node, nir.IF):
        r = _values(node, "r")
        if not (np.allclose(r * dt, 1.0) or np.allclose(r, 1.0)):
            out.append(f"IF with r={_fmt(r)}: Norse 1.1's IAFCell adds the input unscaled whatever r, which is "
                       "NIR's IF only for r = 1/dt")
    if isinstance(node, nir.LIF) and not np.allclose(_values(node, "r"), 1.0):
        out.append(f"LIF with r={_fmt(_values(node, 'r'))}: Norse 1.1's LIFBoxCell ignores r (it warns) and scales "
                   "the input by dt/tau as for r = 1; export models trained with model.neuron.decay_input=true")
    return out


def _spikingjelly_node(node: Any, dt: float) -> list[str]:
    import nir

    out = []
    if isinstance(node, (nir.Conv1d, nir.Conv2d)) and int(node.groups) != 1:
        out.append(f"a grouped convolution (groups={int(node.groups)}): SpikingJelly 2.0 refuses groups != 1")
    if isinstance(node, nir.SumPool2d) and np.any(np.asarray(node.padding) != 0):
        out.append("a padded SumPool2d: SpikingJelly 2.0 runs nirtorch's default, an LPPool2d without padding "
                   "(NIRTorch#44)")
    if isinstance(node, (nir.IF, nir.LIF)) and _one(_values(node, "v_threshold")) is None:
        out.append(f"{type(node).__name__} thresholds differ between neurons: SpikingJelly takes one per layer")
    if isinstance(node, nir.IF) and not np.allclose(_values(node, "r") * dt, 1.0):
        out.append(f"IF with r={_fmt(_values(node, 'r'))}: SpikingJelly 2.0 requires r = 1/dt = {1 / dt:g}")
    if isinstance(node, nir.LIF):
        tau_steps, r = _values(node, "tau") / dt, _values(node, "r")
        if not np.all(tau_steps > 1.0):
            out.append(f"LIF with tau/dt={_fmt(tau_steps)}: SpikingJelly 2.0 requires more than one step")
        elif not (np.allclose(r, 1.0) or np.allclose(r, tau_steps)):
            out.append(f"LIF with r={_fmt(r)}: SpikingJelly 2.0 requires r = 1 or tau/dt")
        if not np.allclose(_values(node, "v_leak"), _values(node, "v_reset")):
            out.append("LIF with v_leak != v_reset: SpikingJelly 2.0 requires them equal")
    return out


_NODE_RULES: dict[str, Callable[[Any, float], list[str]]] = {
    "snntorch": _snntorch_node, "norse": _norse_node, "spikingjelly": _spikingjelly_node}


def depth_first_order(graph: Any) -> list[str]:
    """The order in which nirtorch's ``GraphExecutor`` (``nirtorch.load``, which Norse 1.1's ``from_nir`` and
    Sinabs' run on) calls the nodes: depth first from the node without inputs, each node's successors in the
    order of the graph's edges, every node at its first visit."""
    children: dict[str, list[str]] = {n: [] for n in graph.nodes}
    has_input = set()
    for a, b in graph.edges:
        if b not in children[a]:
            children[a].append(b)
        has_input.add(b)
    roots = [n for n in graph.nodes if n not in has_input]
    if not roots:
        return []
    order, seen = [roots[0]], {roots[0]}
    stack = [iter(children[roots[0]])]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
        elif nxt not in seen:
            seen.add(nxt)
            order.append(nxt)
            stack.append(iter(children[nxt]))
    return order


def _order_problems(graph: Any) -> list[tuple[str, str]]:
    order = depth_first_order(graph)
    position = {n: i for i, n in enumerate(order)}
    out = []
    for a, b in graph.edges:
        if b in position and a in position and position[a] > position[b]:
            reason = (f"Norse 1.1 runs its nodes depth first (nirtorch.load) and would run it before its input {a}, "
                      "whose previous step it would read instead")
            out.append((b, reason))
    out += [(n, "not reached from the input depth first: Norse 1.1 would never run it")
            for n in graph.nodes if n not in position]
    return out


def target_problems(graph: Any, target: str, dt: float | None = None) -> list[tuple[str, str]]:
    """``(node, reason)`` for every node of ``graph`` that ``target``'s importer cannot read as NIR defines it
    (empty: it reads the whole graph). ``dt`` defaults to the graph's metadata ``dt``, else the target's."""
    import nir

    spec = check_target(target)
    if dt is None:
        dt = float((graph.metadata or {}).get("dt", spec.dt))
    out: list[tuple[str, str]] = []
    inputs = [n for n, node in graph.nodes.items() if isinstance(node, nir.Input)]
    outputs = [n for n, node in graph.nodes.items() if isinstance(node, nir.Output)]
    if len(inputs) != 1:
        out += [(n, f"one of {len(inputs)} Input nodes: the readers take one input") for n in inputs or ["graph"]]
    if target == "spec":
        from .load import node_map  # what load_nir builds (load imports this module)

        mapping = node_map(dt)
        for name, node in graph.nodes.items():
            if type(node) not in mapping:
                out.append((name, f"{type(node).__name__} has no snntrain layer"))
                continue
            try:
                mapping[type(node)](node)
            except NIRError as err:
                out.append((name, str(err)))
        return out
    if len(outputs) != 1 and target in ("snntorch", "spikingjelly"):
        reason = (f"one of {len(outputs)} Output nodes: nirtorch.nir_to_torch (nirtorch 2.6), which {target} imports "
                  "with, loops forever on a graph with more than one Output node; export a classifier, or use "
                  "export.nir_target=norse or spec for a detector's backbone")
        out += [(n, reason) for n in outputs]
    for name, node in graph.nodes.items():
        kind = type(node).__name__
        if kind not in spec.nodes:
            out.append((name, f"{kind}: {target}'s importer maps no {kind} (it maps {', '.join(spec.nodes)})"))
            continue
        out += [(name, reason) for reason in _NODE_RULES[target](node, dt)]
    if target == "norse":
        out += _order_problems(graph)
    return out
