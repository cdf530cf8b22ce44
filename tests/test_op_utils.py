"""The kernels' shared launch path: :class:`snntrain.kernels.op_utils.FastLaunch` launches what Triton's own
launch would, for every specialisation (alignment, integers equal to 1 or divisible by 16, constexprs)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from snntrain.kernels import op_utils


@triton.jit
def _axpb_kernel(x_ptr, out_ptr, n, a, b, STEP: tl.constexpr, BLOCK: tl.constexpr):
    # x_ptr, out_ptr: [n] (every STEP-th element of x)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * STEP, mask=mask)
    tl.store(out_ptr + offs, x * a + b, mask=mask)


def _fake_launcher(cls, calls: list):
    """An instance of Triton's ``CudaLauncher`` class without a compiled kernel: its C ``launch`` records what it
    is handed; no scratch memory, as the kernels here need."""
    launcher = object.__new__(cls)
    launcher.__dict__.update(
        launch=lambda *args: calls.append(args), global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
        profile_scratch_align=1, num_ctas=1, launch_cooperative_grid=False, launch_pdl=True, gsan_enabled=False,
        arg_annotations=("annotations",), kernel_signature=b"signature")
    return launcher


def test_c_launcher_hands_the_c_launch_what_tritons_launcher_does(monkeypatch):
    """:func:`op_utils.c_launcher` calls Triton's C launch function itself: it must hand it exactly what the
    installed Triton's own ``CudaLauncher.__call__`` hands it (same arguments, same order), whichever form of
    the launcher this Triton has; a launcher it does not know is called as it is."""
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    import triton.runtime

    cls = driver.CudaLauncher
    ours, theirs = [], []
    function, metadata, stream = 0xF00, (4, 1, 256), 0x5EA
    x = torch.zeros(3)
    values = [x, 1234567, None, 7, 2.5, 16]  # a tensor, an address, an absent pointer, scalars, a constexpr
    # Triton 3.8's __call__ reads the active driver, which a machine without a GPU lacks
    monkeypatch.setattr(triton.runtime.driver, "_active", object())
    cls.__call__(_fake_launcher(cls, theirs), 3, 2, 1, stream, function, metadata, None, None, None, *values)
    op_utils.c_launcher(_fake_launcher(cls, ours), function, metadata)(3, 2, 1, stream, values)
    assert len(ours) == len(theirs) == 1
    assert ours[0] == theirs[0]
    # a launcher needing scratch memory is called as it is
    needs_scratch = _fake_launcher(cls, [])
    needs_scratch.global_scratch_size = 64
    assert op_utils._launcher_call(needs_scratch) is None


def test_direct_is_the_plain_kernel_under_the_interpreter():
    if not op_utils.INTERPRET:
        pytest.skip("the interpreter is off (a GPU machine)")
    assert op_utils.direct(_axpb_kernel) is _axpb_kernel


@pytest.mark.gpu
def test_fast_launch_matches_triton_for_every_specialisation():
    fast = op_utils.direct(_axpb_kernel)
    assert isinstance(fast, op_utils.FastLaunch)
    g = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(4096 + 7, device="cuda", generator=g)
    cases = [(0, 1, 1000, 2.0, 1.0), (1, 1, 1000, 2.0, 1.0), (0, 2, 16, 1.0, 0.5), (3, 1, 1, 3.0, 0.0),
             (0, 1, 4096, -1.5, 2.0), (0, 3, 1234, 0.25, -1.0)]
    for _ in range(2):  # the second round takes the cached path
        for offset, step, n, a, b in cases:
            x = base[offset:]  # offset 1 or 3: not 16-byte aligned
            out, plain = (torch.full((n,), float("nan"), device="cuda") for _ in range(2))
            block = 256 if n > 16 else 16
            fast[(triton.cdiv(n, block),)](x, out, n, a, b, STEP=step, BLOCK=block, num_warps=4)
            _axpb_kernel[(triton.cdiv(n, block),)](x, plain, n, a, b, STEP=step, BLOCK=block, num_warps=4)
            assert torch.equal(out, plain)  # the same kernel: bit for bit
            torch.testing.assert_close(out, x[: n * step: step] * a + b)
    assert 1 <= len(fast._cache) <= len(cases)


@pytest.mark.gpu
def test_bound_launch_matches_triton_whatever_tensors_each_call_passes():
    """A bound launch (fixed grid, scalars and options) launches what Triton would for each call's tensors,
    also when a call's tensor is unaligned or of another dtype than the call before (a new specialisation)."""
    fast = op_utils.direct(_axpb_kernel)
    n, block = 1000, 256
    bound = fast.bind((triton.cdiv(n, block),), (None, None, n, 2.0, 1.0), {"STEP": 1, "BLOCK": block, "num_warps": 4})
    g = torch.Generator(device="cuda").manual_seed(1)
    base = torch.randn(n + 8, device="cuda", generator=g)
    for _ in range(2):  # the second round takes the bound cache
        for offset, dtype in [(0, torch.float32), (1, torch.float32), (0, torch.float16), (3, torch.float32)]:
            x = base.to(dtype)[offset:]  # offset 1 or 3: not 16-byte aligned
            out, plain = (torch.full((n,), float("nan"), device="cuda", dtype=dtype) for _ in range(2))
            bound(x, out)
            _axpb_kernel[(triton.cdiv(n, block),)](x, plain, n, 2.0, 1.0, STEP=1, BLOCK=block, num_warps=4)
            assert torch.equal(out, plain), (offset, dtype)
    with pytest.raises(TypeError):  # missing arguments: Triton's own launch names them
        fast.bind((1,), (None, None, n, 2.0), {"BLOCK": block})(base, base)
