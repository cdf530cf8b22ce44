"""A neuron's time step as a small graph: tracing, reverse-mode differentiation, evaluation.

A step function ``step(x, *states, **params) -> (out, *new_states)`` written with Python
arithmetic and a few ``torch`` functions is traced by calling it on :class:`Proxy` values:
every operation on a proxy appends a :class:`Node` to a :class:`Graph` (identical nodes are
shared, so the graph holds each sub-expression once). :func:`differentiate` derives from that
graph the graph of the reverse step, ``(x, *states, *params, g_out, *g_new_states) ->
(g_x, *g_states, *g_params)``, by reverse-mode differentiation node by node, so that no backward
is written per neuron. :mod:`snntrain.kernels.neuron_codegen` turns both graphs into Triton code.

The operations (:data:`OPS`): ``+ - * /``, negation, integer powers, ``exp``, ``log``,
``sigmoid``, ``tanh``, ``sqrt``, ``abs``, ``relu``, ``clamp`` with constant bounds, ``minimum``,
``maximum``, ``where``, the comparisons (values 0.0 / 1.0), ``round``, ``floor``, ``detach`` and
``spike`` (the Heaviside step ``u >= 0`` with a surrogate gradient, :mod:`snntrain.nn.surrogate`'s
formulas). Their derivatives follow PyTorch's (``minimum``/``maximum`` split a tie's gradient in
half, ``relu`` passes none at 0, ``abs`` none at 0, ``clamp`` passes it on the closed interval),
so the generated backward equals autograd through the same step run on tensors. Anything else is
refused with :class:`UnsupportedOp`, naming the operation. Data-dependent Python control flow on a
proxy (``if v > 1:``) is refused too: :func:`torch.where` is the way to branch.

Nothing here imports from :mod:`snntrain.nn`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["OPS", "Graph", "Node", "Proxy", "UnsupportedOp", "trace", "differentiate", "spike_node"]

#: Surrogates of the ``spike`` operation and their default sharpness (the table of snntrain.nn.surrogate).
SPIKE_SURROGATES = ("sigmoid", "atan", "piecewise_quadratic")

#: Operation name -> number of operands. ``input`` and ``const`` take none (their value is in ``attr``).
OPS: dict[str, int] = {
    "input": 0, "const": 0,
    "add": 2, "sub": 2, "mul": 2, "div": 2, "neg": 1,
    "exp": 1, "log": 1, "sigmoid": 1, "tanh": 1, "sqrt": 1, "abs": 1, "relu": 1,
    "clamp": 1, "minimum": 2, "maximum": 2, "where": 3,
    "lt": 2, "le": 2, "gt": 2, "ge": 2, "eq": 2, "ne": 2,
    "round": 1, "floor": 1, "detach": 1, "spike": 1, "sign": 1,
    "fdiv": 2,  # a division of the reverse step only: generated as the fast (non-IEEE, 2 ulp) division
}
#: Operations whose derivative is zero everywhere (or undefined and taken as zero, as PyTorch does).
_NO_GRAD = {"lt", "le", "gt", "ge", "eq", "ne", "round", "floor", "detach", "sign", "const", "input"}


class UnsupportedOp(TypeError):
    """A step function used an operation that cannot be generated; the message names it."""


@dataclass(frozen=True)
class Node:
    """One operation: ``op`` applied to the nodes ``args`` (indices into the graph), with the
    constant ``attr`` (a ``const``'s value, an ``input``'s name, ``clamp``'s bounds, ``spike``'s
    ``(surrogate, alpha)``)."""

    op: str
    args: tuple[int, ...] = ()
    attr: Any = None


class Graph:
    """Nodes in topological order, each unique (adding an existing node returns its index)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._index: dict[Node, int] = {}
        self.outputs: list[int] = []

    def add(self, op: str, args: tuple[int, ...] = (), attr: Any = None) -> int:
        node = Node(op, tuple(args), attr)
        i = self._index.get(node)
        if i is None:
            i = self._index[node] = len(self.nodes)
            self.nodes.append(node)
        return i

    def const(self, value: float) -> int:
        return self.add("const", (), float(value))

    def input(self, name: str) -> int:
        return self.add("input", (), name)

    def inputs(self) -> list[str]:
        return [n.attr for n in self.nodes if n.op == "input"]

    def key(self) -> str:
        """A canonical text of the graph (the nodes reachable from the outputs, in order): equal graphs, equal keys."""
        live = self.live()
        return ";".join(f"{i}:{n.op}{n.args}{n.attr!r}" for i, n in enumerate(self.nodes) if i in live) + \
            f"->{self.outputs}"

    def live(self) -> set[int]:
        """The nodes the outputs depend on."""
        seen: set[int] = set()
        stack = list(self.outputs)
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack.extend(self.nodes[i].args)
        return seen

    # -- simplifying constructors (constant folding of the identities the derivative rules produce) --

    def _value(self, i: int) -> float | None:
        n = self.nodes[i]
        return n.attr if n.op == "const" else None

    def mul(self, a: int, b: int) -> int:
        va, vb = self._value(a), self._value(b)
        if va is not None and vb is not None:
            return self.const(va * vb)
        if va == 1.0:
            return b
        if vb == 1.0:
            return a
        if va == 0.0 or vb == 0.0:  # adjoints only: never a product with a non-finite forward value
            return self.const(0.0)
        return self.add("mul", (a, b))

    def plus(self, a: int | None, b: int) -> int:
        if a is None:
            return b
        va, vb = self._value(a), self._value(b)
        if va == 0.0:
            return b
        if vb == 0.0:
            return a
        if va is not None and vb is not None:
            return self.const(va + vb)
        return self.add("add", (a, b))

    def neg(self, a: int) -> int:
        va = self._value(a)
        return self.const(-va) if va is not None else self.add("neg", (a,))


