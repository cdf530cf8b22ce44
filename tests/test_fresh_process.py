"""Every place a fresh Python process meets snntrain's operators: an exported ``model.pt2``, an export
folder (``load_exported``, ``task=predict``), a checkpoint (``load_checkpoint``) and a compiled model's
on-disk cache. Each is written in this process and opened in a new one (a subprocess), where only what
importing snntrain registers is there.

On the CPU the Triton kernels run in the interpreter (``TRITON_INTERPRET=1``); the GPU tests
(``gpu`` marker) do the same with the compiled kernels on CUDA, for the default classifier and detector.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from snntrain import export as ex
from snntrain.cli import run

ROOT = Path(__file__).resolve().parents[1]

def _pythonpath() -> str:
    """This checkout first, then whatever the environment already adds (packages installed elsewhere)."""
    return os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])


def fresh_python(code: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter (this checkout importable, the given environment changes)."""
    full = dict(os.environ)
    full["PYTHONPATH"] = _pythonpath()
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=timeout)


@pytest.fixture(scope="module")
def triton_program(classifier_ckpt, tmp_path_factory) -> Path:
    """A classifier exported with ``backend=triton`` (the interpreter on the CPU, CUDA on a GPU)."""
    out = tmp_path_factory.mktemp("export") / "export"
    card = ex.export_checkpoint(classifier_ckpt, out, formats=["safetensors", "torch_export"], backend="triton")
    assert card["torch_export_backend"] == "triton"
    assert "needs a CUDA GPU" in card["files"]["model.pt2"]
    return out


@pytest.mark.slow  # a fresh interpreter
def test_importing_kernels_registers_every_op():
    """``import snntrain.kernels`` alone registers every op family, the fused norm-neuron ones included."""
    res = fresh_python("""
        import snntrain.kernels as k
        print(",".join(k.registered_ops()))
    """, env={"TRITON_INTERPRET": None})
    assert res.returncode == 0, res.stderr
    ops = set(res.stdout.strip().split(","))
    assert {"neuron_fwd", "neuron_bwd", "bn_neuron_fwd", "bn_neuron_bwd", "ln_neuron_fwd", "ln_neuron_bwd",
            "layer_norm_fwd", "layer_norm_bwd", "giou_loss", "giou_loss_backward", "max_pool_fwd", "max_pool_bwd"} <= ops


@pytest.mark.slow
def test_program_ops_are_read_from_the_archive(triton_program, tmp_path):
    assert ex.program_ops(triton_program / "model.pt2") == ["bn_neuron_fwd"]
    bad = tmp_path / "model.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ex.CheckpointError, match="is not a torch.export program"):
        ex.load_program(bad)
    with pytest.raises(ex.CheckpointError, match="does not exist"):
        ex.load_program(tmp_path / "missing.pt2")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter variant; the GPU test below covers CUDA")
