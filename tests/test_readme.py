"""README.md's claims, checked: the versions it states against pyproject.toml, the default run's metric stated
once as a range, its length and its dated passages, its commands and the user guide's (``docs/``) as valid
configs, and (with ``--long``) the default run and the export, predict and report commands run in order as the
README gives them. The TensorBoard tags it names are checked against a run in tests/test_cli.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: val/acc of the default run (python -m snntrain), as README.md states it
DEFAULT_VAL_ACC = (0.97, 0.99)


def section(title: str) -> str:
    """The text of the README section ``## <title>`` (up to the next ``## ``)."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def commands(text: str) -> list[list[str]]:
    """The ``python -m snntrain ...`` command lines of the code blocks in ``text``, without their comments (a line
    that ends in ``\\`` continues on the next)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line)[3:] for line in lines if line.startswith("python -m snntrain")]


def test_readme_versions_agree_with_pyproject():
    pyproject = (ROOT / "pyproject.toml").read_text()
    requires = re.search(r'^requires-python = "([^"]+)"', pyproject, re.M)[1]
    install = section("Install")
    m = re.search(r"Python (3\.\d+) to (3\.\d+), PyTorch (\d+\.\d+) or newer", install)
    assert m, "README's Install section states the Python and PyTorch versions"
    low, high, torch_min = m.groups()
    major, minor = high.split(".")
    assert requires == f">={low},<{major}.{int(minor) + 1}"
    assert f'"torch>={torch_min}"' in pyproject
    assert 'pip install -e ".[dev]"' in install and "python3 -m venv" in install
    assert "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in install


def test_readme_states_the_default_metric_once_as_a_range():
    run = section("Run")
    stated = re.findall(r"val/acc (\d\.\d+)-(\d\.\d+)", run)
    assert [tuple(map(float, s)) for s in stated] == [DEFAULT_VAL_ACC]
    assert not re.search(r"val/acc \d\.\d+(?![\d-])", run), "the Run section states one range, no single value"
    # the efficiency table's default classifier (docs/efficiency.md) is a run of the same command
    table = re.search(r"\| validation metric \| val/acc (\d\.\d+) \|", (DOCS / "efficiency.md").read_text())
    assert table and DEFAULT_VAL_ACC[0] <= float(table[1]) <= DEFAULT_VAL_ACC[1]


def test_readme_is_short_and_states_no_history():
    """A reader's README: at most 300 lines, at most two carrying a date (the measurement history is in
    docs/experiments.md), and every link into docs/ names a file and heading that exist."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert len([ln for ln in text.splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b", ln)]) <= 2
    for target, anchor in re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", text):
        assert (ROOT / target).is_file(), target
        headings = re.findall(r"^#+ (.+)$", (ROOT / target).read_text(), re.M)
        # GitHub's anchors (and the site's, mkdocs.yml): lower case, punctuation dropped, spaces as hyphens
        slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
        assert not anchor or anchor in slugs, f"{target}#{anchor}"


#: the user guide's pages whose ``python -m snntrain`` lines are today's commands (experiments.md's are of their
#: dates; custom_models.md's name a module that its own test writes, tests/test_custom_model.py)
GUIDE = ["getting-started.md", "training.md", "speed.md", "multinode.md", "data.md", "detection.md", "export.md",
         "efficiency.md", "nir.md", "models.md", "transformers.md", "benchmarks.md"]


@pytest.mark.parametrize("page", ["README.md", *GUIDE])
def test_documented_commands_are_valid_configs(page):
    """Every ``python -m snntrain`` line of README.md and of the user guide composes (placeholders stand for
    paths), so none names a key, group or option that does not exist."""
    from hydra import compose, initialize_config_module

    from snntrain.cli import target_overrides

    text = (README if page == "README.md" else DOCS / page).read_text()
    checked = 0
    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        for args in commands(text):
            if any(a.startswith("-") for a in args):  # sweeps (-m), --help, --cfg: Hydra's own options
                continue
            # as the command line reads them (model._target_ picks model=custom)
            overrides = [re.sub(r"<[^>]*>|\$\w+", "x", a) for a in args]
            compose(config_name="config", overrides=target_overrides(overrides))
            checked += 1
    assert checked >= (15 if page == "README.md" else 0)


def digit_images(folder: Path) -> dict[str, int]:
    """Five digits of scikit-learn's set as 64 x 64 JPEGs, light on dark and dark on light by turns; file -> label."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    folder.mkdir(parents=True, exist_ok=True)
    labels = {}
    for i in range(5):
        image = np.asarray(Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8)).resize((64, 64)))
        name = f"digit{i}.jpg"
        Image.fromarray(255 - image if i % 2 else image).convert("RGB").save(folder / name, quality=95)
        labels[name] = int(digits.target[i])
    return labels


@pytest.mark.slow
@pytest.mark.long
def test_the_readme_default_run_and_its_commands(tmp_path):
    """README's default run, then its export, predict and report commands in the order it gives them, each as a
    command line (about ten minutes on two idle CPU cores): all succeed, the run ends in the stated range, the
    export folder holds every format exported into it, and the predictions are right whatever the digits'
    polarity."""

    def snntrain(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, HYDRA_FULL_ERROR="1")
        res = subprocess.run([sys.executable, "-m", "snntrain", *args], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=3600)
        assert res.returncode == 0, f"python -m snntrain {' '.join(args)}:\n{res.stderr[-3000:]}"
        return res

    assert commands(section("Run"))[0] == []  # python -m snntrain
    snntrain()
    (run_dir,) = (tmp_path / "outputs" / "classify").iterdir()
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    import torch

    metrics = torch.load(ckpt, map_location="cpu", weights_only=True)["snntrain"]["metrics"]
    assert DEFAULT_VAL_ACC[0] <= round(metrics["val/acc"], 2) <= DEFAULT_VAL_ACC[1], metrics

    labels = digit_images(tmp_path / "photos")
    export = section("Export and inference")
    for args in commands(export):
        args = [a.replace("<file.ckpt>", str(ckpt)).replace("input=photo.jpg", "input=photos") for a in args]
        snntrain(*args)
    card = json.loads((tmp_path / "exported" / "model_card.json").read_text())
    assert card["formats"] == ["safetensors", "onnx", "torch_export", "nir"]
    assert card["nir_target"] == "snntorch"
    (predictions,) = (tmp_path / "outputs" / "predict").glob("*/predictions/predictions.json")
    records = json.loads(predictions.read_text())
    assert {Path(r["file"]).name: r["label"] for r in records} == labels
    assert [r["polarity"] for r in records] == ["light_on_dark", "dark_on_light"] * 2 + ["light_on_dark"]

    (report,) = commands(section("Efficiency report"))
    snntrain(*[a.replace("outputs/classify/<run>", str(run_dir)) for a in report])
    (result,) = (tmp_path / "outputs" / "report").glob("*/report/report.json")
    assert json.loads(result.read_text())["metrics"]["val/acc"] == pytest.approx(metrics["val/acc"], abs=1e-6)
