"""Moved: NIR export, reader checks and import are the package :mod:`snntrain.nir` (``from snntrain.nir import
to_nir``). This module re-exports its names for code written against ``snntrain.nir_graph`` and warns once."""

import warnings

from .nir import *  # noqa: F403
from .nir import __all__  # noqa: F401

warnings.warn("snntrain.nir_graph is now snntrain.nir: import from snntrain.nir (e.g. `from snntrain.nir import "
              "to_nir, load_nir`)", DeprecationWarning, stacklevel=2)