def test_triton_program_loads_in_a_fresh_process(triton_program):
    """The exported program runs in a new process (where only importing snntrain registered the ops) and
    gives the export folder's outputs."""
    res = fresh_python(f"""
        import torch
        from snntrain import load_exported
        from snntrain.export import load_program
        folder = {str(triton_program)!r}
        program = load_program(folder + "/model.pt2")
        x = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            got = program.module()(x)
            ref = load_exported(folder, backend="torch")(x)
        print(float((got - ref).abs().max()))
    """, env={"TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert float(res.stdout.strip().splitlines()[-1]) < 1e-5


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where the Triton kernels cannot run")
def test_triton_program_without_gpu_names_the_way_out(triton_program):
    """Where the kernels cannot run (no CUDA, no interpreter), loading says why and what to do instead."""
    res = fresh_python(f"""
        from snntrain.export import load_program
        load_program({str(triton_program / 'model.pt2')!r})
    """, env={"TRITON_INTERPRET": None, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode != 0
    assert "exported with backend=triton" in res.stderr and "snntrain::bn_neuron_fwd" in res.stderr
    assert "need a CUDA GPU" in res.stderr and "task=export backend=torch" in res.stderr
    assert "load_exported" in res.stderr


@pytest.mark.slow
def test_checkpoint_and_export_folder_in_a_fresh_process(classifier_ckpt, triton_program, tmp_path):
    """``load_checkpoint``, ``load_exported`` and ``task=predict`` from an export folder, each in a new
    process on the Triton backend, give the outputs this process computes."""
    from snntrain import load_checkpoint

    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = load_checkpoint(classifier_ckpt, backend="torch")(x)
    torch.save(x, tmp_path / "x.pt")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = fresh_python(f"""
        import torch
        from snntrain import load_checkpoint, load_exported
        x = torch.load({str(tmp_path / 'x.pt')!r}).to({device!r})
        with torch.no_grad():
            a = load_checkpoint({str(classifier_ckpt)!r}, backend="triton", map_location={device!r})(x)
            b = load_exported({str(triton_program)!r}, backend="triton", map_location={device!r})(x)
        torch.save([a.cpu(), b.cpu()], {str(tmp_path / 'out.pt')!r})
    """, env={"TRITON_INTERPRET": None if torch.cuda.is_available() else "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = torch.load(tmp_path / "out.pt")
    assert torch.allclose(a, ref, atol=1e-4) and torch.allclose(b, ref, atol=1e-4)

    images = tmp_path / "img.png"
    from PIL import Image
    Image.new("L", (12, 10), 200).save(images)
    out = tmp_path / "pred"
    res = subprocess.run([sys.executable, "-m", "snntrain", "task=predict", f"ckpt_path={triton_program}",
                          f"input={images}", f"predict.output_dir={out}", f"hydra.run.dir={tmp_path / 'run'}",
                          "backend=triton"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": _pythonpath(),
                              **({} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"})})
    assert res.returncode == 0, res.stderr[-3000:]
    saved = json.loads((out / "predictions.json").read_text())
    assert len(saved) == 1 and 0 <= saved[0]["label"] < 10


# ----------------------------------------------------------------------------------------------- GPU

GPU_COMPARE = """
    import json, sys
    import numpy as np, torch
    import snntrain
    from snntrain.export import load_program
    folder, shape = sys.argv[1], json.loads(sys.argv[2])
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ref_model = snntrain.load_exported(folder, backend="torch")
    tri_model = snntrain.load_exported(folder, backend="triton", map_location="cuda")
    with torch.no_grad():
        ref = snntrain.export.ExportGraph(ref_model.model)(x)
        tri = snntrain.export.ExportGraph(tri_model.model)(x.cuda())
        prog = load_program(folder + "/model.pt2").module()(x.cuda())
    as_list = lambda t: [v.float().cpu() for v in (t if isinstance(t, (tuple, list)) else (t,))]
    diff = lambda a, b: max(float((u - v).abs().max()) for u, v in zip(as_list(a), as_list(b)))
    import onnxruntime as ort
    sess = ort.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
    onnx_out = [torch.from_numpy(o) for o in sess.run(None, {"images": x.numpy()})]
    nir = snntrain.load_nir(folder + "/model.nir", backend="torch")
    print(json.dumps({"program_vs_triton": diff(prog, tri), "triton_vs_torch": diff(tri, ref),
                      "onnx_vs_torch": diff(onnx_out, ref), "nir_T": nir.T}))
"""


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("task", ["classify", "detect"])
def test_gpu_export_default_models_load_in_a_fresh_process(task, tmp_path, compose_run):
    """The default classifier and detector, trained briefly and exported on the GPU with the Triton backend
    (safetensors, ONNX, torch.export, NIR), load and run in a new process; the program matches the export
    folder on the Triton backend, and ONNX matches it on the PyTorch backend."""
    overrides = [f"task={task}", "backend=triton", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
                 "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "logger=none",
                 "callbacks.precise_bn.num_batches=2"]
    run(compose_run(tmp_path / "run", *overrides))
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    folder = tmp_path / "export"
    card = ex.export_checkpoint(ckpt, folder, formats=["safetensors", "onnx", "torch_export", "nir"],
                                backend="triton")
    assert card["torch_export_backend"] == "triton"
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(GPU_COMPARE), str(folder),
                          json.dumps(card["input_shape"])], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": _pythonpath()})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    print(task, got)
    # the program and the export folder on the same GPU with the same kernels: the same numbers
    assert got["program_vs_triton"] < 1e-4, got
    # ONNX (onnxruntime) and the PyTorch backend, both on the CPU: float rounding only. (The Triton backend on
    # the GPU against the PyTorch backend on the CPU is not compared: cuDNN's TF32 convolutions move membranes
    # by ~1e-3, and a spike flips wherever one lies that close to the threshold.)
    assert got["onnx_vs_torch"] < 1e-3, got
    assert got["nir_T"] == card["T"]


COMPILE_STEP = """
    import sys, time, torch
    from snntrain.models import build_model
    torch.manual_seed(0)
    model = build_model({"name": "sew_resnet", "depth": 18, "width": 8, "num_classes": 10, "in_channels": 3,
                         "T": 2, "stem": "cifar"}, backend="triton").cuda()
    compiled = torch.compile(model, dynamic=False)
    x = torch.randn(4, 3, 16, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    t0 = time.perf_counter()
    out = compiled(x)
    out.sum().backward()
    torch.cuda.synchronize()
    grad = model.fc.weight.grad.float().norm().item()
    print(f"{time.perf_counter() - t0:.2f} {out.float().sum().item():.6f} {grad:.6f}")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_compiled_model_cache_in_a_fresh_process(tmp_path):
    """A second process that finds the first one's inductor cache (the Triton ops in the cached graph)
    runs the same forward and backward."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    first = fresh_python(COMPILE_STEP, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    second = fresh_python(COMPILE_STEP, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    _, out1, grad1 = first.stdout.split()
    _, out2, grad2 = second.stdout.split()
    assert abs(float(out1) - float(out2)) < 1e-3 and abs(float(grad1) - float(grad2)) < 1e-3 * max(1.0, float(grad1))
