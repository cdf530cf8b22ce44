"""Triton source for a traced neuron step (:mod:`snntrain.kernels.neuron_graph`): a forward time loop and a
reverse-time backward loop.

:func:`generate` writes one module with

* ``_step(x, *states, *params) -> (out, *new_states)`` and ``_step_bwd(x, *states, *params, g_out,
  *g_new_states) -> (g_x, *g_states, *g_learnable_params)``: the two graphs as straight-line
  ``@triton.jit`` functions (Triton inlines them);
* ``fwd_kernel``: each program owns ``BLOCK`` neurons and scans T with the states in registers (fp32, or
  fp64 for fp64 input), in chunks of ``CHUNK`` steps whose loads are issued before the chunk's first store
  (as :mod:`snntrain.kernels.lif` does). It writes the outputs, the final states when asked and, when a
  gradient will be needed, the states at the start of every chunk but the first (checkpoints);
* ``bwd_kernel``: walks the chunks in reverse, recomputes the chunk's states from its checkpoint (the
  same ``_step``), then runs ``_step_bwd`` step by step backwards. dL/dX is written in the input's
  dtype, dL/d(initial states) when asked; a learnable scalar parameter's gradient is summed per program
  into a partial-sum row (summed in a fixed order afterwards). Per-channel sums (a per-channel
  parameter's gradient; with ``affine="bn"`` the batch norm's sums of dL/dy and dL/dy * xhat) are summed over
  T in registers and stored as the host picks (``CSUM``, :func:`_store_channel_sums`): one value per
  program where its block lies in one channel, one per channel where the block is whole rows of ``CB``
  channels (channels-last numbering), else one per neuron; in eager launches with few of them the last program
  to store its part of a channel's sums adds them up in a fixed order (``FINISH``, the arrival counters of
  :mod:`snntrain.kernels.bn_neuron`: ``_finish_channel_sums``), else the host adds them up per channel.

A norm folded in front of the neuron (``affine``) is applied to X as the kernels read it: ``"bn"`` (a batch
norm) ``x * a[c] + b[c]``, the per-channel scale ``a = rstd * w`` and shift ``b = bias - mean * a`` formed in
registers from the statistics, the weight and the bias (each absent one left out); ``"ln"`` (a layer norm over
the channels of each position) ``(x - mean[t, p]) * rstd[t, p] * w[c] + b[c]``, the statistics of position ``p`` (the neuron's
index without its channel, ``(n // (C * S)) * S + n % S``) at step ``t`` read at ``t * stride_st + p``
(``stride_st`` 0 where one input is repeated over T). The backward's dL/dX is then dL/dy, the gradient of
the normalised input, for the host to finish.

With ``"ln"`` the module also has position-tile kernels, ``ln_fwd_kernel`` and ``ln_bwd_kernel``, which do the
layer norm themselves (:func:`snntrain.kernels.step_neuron.ln_step_neuron`): each program holds all ``C``
channels (``BLOCK_C``, a power of two) of ``BLOCK_S`` positions of one sample, read through the input's
strides with :mod:`snntrain.kernels.norm_neuron_base`'s tile and pointer helpers; ``_step`` and ``_step_bwd``,
elementwise, run on the 2-D tile with every parameter broadcast to it. Per step the forward normalises the
loaded tile over ``C`` (``_ln_norm``: mean, 1/std, then ``xhat * w + b``) before the step; the backward
recomputes the chunk from its checkpoint the same way, runs the reverse steps and turns each step's dL/dy into
dL/dx over ``C`` (:mod:`snntrain.kernels.ln_neuron`'s ``_ln_dx``), with per-program rows of sums (the weight's
and bias's gradients, then each learnable parameter's) for the host to add up.

Neuron ``n`` of a step ``[B, C, S...]`` (row-major) has channel ``(n // S) % C``: per-channel parameters
are loaded once per neuron. Every multiply is an explicitly rounded ``mul.rn.f32`` on NVIDIA GPUs (the
:func:`~snntrain.kernels.neuron_step.mul_rn` of the built-in neurons), so no FMA contraction makes the
backward's recomputed states differ from the forward's, nor both from the PyTorch reference. The forward's
divisions are IEEE divisions, as PyTorch's; the divisions that differentiation adds (``fdiv``) are the fast
form (within 2 ulp), as the hand-written neurons' backward uses: the backward is issue-bound for 16-bit
input, and a gradient needs no bit-exact quotient.
"""

from __future__ import annotations

from dataclasses import dataclass

from .neuron_graph import Graph

__all__ = ["AFFINE_MODES", "KernelSpec", "generate", "CODEGEN_VERSION"]

#: Changes whenever the generated code changes (part of the cache key).
CODEGEN_VERSION = 8


@dataclass(frozen=True)
class KernelSpec:
    """What the generated module depends on besides the two graphs."""

    states: tuple[str, ...]  # state names, in the step's order
    params: tuple[str, ...]  # parameter names, in the step's order
    per_channel: tuple[bool, ...]  # per parameter: a [C] tensor (else one value)
    learnable: tuple[bool, ...]  # per parameter: its gradient is computed
    inits: tuple[float | str, ...]  # per state: its initial value, a number or a parameter's name
    fp64: bool  # compute in fp64 (fp64 input), else fp32
    affine: str = ""  # a norm folded in front of the neuron: "bn" (x * a[c] + b[c]) or "ln" (per-position statistics)

    def __post_init__(self) -> None:
        if self.affine not in AFFINE_MODES:
            raise ValueError(f"affine={self.affine!r} is not valid; choose one of {AFFINE_MODES}")


#: The values of :attr:`KernelSpec.affine`: no norm, a batch norm, a layer norm over channels.
AFFINE_MODES = ("", "bn", "ln")


