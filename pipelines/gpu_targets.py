"""The efficiency targets of the GPU issue, judged from a gpu-check window's benchmark
(``benchmark/efficiency.json``): TAPE over RoPE at the paper's 155M shape, one table per window;
and the step profiles (``python -m tape.bench.step_profile``) that window printed, as tables."""

from __future__ import annotations

import json
from pathlib import Path

STEP_TIME_TARGET = 1.10  # training step, TAPE / RoPE
STEP_MEMORY_TARGET = 1.10  # peak memory of a step, TAPE / RoPE
OP_TIME_TARGET = 1.6  # attention operator, forward + backward, TAPE / RoPE
KERNEL_TFLOPS_SHARE = 0.6  # the Triton kernel's TFLOP/s over SDPA-flash's (RoPE's), at least
TARGET_SHAPE = {"vocab_size": 32000, "n_layers": 12, "d_model": 768, "n_heads": 12, "n_kv_heads": None,
                "d_ff": None, "seq_len": 1024, "batch": 4}
"""The targets hold at the paper's 155M shape, N = 1024, in bf16, at the benchmark's paper-scale
batch (a whole-step peak counts weights and AdamW state, so its ratio falls with the batch);
other runs are shown, not judged."""
DEVICE_BOUND_SHARE = 0.9
"""An eager step profile judges TAPE / RoPE against the step-time target only at batch sizes where
RoPE's device is busy for at least this share of its wall time; below it the step waits on the
host launching kernels, and the ratio counts launches rather than work (docs/devices.md)."""
HOST_BOUND_MFU = 0.2
"""Below this model-FLOP utilisation of RoPE's step, the benchmark's targets table says the step is
probably host-bound (a statement beside the verdicts, which stand)."""
MODE_NAMES = {"fused": "tape_fused=true (auto: the Triton kernel)", "triton": "the Triton kernel",
              "flex": "FlexAttention", "unfused": "two SDPA calls", "concat": r"one SDPA call, [V \| E]",
              "padded": "one SDPA call, q and k padded"}


def _verdict(value: float | None, target: float, judged: bool = True, at_least: bool = False) -> str:
    if not judged:
        return "not judged"
    return "-" if value is None else ("met" if (value >= target if at_least else value <= target) else "missed")


def off_target_shape(efficiency: dict) -> str | None:
    """Why a benchmark is not at the targets' settings (the 155M model, N = 1024, batch 4, bf16),
    or None when it is."""
    shape = efficiency["train_step"]["config"]
    off = [f"{key} {shape.get(key)}" for key, want in TARGET_SHAPE.items() if shape.get(key) != want]
    dtype = str(efficiency.get("settings", {}).get("dtype", "auto"))
    if dtype not in ("auto", "bf16", "bfloat16"):
        off.append(f"dtype {dtype}")
    return ", ".join(off) or None