# ----------------------------------------------------------------------------
# Tracing
# ----------------------------------------------------------------------------

_TORCH_FUNCTIONS: dict[Any, str] = {}


def _register_torch(op: str, *functions) -> None:
    for f in functions:
        if f is not None:
            _TORCH_FUNCTIONS[f] = op


_register_torch("exp", torch.exp, torch.Tensor.exp)
_register_torch("log", torch.log, torch.Tensor.log)
_register_torch("sigmoid", torch.sigmoid, torch.Tensor.sigmoid, torch.nn.functional.sigmoid)
_register_torch("tanh", torch.tanh, torch.Tensor.tanh, torch.nn.functional.tanh)
_register_torch("sqrt", torch.sqrt, torch.Tensor.sqrt)
_register_torch("abs", torch.abs, torch.Tensor.abs)
_register_torch("relu", torch.relu, torch.Tensor.relu, torch.nn.functional.relu)
_register_torch("clamp", torch.clamp, torch.Tensor.clamp, torch.clip, torch.Tensor.clip)
_register_torch("minimum", torch.minimum, torch.Tensor.minimum, torch.min, torch.Tensor.min)
_register_torch("maximum", torch.maximum, torch.Tensor.maximum, torch.max, torch.Tensor.max)
_register_torch("where", torch.where)
_register_torch("round", torch.round, torch.Tensor.round)
_register_torch("floor", torch.floor, torch.Tensor.floor)
_register_torch("sign", torch.sign, torch.Tensor.sign)
_register_torch("detach", torch.Tensor.detach)
_register_torch("add", torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__)
_register_torch("sub", torch.sub, torch.Tensor.sub, torch.Tensor.__sub__)
_register_torch("mul", torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__)
_register_torch("div", torch.div, torch.Tensor.div, torch.true_divide, torch.Tensor.__truediv__)
_register_torch("neg", torch.neg, torch.Tensor.neg, torch.Tensor.__neg__)
for _op, _f in (("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge), ("eq", torch.eq),
                ("ne", torch.ne)):
    _register_torch(_op, _f, getattr(torch.Tensor, _op))


def _name(func) -> str:
    """A readable name of a torch function or method (``torch.sin``, ``torch.Tensor.sin``)."""
    name = getattr(func, "__name__", None) or repr(func)
    qual = getattr(func, "__qualname__", None) or ""
    mod = getattr(func, "__module__", None) or ""
    if qual.startswith(("Tensor.", "TensorBase.", "_TensorBase.")):
        return f"torch.Tensor.{name}"
    if mod.startswith("torch.nn.functional"):
        return f"torch.nn.functional.{name}"
    if not mod or mod.startswith("torch") or qual.startswith("_VariableFunctions"):
        return f"torch.{name}"
    return f"{mod}.{name}"


class Proxy:
    """A traced value of a step function: arithmetic and the supported torch functions on it record nodes."""

    __slots__ = ("graph", "index")

    def __init__(self, graph: Graph, index: int) -> None:
        self.graph = graph
        self.index = index

    # operands: proxies, Python numbers, 0-d tensors (their value becomes a constant)
    def _operand(self, other: Any) -> int:
        return _operand(self.graph, other)

    def _binary(self, op: str, other: Any, reverse: bool = False) -> Proxy:
        a, b = self.index, self._operand(other)
        if reverse:
            a, b = b, a
        return Proxy(self.graph, self.graph.add(op, (a, b)))

    def __add__(self, o):
        return self._binary("add", o)

    def __radd__(self, o):
        return self._binary("add", o, True)

    def __sub__(self, o):
        return self._binary("sub", o)

    def __rsub__(self, o):
        return self._binary("sub", o, True)

    def __mul__(self, o):
        return self._binary("mul", o)

    def __rmul__(self, o):
        return self._binary("mul", o, True)

    def __truediv__(self, o):
        return self._binary("div", o)

    def __rtruediv__(self, o):
        return self._binary("div", o, True)

    def __neg__(self):
        return Proxy(self.graph, self.graph.add("neg", (self.index,)))

    def __pos__(self):
        return self

    def __abs__(self):
        return self._unary("abs")

    def __pow__(self, e):
        if isinstance(e, (int, float)) and not isinstance(e, bool) and float(e).is_integer() and 1 <= e <= 8:
            out = self
            for _ in range(int(e) - 1):
                out = out * self
            return out
        if isinstance(e, (int, float)) and e == 0.5:
            return self._unary("sqrt")
        raise UnsupportedOp(f"the power x ** {e!r}: the generated kernels take integer exponents 1..8 and 0.5 "
                            "(write exp(e * log(x)) for others)")

    def __rpow__(self, base):
        if isinstance(base, (int, float)) and base > 0:  # base ** x = exp(x * log(base))
            return Proxy(self.graph, self.graph.add("exp", (self.graph.add("mul", (
                self.index, self.graph.const(math.log(base)))),)))
        raise UnsupportedOp(f"the power {base!r} ** x: the generated kernels take a positive constant base")

    def __lt__(self, o):
        return self._binary("lt", o)

    def __le__(self, o):
        return self._binary("le", o)

    def __gt__(self, o):
        return self._binary("gt", o)

    def __ge__(self, o):
        return self._binary("ge", o)

    def __eq__(self, o):  # type: ignore[override]
        return self._binary("eq", o)

    def __ne__(self, o):  # type: ignore[override]
        return self._binary("ne", o)

    __hash__ = object.__hash__

    def __and__(self, o):  # masks are 0.0 / 1.0: logical and is a product
        return self._binary("mul", o)

    __rand__ = __and__

    def __or__(self, o):
        return self._binary("maximum", o)

    __ror__ = __or__

    def __invert__(self):
        return Proxy(self.graph, self.graph.add("sub", (self.graph.const(1.0), self.index)))

    def __bool__(self):
        raise UnsupportedOp("Python control flow on a traced value (`if`, `and`, `or`, `not`, bool(...)): the step "
                            "runs for every neuron at once; branch with torch.where(condition, a, b)")

    def __float__(self):
        raise UnsupportedOp("float() of a traced value: the step's values are per neuron")

    __int__ = __index__ = __float__

    def _unary(self, op: str) -> Proxy:
        return Proxy(self.graph, self.graph.add(op, (self.index,)))

    def exp(self):
        return self._unary("exp")

    def log(self):
        return self._unary("log")

    def sigmoid(self):
        return self._unary("sigmoid")

    def tanh(self):
        return self._unary("tanh")

    def sqrt(self):
        return self._unary("sqrt")

    def abs(self):
        return self._unary("abs")

    def relu(self):
        return self._unary("relu")

    def round(self):
        return self._unary("round")

    def floor(self):
        return self._unary("floor")

    def sign(self):
        return self._unary("sign")

    def detach(self):
        return self._unary("detach")

    def clamp(self, min=None, max=None):  # noqa: A002 (torch's names)
        return _call("clamp", (self,), {"min": min, "max": max})

    clip = clamp

    def float(self):
        return self

    def to(self, *args, **kwargs):  # dtypes are the kernel's; a conversion is a no-op in the step
        return self

    def __getattr__(self, name):
        raise UnsupportedOp(f"the tensor method or attribute .{name} on a traced value: the generated kernels take "
                            f"{', '.join(sorted(o for o in OPS if o not in ('input', 'const')))}")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _TORCH_FUNCTIONS.get(func)
        if op is None:
            raise UnsupportedOp(f"{_name(func)} cannot be generated into a neuron kernel; the step may use "
                                "+ - * / **, comparisons and torch." + ", torch.".join(
                                    sorted({o for o in _TORCH_FUNCTIONS.values() if o not in (
                                        "add", "sub", "mul", "div", "neg", "lt", "le", "gt", "ge", "eq", "ne")})))
        return _call(op, args, kwargs)


def _graph_of(values) -> Graph:
    for v in values:
        if isinstance(v, Proxy):
            return v.graph
    raise UnsupportedOp("an operation without a traced operand")


def _operand(graph: Graph, value: Any) -> int:
    if isinstance(value, Proxy):
        if value.graph is not graph:
            raise UnsupportedOp("a value traced in another step function")
        return value.index
    if isinstance(value, bool):
        return graph.const(1.0 if value else 0.0)
    if isinstance(value, (int, float)):
        return graph.const(float(value))
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() == 0:
        return graph.const(float(value.detach()))
    raise UnsupportedOp(f"an operand of type {type(value).__name__}: a step's operands are its arguments, values "
                        "computed from them and Python numbers (pass tensors as parameters of the neuron)")


def _call(op: str, args, kwargs) -> Proxy:
    """The node of a torch function or method ``op`` applied to ``args`` (proxies and constants)."""
    g = _graph_of(list(args) + list(kwargs.values()))
    if op == "clamp":
        x = args[0]
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
        for b in (lo, hi):
            if isinstance(b, Proxy):
                raise UnsupportedOp("clamp with traced bounds: use torch.minimum / torch.maximum")
        lo = None if lo is None else float(lo)
        hi = None if hi is None else float(hi)
        return Proxy(g, g.add("clamp", (_operand(g, x),), (lo, hi)))
    if op in ("minimum", "maximum"):
        operands = list(args) + [v for k, v in kwargs.items() if k in ("other", "input")]
        if len(operands) != 2 or "dim" in kwargs or (isinstance(operands[1], int) and not isinstance(operands[1], bool)):
            raise UnsupportedOp(f"torch.{op[:3]} over a dimension (a reduction): the step is elementwise; "
                                f"torch.{op} of two values (or clamp with a constant bound) is supported")
        return Proxy(g, g.add(op, (_operand(g, operands[0]), _operand(g, operands[1]))))
    if op == "where":
        if len(args) != 3:
            raise UnsupportedOp("torch.where with one argument (the indices of nonzero elements)")
        return Proxy(g, g.add("where", tuple(_operand(g, a) for a in args)))
    if op in ("add", "sub") and "alpha" in kwargs:
        a, b = args
        b = Proxy(g, _operand(g, b)) * kwargs["alpha"] if isinstance(b, Proxy) else b * kwargs["alpha"]
        return Proxy(g, g.add(op, (_operand(g, a), _operand(g, b))))
    if op == "div" and kwargs.get("rounding_mode") is not None:
        raise UnsupportedOp(f"torch.div with rounding_mode={kwargs['rounding_mode']!r}: write torch.floor(a / b)")
    n = OPS[op]
    if len(args) != n:
        raise UnsupportedOp(f"torch.{op} with {len(args)} operands (the generated kernels take {n})")
    return Proxy(g, g.add(op, tuple(_operand(g, a) for a in args)))


def spike_node(u: Proxy, surrogate: str, alpha: float) -> Proxy:
    """The Heaviside step ``u >= 0`` (1.0 / 0.0) with the surrogate gradient ``surrogate`` of sharpness ``alpha``."""
    if surrogate not in SPIKE_SURROGATES:
        raise ValueError(f"surrogate={surrogate!r} is not valid; choose one of {', '.join(SPIKE_SURROGATES)}")
    g = u.graph
    return Proxy(g, g.add("spike", (u.index,), (surrogate, float(alpha))))


def trace(step, n_states: int, state_names: list[str], param_names: list[str]) -> Graph:
    """The graph of ``step(x, *states, **params)``; inputs named ``x``, the state names and the parameter names,
    outputs ``(out, *new_states)``. Raises :class:`UnsupportedOp` (naming the operation) or ValueError (a wrong
    number of outputs)."""
    g = Graph()
    x = Proxy(g, g.input("x"))
    states = [Proxy(g, g.input(n)) for n in state_names]
    params = {n: Proxy(g, g.input(n)) for n in param_names}
    result = step(x, *states, **params)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) != 1 + n_states:
        raise ValueError(f"the step function returned {len(result)} value(s); it must return the output and the "
                         f"{n_states} new state(s) ({', '.join(['out', *state_names])}), in that order")
    g.outputs = [_operand(g, r) for r in result]
    return g