#: Per-channel sums as the backward stores them (``CSUM``): one value per neuron, per program (the
#: program's block lies in one channel), or per channel of each program (the block is whole rows of ``CB``
#: channels, the channels-last numbering).
CSUM_NEURON, CSUM_PROGRAM, CSUM_ROWS = 0, 1, 2

_STORE_CHANNEL_SUMS = (
    "@triton.jit",
    "def _store_channel_sums(ptr, acc, offs, mask, pid, CSUM: tl.constexpr, CB: tl.constexpr, BLOCK: tl.constexpr):",
    '    """The per-neuron sums ``acc`` of a block (zero where masked), stored as ``CSUM`` says."""',
    f"    if CSUM == {CSUM_NEURON}:",
    "        tl.store(ptr + offs, acc, mask=mask)",
    f"    elif CSUM == {CSUM_PROGRAM}:",
    "        tl.store(ptr + pid, tl.sum(acc, axis=0))",
    "    else:",
    "        tl.store(ptr + pid * CB + tl.arange(0, CB), tl.sum(tl.reshape(acc, [BLOCK // CB, CB]), axis=0))",
    "",
    "@triton.jit",
    "def _add_channel_sums(rows_ptr, fin_ptr, c0, NROWS: tl.constexpr, M, A, R, C, BLOCK_J: tl.constexpr,",
    "                      BLOCK_C: tl.constexpr):",
    '    """Channels ``c0 .. c0 + BLOCK_C`` of the ``NROWS`` per-channel sums stored ``M`` values apart from',
    "    ``rows_ptr``, each as ``[A, C, R]`` values: each channel's ``A * R`` values added up in a fixed order (a",
    '    ``[BLOCK_J, BLOCK_C]`` tile at a time, then over the tile), into ``fin_ptr`` (``[NROWS, C]``)."""',
    "    offs_c = c0 + tl.arange(0, BLOCK_C)",
    "    mask_c = offs_c < C",
    "    n = A * R",
    "    for q in tl.static_range(NROWS):",
    "        acc = tl.zeros([BLOCK_J, BLOCK_C], dtype=fin_ptr.dtype.element_ty)",
    "        for j0 in range(0, n, BLOCK_J):",
    "            j = j0 + tl.arange(0, BLOCK_J)",
    "            at = (j // R).to(tl.int64)[:, None] * C * R + (offs_c * R)[None, :] + (j % R)[:, None]",
    "            m = (j < n)[:, None] & mask_c[None, :]",
    '            acc += tl.load(rows_ptr + q * M + at, mask=m, other=0.0, cache_modifier=".cg")',
    "        tl.store(fin_ptr + q * C + offs_c, tl.sum(acc, axis=0), mask=mask_c)",
    "",
    "@triton.jit",
    "def _finish_channel_sums(rows_ptr, fin_ptr, sem_ptr, pid, NROWS: tl.constexpr, M, A, R, C, S,",
    "                         CSUM: tl.constexpr, BLOCK: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr):",
    '    """The per-channel sums finished where they are stored (eager launches): with one value per program, the',
    "    last of a channel's programs to arrive adds up that channel's (one arrival counter per channel), else the",
    "    last of all programs adds up every channel's (one counter); it zeroes its counter again for the next",
    '    launch."""',
    f"    if CSUM == {CSUM_PROGRAM}:",
    "        c = (pid * BLOCK // S) % C",
    "        if _last_to_arrive(sem_ptr + c, tl.num_programs(0) // C):",
    "            _add_channel_sums(rows_ptr, fin_ptr, c, NROWS, M, A, R, C, BLOCK_J, 1)",
    "            tl.store(sem_ptr + c, 0)",
    "    else:",
    "        if _last_to_arrive(sem_ptr, tl.num_programs(0)):",
    "            for c0 in range(0, C, BLOCK_C):",
    "                _add_channel_sums(rows_ptr, fin_ptr, c0, NROWS, M, A, R, C, BLOCK_J, BLOCK_C)",
    "            tl.store(sem_ptr, 0)",
)


def _fmt(v: float) -> str:
    if v != v:
        return 'float("nan")'
    if v in (float("inf"), float("-inf")):
        return f'float("{v}")'
    return repr(float(v))


#: Operations written as one expression of their arguments ({0}, {1}, ...; {op}: the operation's name).
_EXPR = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "mul_rn({0}, {1}, NO_FMA_)", "div": "{0} / {1}", "neg": "-{0}",
    **dict.fromkeys(("exp", "log", "sqrt", "abs", "floor", "sigmoid"), "tl.{op}({0})"),
    "relu": "tl.where({0} > 0.0, {0}, 0.0)",
    "minimum": "tl.where({1} < {0}, {1}, {0})", "maximum": "tl.where({1} > {0}, {1}, {0})",
    "where": "tl.where({0} != 0.0, {1}, {2})",
}


#: The end of a generated kernel's signature and its first lines: this program's block of neurons.
_KERNEL_START = (
    "    CHUNK: tl.constexpr, BLOCK: tl.constexpr,",
    "):",
    "    pid = tl.program_id(0)",
    "    offs = pid * BLOCK + tl.arange(0, BLOCK)",
    "    mask = offs < N",
    "    N64 = tl.cast(N, tl.int64)",
)


