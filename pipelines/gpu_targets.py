"""The efficiency targets of the GPU issue, judged from a gpu-check window's benchmark
(``benchmark/efficiency.json``): TAPE over RoPE at the paper's 155M shape, one table per window."""

from __future__ import annotations

import json
from pathlib import Path

STEP_TIME_TARGET = 1.10  # training step, TAPE / RoPE
STEP_MEMORY_TARGET = 1.10  # peak memory of a step, TAPE / RoPE
MODE_NAMES = {"fused": "tape_fused=true (auto: the Triton kernel)", "triton": "the Triton kernel",
              "flex": "FlexAttention", "unfused": "two SDPA calls", "concat": r"one SDPA call, [V \| E]",
              "padded": "one SDPA call, q and k padded"}


def _verdict(value: float | None, target: float) -> str:
    return "-" if value is None else ("met" if value <= target else "missed")


def targets_md(efficiency: dict) -> list[str]:
    """Markdown lines: per TAPE path, the training step's time and peak memory over RoPE's (the
    paired median ± its standard error) against the targets, and the forward operator's ratio."""
    ratios = efficiency["tape_vs_rope"]
    step, op = ratios["train_step"], ratios.get("attention_op", {})
    shape = efficiency["train_step"]["config"]
    lines = [f"Training step of the {shape['n_layers']}-layer model (d_model {shape['d_model']}), batch "
             f"{shape['batch']} x {shape['seq_len']} tokens, on {efficiency['machine'].get('gpu')}; "
             f"targets: step time <= {STEP_TIME_TARGET}, peak memory <= {STEP_MEMORY_TARGET} "
             "(the issue's; the forward-only operator has none, its fwd+bwd target is judged by "
             "the sweep).", "",
             "| TAPE path | step time / RoPE (paired) | time target | peak memory / RoPE | memory target "
             "| attention op, forward / RoPE | FLOPs / RoPE (step) |",
             "|---|---|---|---|---|---|---|"]
    for mode, row in step.items():
        if mode not in MODE_NAMES:  # flop_lower_bound, saved_by_tensor_minus_rope: not a path
            continue
        paired = row.get("time_paired") or {}
        time = paired.get("median", row.get("time"))
        memory = (row.get("memory") or {}).get("cuda_peak_bytes")
        forward = (op.get(mode) or {}).get("time")
        lines.append(
            f"| {MODE_NAMES[mode]} | {time:.3f} ± {paired.get('stderr', float('nan')):.3f} "
            f"| {_verdict(time, STEP_TIME_TARGET)} | {'-' if memory is None else f'{memory:.3f}'} "
            f"| {_verdict(memory, STEP_MEMORY_TARGET)} | {'-' if forward is None else f'{forward:.2f}'} "
            f"| {row.get('flops', float('nan')):.3f} |")
    return lines


def window_targets(window: Path) -> list[str]:
    """The targets table of a window whose benchmark ran on a GPU, else nothing."""
    path = window / "benchmark" / "efficiency.json"
    if not path.is_file():
        return []
    efficiency = json.loads(path.read_text())
    if efficiency.get("machine", {}).get("device") != "cuda":
        return []
    return ["### Efficiency targets (TAPE / RoPE)", "", *targets_md(efficiency), ""]