# ----------------------------------------------------------------------------
# Differentiation
# ----------------------------------------------------------------------------


def _surrogate_grad(g: Graph, u: int, surrogate: str, alpha: float) -> int:
    """dS/du of the surrogate as nodes (the formulas of snntrain.nn.surrogate)."""
    if surrogate == "sigmoid":  # alpha * e / (1 + e)^2, e = exp(-alpha |u|)
        e = g.add("exp", (g.add("mul", (g.add("abs", (u,)), g.const(-alpha))),))
        d = g.add("add", (e, g.const(1.0)))
        return g.add("fdiv", (g.add("mul", (e, g.const(alpha))), g.add("mul", (d, d))))
    if surrogate == "atan":  # (alpha / 2) / (1 + (pi / 2 * alpha * u)^2)
        z = g.add("mul", (u, g.const(math.pi / 2.0 * alpha)))
        return g.add("fdiv", (g.const(alpha / 2.0), g.add("add", (g.add("mul", (z, z)), g.const(1.0)))))
    # piecewise_quadratic: max(alpha - alpha^2 |u|, 0)
    return g.add("relu", (g.add("add", (g.add("mul", (g.add("abs", (u,)), g.const(-alpha * alpha))),
                                        g.const(alpha))),))


def _local_grads(g: Graph, i: int, gy: int) -> list[tuple[int, int]]:
    """``(operand, adjoint contribution)`` of node ``i`` with adjoint ``gy`` (added to ``g``)."""
    n = g.nodes[i]
    op, a = n.op, n.args
    if op in _NO_GRAD:
        return []
    if op == "add":
        return [(a[0], gy), (a[1], gy)]
    if op == "sub":
        return [(a[0], gy), (a[1], g.neg(gy))]
    if op == "neg":
        return [(a[0], g.neg(gy))]
    if op == "mul":
        return [(a[0], g.mul(gy, a[1])), (a[1], g.mul(gy, a[0]))]
    if op in ("div", "fdiv"):  # d(a/b) = g/b, -g a / b^2 = -(g/b) * (a/b)
        q = g.add("fdiv", (gy, a[1]))
        return [(a[0], q), (a[1], g.neg(g.mul(q, i)))]
    if op == "exp":
        return [(a[0], g.mul(gy, i))]
    if op == "log":
        return [(a[0], g.add("fdiv", (gy, a[0])))]
    if op == "sigmoid":  # s (1 - s)
        return [(a[0], g.mul(gy, g.add("mul", (i, g.add("sub", (g.const(1.0), i))))))]
    if op == "tanh":  # 1 - t^2
        return [(a[0], g.mul(gy, g.add("sub", (g.const(1.0), g.add("mul", (i, i))))))]
    if op == "sqrt":  # g / (2 sqrt)
        return [(a[0], g.add("fdiv", (gy, g.add("mul", (i, g.const(2.0))))))]
    if op == "abs":
        return [(a[0], g.mul(gy, g.add("sign", (a[0],))))]
    if op == "relu":
        return [(a[0], g.mul(gy, g.add("gt", (a[0], g.const(0.0)))))]
    if op == "clamp":
        lo, hi = n.attr
        m = None
        if lo is not None:
            m = g.add("ge", (a[0], g.const(lo)))
        if hi is not None:
            mh = g.add("le", (a[0], g.const(hi)))
            m = mh if m is None else g.add("mul", (m, mh))
        return [(a[0], gy if m is None else g.mul(gy, m))]
    if op in ("minimum", "maximum"):  # PyTorch: the whole gradient to the chosen operand, half to each on a tie
        first = g.add("lt" if op == "minimum" else "gt", (a[0], a[1]))
        tie = g.add("eq", (a[0], a[1]))
        half = g.add("mul", (tie, g.const(0.5)))
        w0 = g.add("add", (first, half))
        w1 = g.add("sub", (g.const(1.0), w0))
        return [(a[0], g.mul(gy, w0)), (a[1], g.mul(gy, w1))]
    if op == "where":
        zero = g.const(0.0)
        cond = g.add("ne", (a[0], zero))
        return [(a[1], g.add("where", (cond, gy, zero))), (a[2], g.add("where", (cond, zero, gy)))]
    if op == "spike":
        surrogate, alpha = n.attr
        return [(a[0], g.mul(gy, _surrogate_grad(g, a[0], surrogate, alpha)))]
    raise UnsupportedOp(f"no derivative rule for {op}")  # every op of OPS has one above