def _emit_function(name: str, graph: Graph, args: list[str], ct: str) -> list[str]:
    """``@triton.jit def name(*args)`` computing ``graph`` (inputs named as ``args``), returning its outputs."""
    lines = ["@triton.jit", f"def {name}({', '.join(args)}):"]
    names: dict[int, str] = {}
    shape_of = args[0]
    live = graph.live()
    for i, n in enumerate(graph.nodes):
        if i not in live:
            continue
        a = [names[j] for j in n.args]
        op = n.op
        v = f"t{i}"
        if op == "input":
            names[i] = n.attr if n.attr in args else None
            if names[i] is None:
                raise ValueError(f"graph input {n.attr!r} is not an argument of {name}")
            continue
        if op == "const":
            expr = f"tl.full({shape_of}.shape, {_fmt(n.attr)}, {ct})"
        elif op in _EXPR:
            expr = _EXPR[op].format(*a, op=op)
        elif op == "fdiv":  # the reverse step's divisions: the fast form (the backward is issue-bound)
            expr = f"{a[0]} / {a[1]}" if ct == "tl.float64" else f"tl.math.fdiv({a[0]}, {a[1]})"
        elif op == "tanh":  # sign(a) (1 - e) / (1 + e), e = exp(-2 |a|)
            lines.append(f"    e{i} = tl.exp(-2.0 * tl.abs({a[0]}))")
            lines.append(f"    r{i} = (1.0 - e{i}) / (1.0 + e{i})")
            expr = f"tl.where({a[0]} >= 0.0, r{i}, -r{i})"
        elif op == "clamp":
            lo, hi = n.attr
            expr = a[0]
            if lo is not None:
                expr = f"tl.where({expr} < {_fmt(lo)}, {_fmt(lo)}, {expr})"
            if hi is not None:
                lines.append(f"    k{i} = {expr}")
                expr = f"tl.where(k{i} > {_fmt(hi)}, {_fmt(hi)}, k{i})"
        elif op in ("lt", "le", "gt", "ge", "eq", "ne"):
            sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op]
            expr = f"tl.where({a[0]} {sym} {a[1]}, 1.0, 0.0).to({ct})"
        elif op == "round":  # half to even, as torch.round
            lines.append(f"    f{i} = tl.floor({a[0]} + 0.5)")
            lines.append(f"    odd{i} = (f{i} - 2.0 * tl.floor(f{i} * 0.5)) != 0.0")
            expr = f"tl.where((f{i} - {a[0]} == 0.5) & odd{i}, f{i} - 1.0, f{i})"
        elif op == "sign":
            expr = f"tl.where({a[0]} > 0.0, 1.0, tl.where({a[0]} < 0.0, -1.0, 0.0)).to({ct})"
        elif op == "detach":
            names[i] = a[0]
            continue
        elif op == "spike":
            expr = f"tl.where({a[0]} >= 0.0, 1.0, 0.0).to({ct})"
        else:  # pragma: no cover - every op of OPS is handled above
            raise ValueError(f"no code for {op}")
        lines.append(f"    {v} = {expr}")
        names[i] = v
    outs = []
    for o in graph.outputs:
        ref = names[o]
        if ref in args:  # an output that is an input unchanged: a copy keeps the tuple's values distinct
            ref = f"{ref} + 0.0"
        outs.append(ref)
    lines.append(f"    return {', '.join(outs)}" + ("," if len(outs) == 1 else ""))
    return lines


