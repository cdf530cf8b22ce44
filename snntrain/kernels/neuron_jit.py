"""Compile and cache the generated neuron kernels (:mod:`snntrain.kernels.neuron_codegen`).

:func:`compile_neuron` keys a neuron by a hash of its forward graph, the parameters' kinds, the states'
initial values, the compute dtype and :data:`~snntrain.kernels.neuron_codegen.CODEGEN_VERSION`. The first
request for a key differentiates the graph, generates the module's source, writes it to
``<cache dir>/neuron_<hash>.py`` (a temporary name, then renamed: a concurrent process never reads a
partial file) and imports it; Triton's ``@jit`` needs its functions' source in a file. Later requests
in the process get the loaded module from memory; another process finds the file and imports it again.
The cache directory is ``$SNNTRAIN_CACHE_DIR/neurons`` or ``~/.cache/snntrain/neurons``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .neuron_codegen import CODEGEN_VERSION, KernelSpec, generate
from .neuron_graph import Graph, differentiate

__all__ = ["CompiledNeuron", "compile_neuron", "cache_dir", "lookup"]


@dataclass(frozen=True)
class CompiledNeuron:
    """A generated module (``fwd_kernel``, ``bwd_kernel``) with its spec, the source's path and its key."""

    key: str
    spec: KernelSpec
    module: ModuleType
    path: Path


_LOADED: dict[str, CompiledNeuron] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where generated sources are written."""
    root = os.environ.get("SNNTRAIN_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "snntrain"
    return base / "neurons"


def neuron_key(fwd: Graph, spec: KernelSpec) -> str:
    text = f"v{CODEGEN_VERSION}|{fwd.key()}|{spec!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def lookup(key: str) -> CompiledNeuron:
    """The neuron compiled under ``key`` in this process (the operators find their kernels by it)."""
    try:
        return _LOADED[key]
    except KeyError:
        raise KeyError(f"no generated neuron with key {key!r} in this process: build the StepNeuron first") from None


def compile_neuron(fwd: Graph, spec: KernelSpec) -> CompiledNeuron:
    """The compiled kernels of the step graph ``fwd`` (from memory, the cache directory, or generated now)."""
    key = neuron_key(fwd, spec)
    done = _LOADED.get(key)
    if done is not None:
        return done
    with _LOCK:
        done = _LOADED.get(key)
        if done is not None:
            return done
        wrt = ["x", *spec.states, *(p for p, learn in zip(spec.params, spec.learnable) if learn)]
        bwd = differentiate(fwd, ["x", *spec.states, *spec.params], wrt)
        source = generate(fwd, bwd, spec)
        path = cache_dir() / f"neuron_{key}.py"
        if not path.exists() or path.read_text() != source:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                f.write(source)
            os.replace(tmp, path)
        name = f"snntrain_generated_neuron_{key}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        done = _LOADED[key] = CompiledNeuron(key, spec, module, path)
        return done
