"""The documentation site (``mkdocs.yml``, ``docs/``) builds in strict mode: a broken link, a page missing from
the nav's files, or a docstring the API reference cannot render fails the build, and so this test (CI runs it: `python -m pytest` includes the slow tier)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a fresh interpreter building the whole site: 3-12 s on two CPU cores
def test_docs_site_builds_in_strict_mode(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-5000:]
    site = tmp_path / "site"
    for page in ("index.html", "api/nn/index.html", "api/models/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "nn" / "index.html").read_text()
    assert "snntrain.nn.LIF" in api and ":class:" not in api  # rendered from the docstrings, roles shown as code
