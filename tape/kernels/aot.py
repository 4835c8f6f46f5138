"""Compile the Triton attention kernels for a GPU on any machine, no GPU needed: what a launch
would use (registers, spill stack, shared memory) and what each innermost loop does per step.

Triton compiles for a named target (sm_90: H100, H200) down to a cubin with the ptxas it ships;
``cuobjdump`` (also shipped) reads the registers and stack from the cubin, and the loops are read
from the Triton GPU IR. The arguments are specialised as a launch at the 155M model's shape would
be (16-divisible sizes and strides, one query head per key head). ``python -m tape.kernels.aot``
prints the table; tests/test_kernels_aot.py holds the kernels to it.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import triton

from tape.kernels import triton_attention as ta
from tape.kernels.tuning import KERNELS, LaunchConfig, config

REPORTED = (*KERNELS, "_bwd_delta")  # every kernel a launch runs; Δ's rows are fixed (DELTA_ROWS)
ARCH = 90  # sm_90: H100 and H200
SHARED_LIMIT = 232_448  # bytes of shared memory one block may use on sm_90
TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
INTS = ("H", "HKV", "GROUPS", "NQ", "NK", "D", "DV", "DE")
LOOP_OPS = {  # TTGIR op -> its name in the report
    "ttng.warp_group_dot ": "wgmma", "tt.dot ": "dot", "ttg.local_alloc": "shared_stores",
    "tt.trans ": "register_transposes", "ttg.convert_layout": "layout_conversions",
    "arith.cmpi": "compares", "arith.select": "selects",
}


@dataclass(frozen=True)
class Compiled:
    """One kernel compiled for sm_90 at one dtype, head dim and launch configuration."""

    kernel: str
    dtype: str
    head_dim: int
    config: str
    registers: int
    stack_bytes: int  # per thread: spilled registers and local arrays
    loop_spills: int  # local-memory loads and stores (STL/LDL) inside the machine code's loops
    shared_bytes: int
    loops: list[dict[str, int]] = field(default_factory=list)  # innermost loops, in program order

    @property
    def fits(self) -> bool:
        return self.shared_bytes <= SHARED_LIMIT


def _bin(tool: str) -> Path:
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: this triton has no CUDA backend tools "
                                "(pip install triton from PyPI ships them)")
    return path


def _specialisation(kernel: str, dtype: str, head_dim: int, batch: int = 4, heads: int = 12,
                    n: int = 1024) -> dict[str, object]:
    """Argument values of a launch on (batch, n, heads, head_dim) projections viewed as
    (B, H, N, d): pointers by type, sizes and strides by value."""
    fn = getattr(ta, kernel)
    values: dict[str, object] = dict(H=heads, HKV=heads, GROUPS=1, NQ=n, NK=n, D=head_dim, DV=head_dim,
                                     DE=head_dim, scale=head_dim ** -0.5)
    for name in inspect.signature(fn).parameters:
        if re.fullmatch(r"s\w+_[bhn]", name):
            values[name] = {"b": n * heads * head_dim, "h": head_dim, "n": heads * head_dim}[name[-1]]
        elif name.isupper() and name not in values and name not in ("PREC", "UPCAST", "SPLIT") and not name.startswith("BLOCK"):
            wide = name in ("LSE", "DELTA", "DE_")  # float32 statistics; E's gradient in E's float32
            values[name] = "*fp32" if wide else f"*{TYPES[dtype]}"
    return values


def compile_kernel(kernel: str, dtype: str, head_dim: int, config: LaunchConfig) -> Compiled:
    """Compile ``kernel`` for sm_90 and read its resources and innermost loops."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(ta, kernel)
    jit = triton.jit(fn)
    tile = ta._block(head_dim)
    constexprs: dict[str, object] = dict(
        PREC="ieee" if dtype == "float32" else "tf32", UPCAST=False,
        SPLIT=ta.splits(torch.empty(0, dtype=getattr(torch, dtype), device="meta")),  # as a GPU launch decides
        BLOCK_D=tile, BLOCK_DV=tile, BLOCK_DE=tile,
        BLOCK_M=config.block_n if kernel != "_fwd" else config.block_m, BLOCK_N=config.block_n)
    constexprs = {name: value for name, value in constexprs.items() if name in jit.arg_names}
    values = _specialisation(kernel, dtype, head_dim)
    signature, attrs = {}, {}
    for i, name in enumerate(jit.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif values[name] == 1:  # Triton specialises an int argument equal to 1 as a constant
            signature[name], constexprs[name] = "constexpr", 1
        elif isinstance(values[name], str):
            signature[name], attrs[(i,)] = values[name], [["tt.divisibility", 16]]
        elif isinstance(values[name], float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if values[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(jit, signature, constexprs, attrs), target=GPUTarget("cuda", ARCH, 32),
                              options=dict(num_warps=config.num_warps, num_stages=config.num_stages,
                                           enable_fp_fusion=True))  # a launch's default
    registers, stack, loop_spills = _resources(compiled.asm["cubin"])
    return Compiled(kernel, dtype, head_dim, config.label, registers, stack, loop_spills,
                    int(compiled.metadata.shared), innermost_loops(compiled.asm["ttgir"]))


def _resources(cubin: bytes) -> tuple[int, int, int]:
    """(registers per thread, stack bytes per thread, spill instructions inside loops) of a cubin:
    cuobjdump's resource usage, and its SASS, where a loop is a backward branch's span."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage, sass = (subprocess.run([str(_bin("cuobjdump")), flag, f.name], capture_output=True, text=True,
                                      check=True).stdout for flag in ("-res-usage", "-sass"))
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{usage}")
    return int(found.group(1)), int(found.group(2)), loop_spills(sass)


def loop_spills(sass: str) -> int:
    """Local-memory loads and stores (register spills) between a backward branch and its target."""
    code = [(int(m.group(1), 16), line) for line in sass.splitlines()
            if (m := re.search(r"/\*([0-9a-f]{4,})\*/", line))]
    loops = [(int(m.group(1), 16), at) for at, line in code
             if (m := re.search(r"\bBRA\b.*?\b(0x[0-9a-f]+)", line)) and int(m.group(1), 16) < at]
    return sum(any(lo <= at <= hi for lo, hi in loops) for at, line in code if re.search(r"\b(STL|LDL)\b", line))


def innermost_loops(ttgir: str) -> list[dict[str, int]]:
    """For each innermost ``scf.for`` of a Triton GPU IR module, how often each ``LOOP_OPS`` op
    occurs in its body (one loop step)."""
    lines, loops, stack = ttgir.splitlines(), [], []
    for i, line in enumerate(lines):
        if "scf.for" in line and line.rstrip().endswith("{"):
            stack.append([i, False])
        elif line.strip().startswith("}") and stack and _closes_loop(lines, i, stack[-1][0]):
            start, nested = stack.pop()
            if stack:
                stack[-1][1] = True
            if not nested:
                body = "\n".join(lines[start + 1:i])
                loops.append({name: body.count(op) for op, name in LOOP_OPS.items()})
    return loops


def _closes_loop(lines: list[str], end: int, start: int) -> bool:
    """Whether the ``}`` at ``end`` closes the region opened at ``start`` (braces balance)."""
    depth = sum(line.count("{") - line.count("}") for line in lines[start:end + 1])
    return depth == 0


def report(dtypes: Sequence[str] = ("bfloat16",), head_dims: Sequence[int] = (64, 128),
           configs: Sequence[LaunchConfig] | None = None) -> list[Compiled]:
    """Every kernel at each dtype and head dim: the configuration a launch takes (``tuning.config``,
    else the default block with warps 4, stages 3), and ``configs`` when given."""
    out = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for kernel in KERNELS:
                block = ta.default_block("cuda", getattr(torch, dtype), ta._block(head_dim))
                tuned = config(kernel, getattr(torch, dtype), ta._block(head_dim)) or LaunchConfig(block, block)
                for launch in dict.fromkeys([tuned, *(configs or ())]):
                    out.append(compile_kernel(kernel, dtype, head_dim, launch))
            rows = LaunchConfig(ta.DELTA_ROWS, ta.DELTA_ROWS)  # launched as it is: Triton's warps and stages
            out.append(compile_kernel("_bwd_delta", dtype, head_dim, rows))
    return out


def markdown(rows: Sequence[Compiled]) -> str:
    """The report as a markdown table, one row per compiled kernel."""
    head = ("| kernel | dtype | head dim | config | registers | stack B | spills in loops | shared B (fits 227 KiB) "
            "| innermost loops: wgmma / shared stores / register transposes / layout conversions / compares |\n"
            "|---|---|---|---|---|---|---|---|---|")
    body = []
    for r in rows:
        loops = "; ".join(f"{lp['wgmma'] + lp['dot']} / {lp['shared_stores']} / {lp['register_transposes']} / "
                          f"{lp['layout_conversions']} / {lp['compares']}" for lp in r.loops)
        body.append(f"| {r.kernel} | {r.dtype} | {r.head_dim} | {r.config} | {r.registers} | {r.stack_bytes} "
                    f"| {r.loop_spills} | {r.shared_bytes} ({'yes' if r.fits else 'NO'}) | {loops} |")
    return "\n".join([head, *body])


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m tape.kernels.aot``: the sm_90 report of every kernel (markdown, or --json)."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m tape.kernels.aot", description=main.__doc__)
    p.add_argument("--dtypes", default="bfloat16", help="comma-separated: bfloat16,float16,float32")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--configs", default="", help="extra configs, e.g. m64-n64-w8-s2,m32-n32-w4-s3")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    extra = [LaunchConfig(*map(int, re.findall(r"\d+", c))) for c in args.configs.split(",") if c]
    rows = report(args.dtypes.split(","), [int(d) for d in args.head_dims.split(",")], extra)
    print(json.dumps([asdict(r) for r in rows]) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