def generate(fwd: Graph, bwd: Graph, spec: KernelSpec) -> str:
    """The Python source of the module (see the module docstring)."""
    ct = "tl.float64" if spec.fp64 else "tl.float32"
    K, M = len(spec.states), len(spec.params)
    S = [f"s{i}" for i in range(K)]
    P = [f"p{j}" for j in range(M)]
    L = [j for j in range(M) if spec.learnable[j]]
    step_args = ["x", *S, *P]
    out: list[str] = [
        '"""Generated by snntrain.kernels.neuron_codegen from a traced neuron step; do not edit."""',
        "import triton",
        "import triton.language as tl",
        "from snntrain.kernels.bn_neuron import _last_to_arrive",
        "from snntrain.kernels.neuron_step import NO_FMA, mul_rn",
        *(["from snntrain.kernels.ln_neuron import _ln_dx",
           "from snntrain.kernels.norm_neuron_base import _at, _load_chunk, _tile"] if spec.affine == "ln" else []),
        "",
        f"NO_FMA_ = tl.constexpr({'False' if spec.fp64 else 'NO_FMA'})",
        f"STATES = {spec.states!r}",
        f"PARAMS = {spec.params!r}",
        "",
    ]
    # the step graphs name their inputs by the user's names; rename to positional argument names
    fwd_r = _renamed(fwd, dict(zip(["x", *spec.states, *spec.params], step_args)))
    out += _emit_function("_step", fwd_r, step_args, ct)
    out.append("")
    g_args = [f"g_{k}" for k in range(1 + K)]
    bwd_r = _renamed(bwd, dict(zip(["x", *spec.states, *spec.params], step_args)))
    out += _emit_function("_step_bwd", bwd_r, step_args + g_args, ct)
    out.append("")
    out += [*_STORE_CHANNEL_SUMS, ""]
    any_channel = any(spec.per_channel) or bool(spec.affine)
    aff = bool(spec.affine)
    bn, ln = spec.affine == "bn", spec.affine == "ln"

    def param_loads(indent: str) -> list[str]:
        lines = []
        if any_channel:
            lines.append(f"{indent}ch = (offs // S) % C")
        for j in range(M):
            if spec.per_channel[j]:
                lines.append(f"{indent}p{j} = tl.load(p{j}_ptr + ch, mask=mask, other=1.0).to({ct})")
            else:
                lines.append(f"{indent}p{j} = tl.zeros([BLOCK], {ct}) + tl.load(p{j}_ptr).to({ct})")
        if bn:  # the scale and shift of x * aa + ab: rstd * weight, bias - mean * rstd * weight
            lines += [f"{indent}am = tl.load(mean_ptr + ch, mask=mask, other=0.0).to({ct})",
                      f"{indent}ar = tl.load(rstd_ptr + ch, mask=mask, other=1.0).to({ct})",
                      f"{indent}if HAS_W:",
                      f"{indent}    aa = mul_rn(ar, tl.load(w_ptr + ch, mask=mask, other=1.0).to({ct}), NO_FMA_)",
                      f"{indent}else:",
                      f"{indent}    aa = ar",
                      f"{indent}if HAS_B:",
                      f"{indent}    ab = tl.load(b_ptr + ch, mask=mask, other=0.0).to({ct}) - mul_rn(am, aa, NO_FMA_)",
                      f"{indent}else:",
                      f"{indent}    ab = -mul_rn(am, aa, NO_FMA_)"]
        if ln:
            lines.append(f"{indent}aa = tl.load(a_ptr + ch, mask=mask, other=1.0).to({ct})")
            lines.append(f"{indent}ab = tl.load(b_ptr + ch, mask=mask, other=0.0).to({ct})")
        if ln:  # the neuron's position: its index without the channel
            lines.append(f"{indent}pos = (offs // (C * S)) * S + offs % S")
        return lines

    def ln_stats(indent: str, t64: str, m: str) -> list[str]:
        """Loads of the layer norm's statistics of step ``t64`` (``lm``, ``lr``)."""
        return [f"{indent}st = {t64} * stride_st + pos",
                f"{indent}lm = tl.load(mean_ptr + st, mask={m}, other=0.0).to({ct})",
                f"{indent}lr = tl.load(rstd_ptr + st, mask={m}, other=0.0).to({ct})"]

    ln_apply = "mul_rn(mul_rn(x - {0}, {1}, NO_FMA_), aa, NO_FMA_) + ab"  # (x - mean) * rstd * w + b
    ln_args = ["    mean_ptr, rstd_ptr,  # the layer norm's statistics per position, at t*stride_st + p",
               "    stride_st,  # positions per step, or 0 (one input repeated over T)"]

    def init_states(indent: str) -> list[str]:
        lines = [f"{indent}if HAS_INIT:"]
        for i in range(K):
            lines.append(f"{indent}    s{i} = tl.load(init_ptr + {i} * N64 + offs, mask=mask, other=0.0).to({ct})")
        lines.append(f"{indent}else:")
        for i, init in enumerate(spec.inits):
            if isinstance(init, str):
                lines.append(f"{indent}    s{i} = p{spec.params.index(init)} + 0.0")
            else:
                lines.append(f"{indent}    s{i} = tl.zeros([BLOCK], {ct}) + {_fmt(init)}")
        return lines

    p_ptrs = [f"p{j}_ptr" for j in range(M)]
    # ---------------- forward kernel
    out += [
        '@triton.jit(do_not_specialize=["T"])',
        "def fwd_kernel(",
        "    x_ptr,  # [T, N] input; x[t, n] at t*stride_xt + n*stride_xn",
        "    init_ptr,  # [K, N] initial states, read when HAS_INIT",
        *[f"    {p},  # parameter {spec.params[j]!r}: {'[C]' if spec.per_channel[j] else '[1]'}"
          for j, p in enumerate(p_ptrs)],
        *(["    mean_ptr, rstd_ptr,  # [C] the batch norm's statistics (x * a + b, a = rstd * w, b = bias - mean * a)",
           "    w_ptr, b_ptr,  # [C] its weight and bias, read when HAS_W, HAS_B"] if bn else []),
        *(["    a_ptr, b_ptr,  # [C] the layer norm's weight and bias"] + ln_args if ln else []),
        "    y_ptr,  # [T, N] contiguous outputs, dtype of x",
        "    final_ptr,  # [K, N] states after the last step, written when STORE_FINAL",
        "    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, K, N]: row c-1 = the states before chunk c, when STORE_CKPT",
        "    T, N, C, S, stride_xt, stride_xn,",
        "    HAS_INIT: tl.constexpr, STORE_FINAL: tl.constexpr, STORE_CKPT: tl.constexpr,",
        *(["    HAS_W: tl.constexpr, HAS_B: tl.constexpr,"] if bn else []),
        *_KERNEL_START,
        *param_loads("    "),
        *init_states("    "),
        "    x_base = x_ptr + offs * stride_xn",
        "    out_dtype = y_ptr.dtype.element_ty",
        "    n_chunks = tl.cdiv(T, CHUNK)",
        "    for c_iter in range(n_chunks):",
        "        c = tl.cast(c_iter, tl.int32)",
        "        t0 = c * CHUNK",
        "        if STORE_CKPT:",
        f"            row = tl.cast(c - 1, tl.int64) * ({K} * N64)",
        "            m_ck = offs < tl.where(c > 0, N, 0)",
        *[f"            tl.store(ckpt_ptr + row + {i} * N64 + offs, s{i}, mask=m_ck)" for i in range(K)],
        "        xs = ()",
        *(["        ms = ()", "        rs = ()"] if ln else []),
        "        for j in tl.static_range(CHUNK):",
        "            m = offs < tl.where(t0 + j < T, N, 0)",
        "            xs = xs + (tl.load(x_base + tl.cast(t0 + j, tl.int64) * stride_xt, mask=m, other=0.0),)",
        *([*ln_stats("            ", "tl.cast(t0 + j, tl.int64)", "m"), "            ms = ms + (lm,)",
           "            rs = rs + (lr,)"] if ln else []),
        "        for j in tl.static_range(CHUNK):",
        "            t = t0 + j",
        "            valid = t < T",
        "            m = offs < tl.where(valid, N, 0)",
        f"            x = xs[j].to({ct})",
        *(["            x = mul_rn(x, aa, NO_FMA_) + ab"] if bn else []),
        *(["            x = " + ln_apply.format("ms[j]", "rs[j]")] if ln else []),
        f"            y, {', '.join(f'n{i}' for i in range(K))}{',' if K == 1 else ''} = _step({', '.join(step_args)})",
        "            tl.store(y_ptr + tl.cast(t, tl.int64) * N + offs, y.to(out_dtype), mask=m)",
        *[f"            s{i} = tl.where(valid, n{i}, s{i})" for i in range(K)],
        "    if STORE_FINAL:",
        *[f"        tl.store(final_ptr + {i} * N64 + offs, s{i}, mask=mask)" for i in range(K)],
        "",
    ]
    # ---------------- backward kernel
    gp_ptrs = [f"gp{j}_ptr" for j in L if not spec.per_channel[j]]
    # per-channel sums, one row each: the per-channel learnable parameters' gradients, then the batch norm's two
    rows_names = [f"dL/d{spec.params[j]!r}" for j in L if spec.per_channel[j]] + (["dL/dy", "dL/dy * xhat"] if bn else [])
    n_channel = sum(1 for j in L if spec.per_channel[j])
    rows_doc = f"{n_channel} + 2 * NORM_SUMS" if bn else f"{n_channel}"
    out += [
        '@triton.jit(do_not_specialize=["T"])',
        "def bwd_kernel(",
        "    x_ptr,  # [T, N] forward input; x[t, n] at t*stride_xt + n*stride_xn",
        "    init_ptr,  # [K, N] initial states, read when HAS_INIT",
        "    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, K, N] checkpoints written by the forward",
        *[f"    {p}," for p in p_ptrs],
        *(["    mean_ptr, rstd_ptr,  # [C] the batch norm's statistics (x * a + b, a = rstd * w, b = bias - mean * a)",
           "    w_ptr, b_ptr,  # [C] its weight and bias, read when HAS_W, HAS_B"] if bn else []),
        *(["    a_ptr, b_ptr,  # [C] the layer norm's weight and bias"] + ln_args if ln else []),
        "    gy_ptr,  # [T, N] dL/dy at t*stride_gt + n*stride_gn (strides may be 0), read when HAS_GY",
        "    gfinal_ptr,  # [K, N] dL/d(final states), read when HAS_GFINAL",
        "    gx_ptr,  # [T, N] contiguous dL/dx (with a norm: dL/dy) out, dtype of x ([N], summed over T, when SUM_T)",
        "    ginit_ptr,  # [K, N] dL/d(initial states) out, written when STORE_GINIT",
        *[f"    {p},  # dL/d{spec.params[j]!r}: [num_programs] per-program sums" for p, j in zip(gp_ptrs, L)],
        *([f"    rows_ptr,  # [{rows_doc}, M] per-channel sums as CSUM says, rows M values apart: "
           f"{', '.join(rows_names)}"] if rows_names else []),
        *(["    fin_ptr,  # [rows, C] the finished per-channel sums, written when FINISH",
           "    sem_ptr,  # int32 arrival counters (C with CSUM_PROGRAM, else 1), zero between launches (FINISH)"]
          if rows_names else []),
        "    T, N, C, S, stride_xt, stride_xn, stride_gt, stride_gn,",
        *(["    M, A, R,  # values per row of rows_ptr, laid out [A, C, R]"] if rows_names else []),
        "    HAS_INIT: tl.constexpr, HAS_GY: tl.constexpr, HAS_GFINAL: tl.constexpr, STORE_GINIT: tl.constexpr,",
        "    CSUM: tl.constexpr, CB: tl.constexpr,  # how per-channel sums are stored (_store_channel_sums)",
        *(["    NROWS: tl.constexpr,  # rows of rows_ptr",
           "    FINISH: tl.constexpr,  # the last program to store its part of a channel's sums adds them up",
           "    FINISH_J: tl.constexpr, FINISH_C: tl.constexpr,  # the finishing tile (_add_channel_sums)"]
          if rows_names else []),
        *(["    HAS_W: tl.constexpr, HAS_B: tl.constexpr,",
           "    NORM_SUMS: tl.constexpr,  # store the norm's two sums"] if bn else []),
        *(["    SUM_T: tl.constexpr,  # x's time axis has stride 0: dL/dx summed over T, stored once"] if aff else []),
        *(["    GX_SCALED: tl.constexpr,  # store a * dL/dy (dL/dx of a norm with fixed statistics)"] if bn else []),
        *_KERNEL_START,
        *param_loads("    "),
        *init_states("    "),
        *[f"    i{i} = s{i}" for i in range(K)],
        "    if HAS_GFINAL:",
        *[f"        gs{i} = tl.load(gfinal_ptr + {i} * N64 + offs, mask=mask, other=0.0).to({ct})" for i in range(K)],
        "    else:",
        *[f"        gs{i} = tl.zeros([BLOCK], {ct})" for i in range(K)],
        *[f"    acc{j} = tl.zeros([BLOCK], {ct})" for j in L],
        *([f"    sg = tl.zeros([BLOCK], {ct})", f"    sgx = tl.zeros([BLOCK], {ct})"] if bn else []),
        *([f"    gsum = tl.zeros([BLOCK], {ct})"] if aff else []),
        "    x_base = x_ptr + offs * stride_xn",
        "    if HAS_GY:",
        "        gy_base = gy_ptr + offs * stride_gn",
        "    out_dtype = gx_ptr.dtype.element_ty",
        "    n_chunks = tl.cdiv(T, CHUNK)",
        "    for cc in range(n_chunks):",
        "        c = n_chunks - 1 - tl.cast(cc, tl.int32)",
        "        t0 = c * CHUNK",
        f"        row = tl.cast(c - 1, tl.int64) * ({K} * N64)",
        "        m_ck = offs < tl.where(c > 0, N, 0)",
        *[f"        s{i} = tl.where(c > 0, tl.load(ckpt_ptr + row + {i} * N64 + offs, mask=m_ck, other=0.0), i{i})"
          for i in range(K)],
        "        xs = ()",
        "        xhs = ()",
        "        gys = ()",
        *[f"        ss{i} = ()" for i in range(K)],
        "        for j in tl.static_range(CHUNK):",
        "            t64 = tl.cast(t0 + j, tl.int64)",
        "            m = offs < tl.where(t0 + j < T, N, 0)",
        f"            x = tl.load(x_base + t64 * stride_xt, mask=m, other=0.0).to({ct})",
        *(["            xhs = xhs + ((x - am) * ar,)", "            x = mul_rn(x, aa, NO_FMA_) + ab"] if bn else []),
        *([*ln_stats("            ", "t64", "m"), "            x = " + ln_apply.format("lm", "lr")] if ln else []),
        "            xs = xs + (x,)",
        "            if HAS_GY:",
        f"                gys = gys + (tl.load(gy_base + t64 * stride_gt, mask=m, other=0.0).to({ct}),)",
        "            else:",
        f"                gys = gys + (tl.zeros([BLOCK], {ct}),)",
        *[f"            ss{i} = ss{i} + (s{i},)" for i in range(K)],
        f"            _y, {', '.join(f's{i}' for i in range(K))}{',' if K == 1 else ''} = _step({', '.join(step_args)})",
        "        for j in tl.static_range(CHUNK - 1, -1, -1):",
        "            t = t0 + j",
        "            valid = t < T",
        "            m = offs < tl.where(valid, N, 0)",
        f"            r = _step_bwd(xs[j], {', '.join([f'ss{i}[j]' for i in range(K)] + P)}, gys[j], "
        f"{', '.join(f'gs{i}' for i in range(K))})",
        *(["            if SUM_T:",
           "                gsum += tl.where(m, r[0], 0.0)",
           "            else:",
           "                gx = r[0]",
           *(["                if GX_SCALED:",
              "                    gx = mul_rn(gx, aa, NO_FMA_)"] if bn else []),
           "                tl.store(gx_ptr + tl.cast(t, tl.int64) * N + offs, gx.to(out_dtype), mask=m)"] if aff else
          ["            tl.store(gx_ptr + tl.cast(t, tl.int64) * N + offs, r[0].to(out_dtype), mask=m)"]),
        *[f"            gs{i} = tl.where(valid, r[{1 + i}], gs{i})" for i in range(K)],
        *[f"            acc{j} += tl.where(m, r[{1 + K + q}], 0.0)" for q, j in enumerate(L)],
        *(["            if NORM_SUMS:",
           "                sg += tl.where(m, r[0], 0.0)",
           "                sgx += tl.where(m, r[0] * xhs[j], 0.0)"] if bn else []),
        *(["    if SUM_T:",
           *(["        if GX_SCALED:",
              "            gsum = mul_rn(gsum, aa, NO_FMA_)"] if bn else []),
           "        tl.store(gx_ptr + offs, gsum.to(out_dtype), mask=mask)"] if aff else []),
        *(["    M64 = tl.cast(M, tl.int64)"] if rows_names else []),
        *(["    if NORM_SUMS:",
           f"        _store_channel_sums(rows_ptr + {n_channel} * M64, sg, offs, mask, pid, CSUM, CB, BLOCK)",
           f"        _store_channel_sums(rows_ptr + {n_channel + 1} * M64, sgx, offs, mask, pid, CSUM, CB, BLOCK)"]
          if bn else []),
        "    if STORE_GINIT:",
        *[f"        tl.store(ginit_ptr + {i} * N64 + offs, gs{i}, mask=mask)" for i in range(K)],
        *[f"    _store_channel_sums(rows_ptr + {q} * M64, acc{j}, offs, mask, pid, CSUM, CB, BLOCK)"
          for q, j in enumerate(j for j in L if spec.per_channel[j])],
        *[f"    tl.store(gp{j}_ptr + pid, tl.sum(acc{j}, axis=0))" for j in L if not spec.per_channel[j]],
        *(["    if FINISH:",
           "        _finish_channel_sums(rows_ptr, fin_ptr, sem_ptr, pid, NROWS, M64, A, R, C, S, CSUM, BLOCK, FINISH_J,",
           "                             FINISH_C)"] if rows_names else []),
        "",
    ]
    if ln:
        out += _ln_tile_kernels(spec, ct)
    return "\n".join(out) + "\n"


