"""The package's layout, read statically: imports go down the layers, never back up to the package root, and no
module outside the kernels grows past one screenful of concerns (700 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "snntrain"
#: Files whose kernels share one concern may be longer (docs/architecture.md, "Kernels").
LONG_ALLOWED = ("kernels",)
MAX_LINES = 700


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _root_names() -> set[str]:
    """What the package root defines itself (its attributes that are not sub-modules)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    names = {"__version__", "__all__"}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:  # from .version import x
            names.update(a.asname or a.name for a in node.names)
    all_names = next((n.value for n in tree.body if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)), None)
    if all_names is not None:
        names.update(ast.literal_eval(all_names))
    return names


def _is_submodule(name: str) -> bool:
    return (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()


def _root_imports(path: Path, text: str | None = None) -> list[str]:
    """Every import in ``path`` that reads from the package root rather than from the module that defines the
    name: ``import snntrain``, ``from snntrain import x`` / ``from .. import x`` (x not a sub-module)."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]  # ("snntrain", "callbacks") for its files
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name == "snntrain"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ((node.module,) if node.module else ()))
            else:
                target = node.module or ""
            if target == "snntrain":
                found += [f"line {node.lineno}: from {'.' * node.level or 'snntrain'} import {a.name}"
                          for a in node.names if not _is_submodule(a.name)]
    return found


def test_no_module_imports_back_from_the_package_root():
    # snntrain/__init__.py re-exports (version, load_checkpoint, ...) for users; inside the package every name is
    # read from the module that defines it (snntrain.version for __version__), so no layer imports the one above it
    assert {"__version__", "load_checkpoint", "load_nir"} <= _root_names()
    offenders = {str(p.relative_to(PACKAGE.parent)): found for p in _modules()
                 if p.name not in ("__init__.py", "__main__.py") or p.parent != PACKAGE
                 for found in [_root_imports(p)] if found}
    assert not offenders, f"modules importing from the package root: {offenders}"


@pytest.mark.parametrize("where, source, bad", [
    ("tasks/probe.py", "from snntrain import __version__\n", True),
    ("tasks/probe.py", "from .. import __version__\n", True),
    ("tasks/probe.py", "import snntrain\n", True),
    ("probe.py", "from . import __version__\n", True),
    ("data/detection/probe.py", "from ... import load_nir\n", True),
    ("tasks/probe.py", "from ..version import __version__\n", False),
    ("tasks/probe.py", "from .. import kernels\n", False),  # a sub-module, not the root's own name
    ("probe.py", "from . import kernels\n", False),
    ("data/detection/probe.py", "from .. import common\n", False),
])
def test_root_import_check_catches_what_it_should(where, source, bad):
    # the check above, on the text of a module at each depth: it must not pass by recognising nothing
    assert bool(_root_imports(PACKAGE / where, source)) is bad


def test_no_module_outside_the_kernels_exceeds_700_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in _modules()
            if p.relative_to(PACKAGE).parts[0] not in LONG_ALLOWED
            for n in [len(p.read_text().splitlines())] if n > MAX_LINES}
    assert not long, f"split these by concern (at most {MAX_LINES} lines a module): {long}"


def test_every_subpackage_ships_in_the_wheel():
    # pyproject.toml lists the packages the wheel holds: a sub-package missing there imports from a checkout and
    # fails from an installed wheel
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "snntrain.version.__version__"}