def targets_md(efficiency: dict) -> list[str]:
    """Markdown lines: per TAPE path, the training step's time and peak memory over RoPE's (the
    paired median ± its standard error) against the targets, and the forward operator's ratio."""
    ratios = efficiency["tape_vs_rope"]
    step, op = ratios["train_step"], ratios.get("attention_op", {})
    shape = efficiency["train_step"]["config"]
    off = off_target_shape(efficiency)
    total = any("cuda_total_peak_bytes" in (row.get("memory") or {}) for row in step.values() if isinstance(row, dict))
    peak_key = "cuda_total_peak_bytes" if total else "cuda_peak_bytes"
    peak_name = ("peak memory / RoPE (in all)" if total else
                 "peak memory / RoPE (above the step's start: weights and AdamW state left out)")
    lines = [f"Training step of the {shape['n_layers']}-layer model (d_model {shape['d_model']}), batch "
             f"{shape['batch']} x {shape['seq_len']} tokens, on {efficiency['machine'].get('gpu')}; "
             f"targets: step time <= {STEP_TIME_TARGET}, peak memory <= {STEP_MEMORY_TARGET} "
             "(the issue's; the forward-only operator has none, its fwd+bwd target is judged by "
             "the sweep)." + (f" Not judged: the targets hold at the 155M shape, N = 1024, batch 4, bf16 ({off})."
                              if off else ""), "",
             f"| TAPE path | step time / RoPE (paired) | time target | {peak_name} | memory target "
             "| step's added peak / RoPE | attention op, forward / RoPE | FLOPs / RoPE (step) |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, row in step.items():
        if mode not in MODE_NAMES:  # flop_lower_bound, saved_by_tensor_minus_rope: not a path
            continue
        paired = row.get("time_paired") or {}
        time = paired.get("median", row.get("time"))
        memory = (row.get("memory") or {}).get(peak_key)
        added = (row.get("memory") or {}).get("cuda_peak_bytes")
        forward = (op.get(mode) or {}).get("time")
        lines.append(
            f"| {MODE_NAMES[mode]} | {_num(time, '.3f')} ± {_num(paired.get('stderr'), '.3f')} "
            f"| {_verdict(time, STEP_TIME_TARGET, not off)} | {_num(memory, '.3f')} "
            f"| {_verdict(memory, STEP_MEMORY_TARGET, not off)} | {_num(added, '.3f')} | {_num(forward, '.2f')} "
            f"| {_num(row.get('flops'), '.3f')} |")
    rows = efficiency["train_step"].get("rows", {})
    rope, fused, kernel = ((rows.get(name) or {}).get("flops") for name in ("rope", "tape_fused", "tape_triton"))
    if rope and fused and kernel and fused != kernel:
        lines += ["", f"FLOPs / RoPE of tape_fused=true ({fused / rope:.3f}) differ from the Triton kernel's "
                  f"({kernel / rope:.3f}), though `auto` ran that kernel: this window's code counted "
                  "tape_fused=true as the CPU's one call with q and k padded (corrected in d0e5bcc, "
                  "which counts it on CUDA as one QKᵀ). The Triton kernel's row counts the work done."]
    mfu = (rows.get("rope") or {}).get("mfu")
    if mfu is not None and mfu < HOST_BOUND_MFU:
        lines += ["", f"RoPE's step ran at {100 * mfu:.1f} % of the GPU's dense bf16 peak (MFU) at this batch: "
                  "it is probably bound by the host launching kernels, where TAPE's ratio counts its extra "
                  "operators more than its extra work. The eager step profile's larger batches and the "
                  "compiled profile (`make gpu-measure`) measure the step where the device is busy."]
    return lines


def fastest_path_md(efficiency: dict) -> list[str]:
    """Markdown lines: each TAPE path's training step against ``auto``'s CUDA path, paired over the
    benchmark's interleaved rounds (log of the time ratio per round: 95 % t interval, sign-flip p,
    Holm over the paths), and which path was fastest. Nothing without per-round samples."""
    import math

    import numpy as np

    from tape.bench.sweep import TAPE_PATHS
    from tape.model.attention import CUDA_TAPE_PATH
    from tape.report.paired import holm, sign_flip_pvalue, t_interval

    rows = efficiency["train_step"]["rows"]
    chosen = {path: label.removeprefix("tape_") for label, path in TAPE_PATHS.items()}[CUDA_TAPE_PATH]  # its benchmark name
    base = ((rows.get(f"tape_{chosen}") or {}).get("time_s") or {}).get("samples_s")
    others = [m for m in MODE_NAMES if m not in ("fused", chosen)
              and ((rows.get(f"tape_{m}") or {}).get("time_s") or {}).get("samples_s")]
    if not base or not others:
        return []
    deltas = {m: np.log(np.array(rows[f"tape_{m}"]["time_s"]["samples_s"]) / np.array(base)) for m in others}
    adjusted = holm([sign_flip_pvalue(d) for d in deltas.values()])
    lines = [f"Training step time of each TAPE path over that of `auto`'s path on CUDA ({MODE_NAMES[chosen]}), "
             f"paired over {len(base)} interleaved rounds: geometric mean of the per-round ratios, 95 % t "
             "interval, sign-flip p (Holm over the paths); faster or slower when both the interval and the "
             "adjusted p say so.", "",
             "| TAPE path | step time / auto's | 95 % interval | p (Holm) | reading |", "|---|---|---|---|---|"]
    means = {}
    for (mode, d), p_adj in zip(deltas.items(), adjusted):
        lo, hi = t_interval(d)
        means[mode] = float(np.mean(d))
        shown = hi < 0 or lo > 0
        reading = ("faster" if hi < 0 else "slower") if shown and p_adj < 0.05 else "no difference shown"
        lines.append(f"| {MODE_NAMES[mode]} | {math.exp(means[mode]):.3f} | [{math.exp(lo):.3f}, {math.exp(hi):.3f}] "
                     f"| {p_adj:.3g} | {reading} |")
    best = min(means, key=means.get)
    lines += ["", f"Fastest step here: {MODE_NAMES[best] if means[best] < 0 else MODE_NAMES[chosen]} "
              "(one batch and length; `auto`'s rule, `CUDA_TAPE_PATH`, follows the attention sweep by length "
              "and this step together)."]
    return lines


def sweep_targets_md(sweep: dict) -> list[str]:
    """Markdown lines: per length and TAPE path, the attention operator's forward+backward time
    over RoPE's (TAPE's E updates included) against the operator target, and the fastest path."""
    from tape.bench.sweep import TAPE_PATHS, fastest_tape_path

    st = sweep["settings"]
    shape_ok = (str(st.get("dtype")) in ("bfloat16", "bf16") and st.get("d_model", 768) == 768
                and st.get("n_heads", 12) == 12)
    lines = [f"Attention operator, forward + backward, by length ({st.get('dtype')}); targets (the issue's, "
             f"judged at the 155M model's width in bf16 at N = {TARGET_SHAPE['seq_len']} only): TAPE / RoPE "
             f"<= {OP_TIME_TARGET} (FLOP floor 1.5), and the Triton kernel's TFLOP/s at least "
             f"{KERNEL_TFLOPS_SHARE} of SDPA-flash's (RoPE's; the kernel's whole [V | E] work counted).", "",
             "| N | TAPE path | fwd+bwd / RoPE | target | TFLOP/s | RoPE's TFLOP/s | TFLOP/s / RoPE's | target |",
             "|---|---|---|---|---|---|---|---|"]
    for n, row in sweep["rows"].items():
        rope = (row.get("rope") or {}).get("forward_backward") or {}
        judged = shape_ok and int(n) == TARGET_SHAPE["seq_len"]
        for label in TAPE_PATHS:
            timed = (row.get(label) or {}).get("forward_backward")
            if timed is None:
                continue
            ratio = timed.get("vs_rope")
            share = (timed["tflops"] / rope["tflops"] if timed.get("tflops") and rope.get("tflops") else None)
            kernel = label == "tape_triton"
            lines.append(f"| {n} | {TAPE_PATHS[label]} | {_num(ratio, '.3f')} | {_verdict(ratio, OP_TIME_TARGET, judged)} "
                         f"| {_num(timed.get('tflops'), '.1f')} | {_num(rope.get('tflops'), '.1f')} "
                         f"| {_num(share, '.2f')} "
                         f"| {_verdict(share, KERNEL_TFLOPS_SHARE, judged, at_least=True) if kernel else '-'} |")
    fastest = [f"N = {n}: {fastest_tape_path(row) or 'none ran'}" for n, row in sweep["rows"].items()]
    return [*lines, "", "Fastest TAPE path by length (tape/model/attention.py's `CUDA_TAPE_PATH` says how to act on "
            "it): " + "; ".join(fastest) + ".", ""]


def window_targets(window: Path) -> list[str]:
    """The targets tables of a window whose benchmark (the core suite's, else the measure suite's
    of every encoding) or sweep ran on a GPU, else nothing."""
    out = []
    path = next((p for p in (window / "benchmark" / "efficiency.json", window / "benchmark-all" / "efficiency.json")
                 if p.is_file()), window / "benchmark" / "efficiency.json")
    if path.is_file():
        efficiency = json.loads(path.read_text())
        if str(efficiency.get("machine", {}).get("device", "")).startswith("cuda"):
            out += ["### Efficiency targets (TAPE / RoPE)", "", *targets_md(efficiency), ""]
            fastest = fastest_path_md(efficiency)
            if fastest:
                out += ["### The fastest TAPE path in the training step", "", *fastest, ""]
    path = window / "sweep" / "sweep.json"
    if path.is_file():
        sweep = json.loads(path.read_text())
        if str(sweep.get("settings", {}).get("device", "")).startswith("cuda"):
            out += ["### Attention operator target by length", "", *sweep_targets_md(sweep)]
    return out


PROFILE_NAMES = {"rope": "RoPE", "tape_fused": "TAPE (auto)", "tape_unfused": "TAPE, two SDPA calls"}


def profile_md(profile: dict) -> list[str]:
    """Markdown lines of one step profile: per batch size and model, wall time, the device's busy
    time and share, kernels per step and the ratios to RoPE; for a compiled profile, TAPE's step
    time over RoPE's against the step-time target (medians of each model timed alone, unpaired)."""
    compiled = "eager"
    if profile.get("compiled"):
        mode = profile.get("compile_mode", "default")
        compiled = "compiled (torch.compile" + ("" if mode == "default" else f", mode {mode}") + ")"
    lines = [f"{compiled.capitalize()} training step, {profile.get('seq_len')} tokens a row, on "
             f"{profile.get('device')}; each model timed alone (median of its steps), then profiled.", "",
             "| batch | model | wall ms | device busy ms | busy share | kernels / step | wall / RoPE "
             "| kernels / RoPE |", "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for key, rows in profile.items():
        if not key.startswith("batch_"):
            continue
        for label, row in rows.items():
            count = row.get("kernels_per_step", row.get("ops_per_step"))
            count_vs = row.get("kernels_per_step_vs_rope", row.get("ops_per_step_vs_rope"))
            lines.append(f"| {key.removeprefix('batch_')} | {PROFILE_NAMES.get(label, label)} | {row['wall_ms']:.1f} "
                         f"| {_num(row.get('device_busy_ms'), '.1f')} | {_num(row.get('busy_share'), '.2f')} "
                         f"| {_num(count, '.0f')} | {_num(row.get('wall_ms_vs_rope'), '.3f')} | {_num(count_vs, '.2f')} |")
            if label == "tape_fused" and row.get("wall_ms_vs_rope") is not None:
                ratios.append((key.removeprefix("batch_"), row["wall_ms_vs_rope"], rows.get("rope", {}).get("busy_share")))
    lines.append("")
    skipped = sorted({PROFILE_NAMES.get(label, label) for key, rows in profile.items() if key.startswith("batch_")
                      for label, row in rows.items() if row.get("cudagraph_skips")})
    if skipped:  # inductor only warns when it runs a graph without CUDA graphs
        lines += [f"CUDA graphs were skipped for {', '.join(skipped)} (inductor's cudagraph_skips > 0): those "
                  "rows ran compiled without graphs.", ""]
    if profile.get("device") == "cpu":  # a CPU profile counts aten operators instead
        return lines + ["(On a CPU the kernel columns count the aten operators a step dispatches.)", ""]
    for batch, ratio, share in ratios:
        lines += [_step_verdict(batch, ratio, share, bool(profile.get("compiled"))), ""]
    return lines


def _step_verdict(batch: str, ratio: float, rope_share: float | None, compiled: bool) -> str:
    """One line on TAPE / RoPE's step time at one batch: judged when compiled or when RoPE's device
    was busy enough (``DEVICE_BOUND_SHARE``), else said to be host-bound and not judged."""
    share = _num(rope_share, ".2f")
    bound = rope_share is not None and rope_share >= DEVICE_BOUND_SHARE
    if not (compiled or bound):
        return (f"Eager TAPE / RoPE at batch {batch}: {ratio:.3f}, not judged: RoPE's device was busy {share} "
                f"of the step (below {DEVICE_BOUND_SHARE}), so the host's launches set the pace.")
    caveat = "" if bound else f"; RoPE device-busy share {share}, below {DEVICE_BOUND_SHARE}"
    return (f"{'Compiled' if compiled else 'Eager'} TAPE / RoPE step time at batch {batch}: {ratio:.3f}, "
            f"target <= {STEP_TIME_TARGET}: {_verdict(ratio, STEP_TIME_TARGET)} (unpaired medians, one run{caveat}).")


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def printed_json(outcome: dict) -> str | None:
    """The last JSON line a step printed (its log's tail), or None."""
    printed = [line for line in outcome.get("tail", []) if line.startswith("{")]
    return printed[-1] if printed else None


def window_profiles(outcomes: list[dict]) -> list[str]:
    """A section per step-profile check of a window that printed its JSON line."""
    out = []
    for o in outcomes:
        line = printed_json(o)
        if "(profiler)" not in o["name"] or line is None:
            continue
        try:
            profile = json.loads(line)
        except json.JSONDecodeError:
            continue
        out += [f"### {o['name']}", "", *profile_md(profile)]
    return out


def timed_presets_md(outcomes: list[dict]) -> list[str]:
    """A table of the timed presets a window ran (``python -m pipelines.gpu_check preset``, one
    JSON line each): seconds a warmed-up step, the whole run projected, and TAPE / RoPE per preset."""
    rows = []
    for o in outcomes:
        line = printed_json(o)
        if line is None or not o["name"].startswith("time "):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and {"preset", "pe", "s_per_step", "timed_steps", "wall_time_s"} <= set(row):
            rows.append(row)
    if not rows:
        return []
    pace = {(r["preset"], r["pe"]): r["s_per_step"] for r in rows}
    lines = ["### Timed presets", "",
             "Each preset trained by its command line, validated once at the end; seconds a step from "
             "the step after the warm-up to the last (`pipelines.callbacks.StepClock`). Projected run: "
             "the preset's `trainer.max_steps` at that pace plus what this run spent otherwise "
             "(start-up, warm-up, one validation, the evaluation; the full run validates more often).", "",
             "| preset | PE | s / step | steps timed | wall time (s) | preset's steps | projected run (min) "
             "| TAPE / RoPE (s / step) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rope, tape = pace.get((r["preset"], "rope")), pace.get((r["preset"], "tape"))
        ratio = tape / rope if r["pe"] == "tape" and rope and tape else None
        lines.append(f"| {r['preset']} | {r['pe']} | {r['s_per_step']:.4f} | {r['timed_steps']} | "
                     f"{r['wall_time_s']:.1f} | {_num(r.get('preset_steps'), 'd')} | "
                     f"{_num(r.get('projected_min'), '.1f')} | {_num(ratio, '.3f')} |")
    return [*lines, ""]