def _ln_tile_kernels(spec: KernelSpec, ct: str) -> list[str]:
    """The position-tile kernels of spec ``affine`` ``"ln"`` (see the module docstring): ``_ln_norm``, then
    ``ln_fwd_kernel`` and ``ln_bwd_kernel``."""
    K, M = len(spec.states), len(spec.params)
    S = [f"s{i}" for i in range(K)]
    P = [f"p{j}" for j in range(M)]
    L = [j for j in range(M) if spec.learnable[j]]
    step_args = ["x", *S, *P]
    p_ptrs = [f"p{j}_ptr" for j in range(M)]
    news = f"{', '.join(f'n{i}' for i in range(K))}{',' if K == 1 else ''}"
    tile = "[BLOCK_S, BLOCK_C]"
    # fp32: rsqrt, as the hand-written fused op; fp64: an IEEE square root and division
    rstd = "tl.rsqrt(var + eps)" if ct == "tl.float32" else "1.0 / tl.sqrt(var + eps)"

    def setup(indent: str) -> list[str]:
        """The program's tile, the parameters (full tiles), the norm's weight and bias, the initial states."""
        lines = [f"{indent}b, offs_s, offs_c, mask_c, mask = _tile(pid, 0, s_tiles, S, C, BLOCK_S, BLOCK_C)"]
        for j in range(M):
            if spec.per_channel[j]:
                lines.append(f"{indent}p{j} = tl.zeros({tile}, {ct}) + "
                             f"tl.load(p{j}_ptr + offs_c, mask=mask_c, other=1.0).to({ct})[None, :]")
            else:
                lines.append(f"{indent}p{j} = tl.zeros({tile}, {ct}) + tl.load(p{j}_ptr).to({ct})")
        lines += [f"{indent}w = tl.load(w_ptr + offs_c, mask=mask_c, other=0.0).to({ct})",
                  f"{indent}bb = tl.load(b_ptr + offs_c, mask=mask_c, other=0.0).to({ct})",
                  # fp64: eps compiled in (a float argument arrives rounded to fp32)
                  f"{indent}eps = " + ("tl.cast(eps, tl.float32)" if ct == "tl.float32"
                                       else "tl.full([BLOCK_S], EPS64, tl.float64)")]
        for i, init in enumerate(spec.inits):
            if isinstance(init, str):
                lines.append(f"{indent}s{i} = p{spec.params.index(init)} + 0.0")
            else:
                lines.append(f"{indent}s{i} = tl.zeros({tile}, {ct}) + {_fmt(init)}")
        lines += [f"{indent}x_base = _at(x_ptr, b, offs_s, offs_c, sx_b, sx_s, sx_c)",
                  f"{indent}ck_base = _at(ckpt_ptr, b, offs_s, offs_c, C * S, 1, S)",
                  f"{indent}NCK = tl.cast(B, tl.int64) * C * S  # one state of one step, in the checkpoints"]
        return lines

    out = [
        "@triton.jit",
        "def _ln_norm(x, mask, C, eps, w, bb):",
        '    """The layer norm of each row of a [BLOCK_S, BLOCK_C] tile over its C channels: (y, xhat, rstd)."""',
        "    mean = tl.sum(x, axis=1) / C",
        "    xc = tl.where(mask, x - mean[:, None], 0.0)",
        "    var = tl.sum(xc * xc, axis=1) / C",
        f"    rstd = {rstd}",
        "    xhat = mul_rn(xc, tl.broadcast_to(rstd[:, None], xc.shape), NO_FMA_)",
        "    return mul_rn(xhat, tl.broadcast_to(w[None, :], xc.shape), NO_FMA_) + bb[None, :], xhat, rstd",
        "",
        '@triton.jit(do_not_specialize=["T"])',
        "def ln_fwd_kernel(",
        "    x_ptr,  # [T, B, C, S] input at t*sx_t + b*sx_b + c*sx_c + s*sx_s (sx_t = 0: one input repeated over T)",
        *[f"    {p},  # parameter {spec.params[j]!r}: {'[C]' if spec.per_channel[j] else '[1]'}"
          for j, p in enumerate(p_ptrs)],
        "    w_ptr, b_ptr,  # [C] the layer norm's weight and bias",
        "    y_ptr,  # [T, B, C, S] outputs (dtype of x) at t*so_t + b*so_b + c*so_c + s*so_s",
        "    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, K, B, C, S] contiguous: the states before every chunk but the first",
        "    T, B, C, S, s_tiles,",
        "    sx_t, sx_b, sx_c, sx_s,",
        "    so_t, so_b, so_c, so_s,",
        "    eps,",
        "    EPS64: tl.constexpr,  # eps, read in fp64 kernels",
        "    EXPANDED: tl.constexpr,  # sx_t = 0: the input normalised once",
        "    STORE_CKPT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,",
        "):",
        "    pid = tl.program_id(0)",
        *setup("    "),
        "    y_base = _at(y_ptr, b, offs_s, offs_c, so_b, so_s, so_c)",
        "    out_dtype = y_ptr.dtype.element_ty",
        "    if EXPANDED:",
        f"        xe, _xh, _r = _ln_norm(tl.load(x_base, mask=mask, other=0.0).to({ct}), mask, C, eps, w, bb)",
        "    n_chunks = tl.cdiv(T, CHUNK)",
        "    for c_iter in range(n_chunks):",
        "        c = tl.cast(c_iter, tl.int32)",
        "        t0 = c * CHUNK",
        "        if STORE_CKPT:",
        f"            row = ck_base + tl.cast(c - 1, tl.int64) * ({K} * NCK)",
        "            m_ck = mask & (c > 0)",
        *[f"            tl.store(row + {i} * NCK, s{i}, mask=m_ck)" for i in range(K)],
        "        if not EXPANDED:",
        "            xs = _load_chunk(x_base, sx_t, t0, T, mask, CHUNK)",
        "        for j in tl.static_range(CHUNK):",
        "            t = t0 + j",
        "            valid = t < T",
        "            if EXPANDED:",
        "                x = xe",
        "            else:",
        f"                x, _xh, _r = _ln_norm(xs[j].to({ct}), mask, C, eps, w, bb)",
        f"            y, {news} = _step({', '.join(step_args)})",
        "            tl.store(y_base + tl.cast(t, tl.int64) * so_t, y.to(out_dtype), mask=mask & valid)",
        *[f"            s{i} = tl.where(valid, n{i}, s{i})" for i in range(K)],
        "",
        '@triton.jit(do_not_specialize=["T"])',
        "def ln_bwd_kernel(",
        "    x_ptr,  # [T, B, C, S] forward input at t*sx_t + b*sx_b + c*sx_c + s*sx_s",
        "    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, K, B, C, S] checkpoints written by the forward",
        *[f"    {p}," for p in p_ptrs],
        "    w_ptr, b_ptr,  # [C] the layer norm's weight and bias",
        "    gy_ptr,  # [T, B, C, S] dL/d(outputs) at t*sg_t + ...",
        "    gx_ptr,  # dL/dx out at t*sd_t + ... (dtype of x; [B, C, S] once, summed over T, when EXPANDED)",
        f"    part_ptr,  # [programs, {2 + len(L)}, C] per-program sums: dL/dweight, dL/dbias, then each learnable "
        "parameter's (one value: column 0)",
        "    T, B, C, S, s_tiles,",
        "    sx_t, sx_b, sx_c, sx_s,",
        "    sg_t, sg_b, sg_c, sg_s,",
        "    sd_t, sd_b, sd_c, sd_s,",
        "    eps,",
        "    EPS64: tl.constexpr,  # eps, read in fp64 kernels",
        "    EXPANDED: tl.constexpr,  # sx_t = 0: the input normalised once, dL/dx summed over T",
        "    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,",
        "):",
        "    pid = tl.program_id(0)",
        *setup("    "),
        *[f"    i{i} = s{i}" for i in range(K)],
        *[f"    gs{i} = tl.zeros({tile}, {ct})" for i in range(K)],
        *[f"    acc{j} = tl.zeros({tile}, {ct})" for j in L],
        f"    acc_g = tl.zeros({tile}, {ct})  # sum of dL/dy (EXPANDED: per element, over T)",
        f"    acc_gx = tl.zeros({tile}, {ct})  # sum of dL/dy * xhat",
        "    gy_base = _at(gy_ptr, b, offs_s, offs_c, sg_b, sg_s, sg_c)",
        "    gx_base = _at(gx_ptr, b, offs_s, offs_c, sd_b, sd_s, sd_c)",
        "    out_dtype = gx_ptr.dtype.element_ty",
        "    if EXPANDED:",
        f"        xe, xhe, re = _ln_norm(tl.load(x_base, mask=mask, other=0.0).to({ct}), mask, C, eps, w, bb)",
        "    n_chunks = tl.cdiv(T, CHUNK)",
        "    for cc in range(n_chunks):",
        "        c = n_chunks - 1 - tl.cast(cc, tl.int32)",
        "        t0 = c * CHUNK",
        f"        row = ck_base + tl.cast(c - 1, tl.int64) * ({K} * NCK)",
        "        m_ck = mask & (c > 0)",
        *[f"        s{i} = tl.where(c > 0, tl.load(row + {i} * NCK, mask=m_ck, other=0.0), i{i})" for i in range(K)],
        "        gys = _load_chunk(gy_base, sg_t, t0, T, mask, CHUNK)",
        "        if not EXPANDED:",
        "            xr = _load_chunk(x_base, sx_t, t0, T, mask, CHUNK)",
        "        xs = ()",
        "        xhs = ()",
        "        rs = ()",
        *[f"        ss{i} = ()" for i in range(K)],
        "        for j in tl.static_range(CHUNK):",
        "            if EXPANDED:",
        "                x = xe",
        "            else:",
        f"                x, xh, r = _ln_norm(xr[j].to({ct}), mask, C, eps, w, bb)",
        "                xhs = xhs + (xh,)",
        "                rs = rs + (r,)",
        "            xs = xs + (x,)",
        *[f"            ss{i} = ss{i} + (s{i},)" for i in range(K)],
        f"            _y, {', '.join(S)}{',' if K == 1 else ''} = _step({', '.join(step_args)})",
        "        for j in tl.static_range(CHUNK - 1, -1, -1):",
        "            t = t0 + j",
        "            valid = t < T",
        "            m = mask & valid",
        f"            g = _step_bwd(xs[j], {', '.join([f'ss{i}[j]' for i in range(K)] + P)}, gys[j].to({ct}), "
        f"{', '.join(f'gs{i}' for i in range(K))})",
        "            gy = tl.where(m, g[0], 0.0)",
        "            acc_g += gy",
        "            if not EXPANDED:",
        "                acc_gx += gy * xhs[j]",
        "                gx = _ln_dx(gy, xhs[j], rs[j], w, mask, C)",
        "                tl.store(gx_base + tl.cast(t, tl.int64) * sd_t, gx.to(out_dtype), mask=m)",
        *[f"            gs{i} = tl.where(valid, g[{1 + i}], gs{i})" for i in range(K)],
        *[f"            acc{j} += tl.where(m, g[{1 + K + q}], 0.0)" for q, j in enumerate(L)],
        "    if EXPANDED:",
        "        acc_gx = acc_g * xhe",
        "        tl.store(gx_base, _ln_dx(acc_g, xhe, re, w, mask, C).to(out_dtype), mask=mask)",
        f"    prow = part_ptr + tl.cast(pid, tl.int64) * ({2 + len(L)} * C) + offs_c",
        "    tl.store(prow, tl.sum(acc_gx, axis=0), mask=mask_c)",
        "    tl.store(prow + C, tl.sum(acc_g, axis=0), mask=mask_c)",
        *[(f"    tl.store(prow + {2 + q} * C, tl.sum(acc{j}, axis=0), mask=mask_c)" if spec.per_channel[j]
           else f"    tl.store(part_ptr + tl.cast(pid, tl.int64) * ({2 + len(L)} * C) + {2 + q} * C, "
                f"tl.sum(tl.sum(acc{j}, axis=1), axis=0))") for q, j in enumerate(L)],
        "",
    ]
    return out


def _renamed(graph: Graph, names: dict[str, str]) -> Graph:
    """``graph`` with its input nodes renamed (a shallow copy sharing nothing mutable)."""
    g = Graph()
    for n in graph.nodes:
        attr = names.get(n.attr, n.attr) if n.op == "input" else n.attr
        g.add(n.op, n.args, attr)
    g.outputs = list(graph.outputs)
    return g
