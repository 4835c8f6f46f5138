"""The Triton kernels compiled for sm_90 (H100/H200) on this machine, no GPU: resources that must
fit the device and inner loops that must not round-trip tiles through shared memory."""

from __future__ import annotations

import pytest

from tape.kernels import triton_available

if not triton_available():
    pytest.skip("needs triton (pip install triton)", allow_module_level=True)

from tape.kernels import aot  # noqa: E402
from tape.kernels.tuning import TUNED, LaunchConfig  # noqa: E402

try:
    aot._bin("cuobjdump")
except FileNotFoundError as missing:
    pytest.skip(f"{missing}", allow_module_level=True)

NESTED = """\
    %a = scf.for %i = %c0 to %n step %c1 iter_args(%x = %z) -> (tensor<64xf32>) {
      %b:2 = scf.for %j = %c0 to %m step %c1 iter_args(%y = %x) -> (tensor<64xf32>) {
        %t = tt.trans %y {order = array<i32: 1, 0>} : tensor<64xf32>
        %s = ttg.local_alloc %t : (tensor<64xf32>) -> !ttg.memdesc<64xf32>
        scf.yield %t : tensor<64xf32>
      } loc(#loc1)
      %d = ttng.warp_group_dot %q, %k, %acc : tensor<64xf32>
      scf.yield %b : tensor<64xf32>
    } loc(#loc2)
    %e = scf.for %i = %c0 to %n step %c1 iter_args(%x = %z) -> (tensor<64xf32>) {
      %c = arith.cmpi slt, %i, %n : i32
      scf.yield %x : tensor<64xf32>
    } loc(#loc3)
"""


def test_innermost_loops_are_read_one_step_each():
    first, second = aot.innermost_loops(NESTED)
    assert (first["register_transposes"], first["shared_stores"], first["wgmma"]) == (1, 1, 0)
    assert (second["compares"], second["wgmma"]) == (1, 0)


def test_the_dkdvde_loop_keeps_its_tiles_in_registers():
    """Pᵀ and dSᵀ come out of the products in the orientation dV, dE and dK need: no tile goes
    through shared memory to be transposed (two per step before, each a store, a barrier and a
    load)."""
    compiled = aot.compile_kernel("_bwd_dkdvde", "bfloat16", 64, LaunchConfig(64, 64, 4, 3))
    assert compiled.loops, "no loop found in the compiled kernel"
    for loop in compiled.loops:
        assert loop["wgmma"] == 6
        assert loop["register_transposes"] == 0 and loop["shared_stores"] == 0, loop


@pytest.mark.parametrize("key", sorted(TUNED), ids=lambda k: "/".join(map(str, k)))
def test_every_tuned_config_fits_an_sm90_block(key):
    kernel, dtype, tile = key
    compiled = aot.compile_kernel(kernel, dtype, tile, TUNED[key])
    assert compiled.fits, f"{compiled.shared_bytes} B of shared memory > {aot.SHARED_LIMIT}"
    assert compiled.registers <= 255


def test_fp32_wide_heads_fit_at_their_default_block_and_not_at_64():
    """Defect 3 of the GPU issue: fp32 tiles of head dim 128 exceed sm_90's shared memory at
    BLOCK 64, so a GPU starts them at 32 (``default_block``)."""
    block = aot.ta.default_block("cuda", aot.torch.float32, 128)
    assert block == 32
    assert aot.compile_kernel("_fwd", "float32", 128, LaunchConfig(block, block)).fits
    assert not aot.compile_kernel("_fwd", "float32", 128, LaunchConfig(64, 64)).fits


def test_the_report_prints_a_row_per_kernel():
    rows = aot.report(["bfloat16"], [64])
    assert [r.kernel for r in rows] == ["_fwd", "_bwd_dkdvde", "_bwd_dq"]
    table = aot.markdown(rows)
    assert table.count("\n| _") == 3 and "(yes)" in table