def differentiate(fwd: Graph, inputs: list[str], wrt: list[str]) -> Graph:
    """The reverse step of ``fwd``: a graph with inputs ``inputs`` (the forward's, in order) and ``g_0 ..
    g_{k-1}`` (the adjoints of the forward's outputs), and outputs the adjoints of the inputs ``wrt``
    (a constant 0 where an input does not reach the outputs)."""
    g = Graph()
    remap: dict[int, int] = {}
    for name in inputs:
        g.input(name)
    for i, n in enumerate(fwd.nodes):
        remap[i] = g.add(n.op, tuple(remap[j] for j in n.args), n.attr)
    adj: dict[int, int] = {}
    for k, out in enumerate(fwd.outputs):
        gk = g.input(f"g_{k}")
        o = remap[out]
        adj[o] = g.plus(adj.get(o), gk)
    # reverse topological order over the forward's nodes (all of them precede the adjoint nodes)
    for i in sorted(set(remap.values()), reverse=True):
        gy = adj.get(i)
        if gy is None:
            continue
        for operand, contrib in _local_grads(g, i, gy):
            adj[operand] = g.plus(adj.get(operand), contrib)
    by_name = {n.attr: j for j, n in enumerate(g.nodes) if n.op == "input"}
    g.outputs = [adj.get(by_name[name], g.const(0.0)) if name in by_name else g.const(0.0) for name in wrt]
    return g
