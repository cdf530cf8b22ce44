"""Every Triton kernel can be copied into the module that ``torch.compile`` generates.

On a GPU the operators are ``triton_op``s, so Inductor compiles a graph's kernels itself: it writes each kernel's
source into a new module, with the ``@triton.jit`` helpers it calls (by the name the kernel calls them) and the
plain constants it reads, and nothing else. A kernel that reaches a helper through a module attribute
(``base._tile(...)``), under another name than the helper's own, or through a global Inductor does not copy, compiles
eagerly but fails under ``torch.compile``. These checks read the kernels' bytecode the way Inductor's
``define_user_defined_triton_kernel`` does, so they run on the CPU.
"""

from __future__ import annotations

import dis
import importlib
import pkgutil

import pytest
from triton.language import constexpr
from triton.runtime.jit import JITFunction

import snntrain.kernels

try:  # under TRITON_INTERPRET=1, @triton.jit makes an InterpretedFunction
    from triton.runtime.interpreter import InterpretedFunction
    JIT_TYPES: tuple[type, ...] = (JITFunction, InterpretedFunction)
except ImportError:  # pragma: no cover - older Triton
    JIT_TYPES = (JITFunction,)

#: Names a generated kernel module already has.
PROVIDED = {"tl", "triton", "math", "libdevice"}


def kernel_modules() -> list[str]:
    return sorted(f"snntrain.kernels.{m.name}" for m in pkgutil.iter_modules(snntrain.kernels.__path__))


def problems_of(kernel, name: str) -> list[str]:
    """What Inductor's copy of ``kernel`` (and the helpers it reaches) would lack."""
    found: list[str] = []
    included: dict[str, object] = {}

    def visit(k) -> None:
        loads = {i.argval for i in dis.Bytecode(k.fn) if i.opname == "LOAD_GLOBAL"}
        for symbol in k.fn.__code__.co_names:
            if symbol not in k.fn.__globals__ or symbol in PROVIDED:
                continue
            value = k.fn.__globals__[symbol]
            if symbol in included:
                if included[symbol] is not value:
                    found.append(f"{name}: two different globals named {symbol!r} among its helpers")
                continue
            if isinstance(value, JIT_TYPES):
                if value.fn.__name__ != symbol:
                    found.append(f"{name}: helper {value.fn.__module__}.{value.fn.__name__} called as {symbol!r}")
                included[symbol] = value
                visit(value)
            elif isinstance(value, (int, str, bool, constexpr)):
                included[symbol] = value
            elif symbol in loads and not getattr(value, "__module__", "").startswith("triton"):
                found.append(f"{name}: reads the global {symbol!r} ({type(value).__name__}), which is not copied")

    visit(kernel)
    return found


@pytest.mark.parametrize("module", kernel_modules())
def test_every_kernel_compiles_from_its_copied_source(module):
    mod = importlib.import_module(module)
    kernels = [(n, v) for n, v in vars(mod).items() if isinstance(v, JIT_TYPES) and v.fn.__module__ == module]
    found = [p for n, v in kernels for p in problems_of(v, f"{module}.{n}")]
    assert not found, "\n".join(found)


def test_the_check_finds_a_helper_reached_through_a_module(tmp_path, monkeypatch):
    """The check itself: a kernel calling a helper as ``module.helper`` is reported (the kernels are written to
    files: ``@triton.jit`` reads a function's source from its file)."""
    (tmp_path / "check_helpers.py").write_text("import triton\n\n\n@triton.jit\ndef add_one(x):\n    return x + 1\n")
    (tmp_path / "check_kernel.py").write_text(
        "import triton\n\nimport check_helpers as helpers\n\n\n@triton.jit\ndef kernel(p):\n    helpers.add_one(p)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kernel = importlib.import_module("check_kernel").kernel
    assert problems_of(kernel, "kernel") == ["kernel: reads the global 'helpers' (module), which is not copied"]


@pytest.mark.parametrize("module", kernel_modules())
def test_no_kernel_parameter_has_a_default(module):
    """Inductor launches a user kernel with every argument in order: a parameter with a default (``X: tl.constexpr =
    True``) left out at a launch shifts the grid arguments (``launcher() missing ... '_grid_2'`` under
    ``torch.compile`` on a GPU). Every argument is given at every launch instead."""
    import inspect

    mod = importlib.import_module(module)
    found = [f"{module}.{n}({p.name}=...)" for n, v in vars(mod).items()
             if isinstance(v, JIT_TYPES) and v.fn.__module__ == module
             for p in inspect.signature(v.fn).parameters.values() if p.default is not inspect.Parameter.empty]
    assert not found, found
