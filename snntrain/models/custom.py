"""Your own network: a model config with Hydra's ``_target_`` key (``model._target_=my_package.MyNet``).

``_target_`` is the import path of an ``nn.Module`` class, or of a function that returns one. The network is
built with the model config's other keys as keyword arguments, in two kinds:

* the run settings that every snntrain model receives, :data:`RUN_SETTINGS`: ``T``, ``num_classes``,
  ``in_channels``, ``neuron`` (from ``conf/model/custom.yaml``, filled in from the run) and ``backend`` (the
  run's resolved backend). Each is passed only where the constructor's signature takes it (by name, or
  through ``**kwargs``), so a network takes what it needs and nothing else;
* any other key (``+model.width=16`` on the command line) is the network's own argument and is always
  passed: a key that the signature does not take is an error naming the class and the argument.

The model config, ``_target_`` included, is saved in the run config and in every checkpoint, so
:func:`snntrain.export.load_checkpoint`, ``task=export``, ``task=predict`` and ``task=report`` rebuild the
network from it, wherever ``_target_`` can be imported (the package installed, or on ``PYTHONPATH``).
docs/custom_models.md is the tutorial.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn

TARGET = "_target_"
#: Settings a run offers every network: passed where the constructor takes them.
RUN_SETTINGS = ("T", "num_classes", "in_channels", "neuron", "backend")


def import_target(path: object) -> Any:
    """The object that the dotted import path ``path`` names (``package.module.Name``, also
    ``package.module.Class.attribute``)."""
    if not isinstance(path, str) or not path or path.startswith(".") or "." not in path.strip("."):
        raise ValueError(f"model._target_={path!r} must be a dotted import path such as my_package.MyNet "
                         "(the module to import, then the class or function in it)")
    parts = path.split(".")
    module = None
    for i in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:i])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is not None and name != err.name and not name.startswith(err.name + "."):
                raise ImportError(f"model._target_={path}: importing {name} failed: {err}") from err
            continue  # not a module: a shorter prefix may be, and the rest attributes in it
        except Exception as err:  # noqa: BLE001 - the module itself fails: name it and why
            raise ImportError(f"model._target_={path}: importing {name} failed: {type(err).__name__}: {err}") from err
        obj: Any = module
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                raise ImportError(f"model._target_={path}: {name} has no attribute {'.'.join(parts[i:])!r} "
                                  f"(module {name} is {getattr(module, '__file__', None) or 'built in'})")
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"model._target_={path}: no module {parts[0]!r} can be imported; install the package that "
                      "holds the network or put its folder on PYTHONPATH (python -m snntrain runs with the "
                      "current folder on the path)")


def _signature(target: Any, path: str) -> inspect.Signature:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError) as err:
        raise ValueError(f"model._target_={path}: the signature of {target!r} cannot be read ({err})") from None


def build_target(cfg: Mapping[str, Any], backend: str = "auto") -> nn.Module:
    """The network that ``cfg`` (a model config with ``_target_``) describes, built for ``backend``."""
    cfg = dict(cfg)
    path = cfg.pop(TARGET)
    unsupported = sorted(k for k in cfg if k.startswith("_"))
    if unsupported:
        raise ValueError(f"model.{unsupported[0]} is not supported: a _target_ network is built from the model "
                         "config's plain keys (its keyword arguments)")
    target = import_target(path)
    name = getattr(target, "__qualname__", path)
    if not callable(target):
        raise ValueError(f"model._target_={path} names a {type(target).__name__}, not an nn.Module class or a "
                         "function that returns one")
    params = _signature(target, path).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    kwargs = {}
    for key, value in {**cfg, "backend": backend}.items():
        if key in named or takes_any:
            kwargs[key] = value
        elif key not in RUN_SETTINGS:
            raise ValueError(f"model.{key}: {name} takes no argument {key!r}; its arguments: "
                             f"{', '.join(named) or 'none'}")
    missing = [n for n, p in params.items() if p.default is p.empty and n in named and n not in kwargs]
    if missing:
        raise ValueError(f"model._target_={path}: {name} needs argument {missing[0]!r}, which the model config does "
                         f"not give; set it with +model.{missing[0]}=<value> (the run gives "
                         f"{', '.join(RUN_SETTINGS)} where the signature takes them)")
    try:
        model = target(**kwargs)
    except Exception as err:  # noqa: BLE001 - name what was being built, keep the cause
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ValueError(f"model._target_={path}: {name}({args}) failed: {type(err).__name__}: {err}") from err
    if not isinstance(model, nn.Module):
        raise ValueError(f"model._target_={path}: {name} returned a {type(model).__name__}, not a torch.nn.Module")
    return model
