"""Markdown for results/efficiency.md from the dict ``run_benchmark`` returns (plus command info)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import tape.pe
from tape.paper import paper_number

TAPE_MODES = {"tape_fused": "TAPE fused", "tape_unfused": "TAPE unfused", "tape_concat": "TAPE concat",
              "tape_padded": "TAPE padded", "tape_triton": "TAPE Triton kernel", "tape_flex": "TAPE FlexAttention"}
MIB = 2**20


def _label(key: str) -> str:
    """A benchmark row's name: a TAPE attention layout or an encoding's display name."""
    return TAPE_MODES.get(key) or tape.pe.display(key)


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _tflops(row: dict[str, Any]) -> str:
    """Counted FLOPs over the median time, in TFLOP/s (the full N x N count, as the sweep's)."""
    return f"{row['flops'] / row['time_s']['median_s'] / 1e12:.3g}"


def _time_cell(t: dict[str, float], scale: float, fmt: str) -> str:
    """median [min, max] in the given unit."""
    return f"{t['median_s'] * scale:{fmt}} [{t['min_s'] * scale:{fmt}}, {t['max_s'] * scale:{fmt}}]"


def _table3(res: dict[str, Any]) -> list[str]:
    t3 = res["table3"]
    rows = t3["rows"]
    rope = rows.get("rope")
    body = []
    table3 = paper_number("efficiency.table3.values")
    for key, r in rows.items():
        paper = table3.get(r["pe"]) if (r["pe"] != "tape" or key == "tape_fused") else None
        d_params = r["params"] - rope["params"] if rope else None
        body.append([
            _label(key), f"{r['params']:,}", f"{r['params_2p20']:.2f}",
            "n/a" if d_params is None else f"{d_params:+,}",
            f"{r['flops'] / 1e9:.2f}", f"{r['macs'] / 1e9:.2f}",
            _f(r["flops"] / rope["flops"] if rope else None, ".3f"),
            "" if paper is None else f"{paper['params_2p20']:.2f}",
            "" if paper is None else f"{paper['gflops']:.2f}",
            "" if paper is None else f"{paper['gmacs']:.2f}",
        ])
    m = t3["model"]
    head = [
        f"## Parameters, FLOPs and MACs: the 155M model, batch {t3['batch']} x {t3['seq_len']} tokens (Table 3)",
        "",
        f"Model: {m['n_layers']} layers, d_model {m['d_model']}, {m['n_heads']} heads, SwiGLU "
        f"{m['d_ff'] or 4 * m['d_model']}, vocab {m['vocab_size']}, untied embeddings. One forward "
        "pass to the logits, counted by `torch.utils.flop_counter.FlopCounterMode` on the meta "
        "device (nothing allocated). MACs = FLOPs / 2. TAPE fused and the Triton kernel are counted "
        "with one QKᵀ for A·V and A·E (one [V | E] call), whatever this device ran. The last "
        "three columns are **the paper's** Table 3 numbers.",
        "",
    ]
    return head + _table(
        ["PE", "params", "params (2^20)", "vs RoPE", "GFLOPs", "GMACs", "FLOPs / RoPE",
         "paper params (2^20)", "paper GFLOPs", "paper GMACs"], body)


def _op(res: dict[str, Any]) -> list[str]:
    sec = res["attention_op"]
    c = sec["config"]
    on_cuda = any("memory" in r for r in sec["rows"].values())
    body = []
    table4 = paper_number("efficiency.table4.values")
    for key, r in sec["rows"].items():
        vs = r.get("vs_rope", {})
        if "not_run" in r:
            body.append([_label(key), r["backend"], f"{r['flops'] / 1e9:.4g}", r["not_run"], "", "", "", "",
                         _f(vs.get("flops"), ".2f"), ""] + (["", ""] if on_cuda else []))
            continue
        paper = table4.get(key)
        body.append([
            _label(key), r["backend"], f"{r['flops'] / 1e9:.4g}",
            _time_cell(r["time_s"], 1e3, ".2f"), _tflops(r), f"{r['it_per_s']:.1f}",
            _f(vs.get("time"), ".2f"), _f(vs.get("time_min"), ".2f"), _f(vs.get("flops"), ".2f"),
            "" if paper is None else f"{paper['time_s'] * 1e3:.3f}",
        ] + ([f"{r['memory']['cuda_peak_bytes'] / MIB:.1f}", _f(vs.get("memory", {}).get("cuda_peak_bytes"), ".2f")]
             if on_cuda else []))
    head = [
        "## (a) Attention operator, one layer, forward",
        "",
        f"Shape: batch {c['batch']}, {c['seq_len']} tokens, d_model {c['d_model']}, {c['n_heads']} heads "
        f"(head dim {c['d_model'] // c['n_heads']}), {sec['dtype']}. Median [min, max] of "
        f"{c['repeats']} interleaved rounds after {c['warmup']} warm-up calls. Throughput = "
        "1 / median. The last column is **the paper's** Table 4 (one A100, sizes not disclosed): "
        "not comparable in absolute terms.",
        "",
    ]
    return head + _table(
        ["variant", "backend", "GFLOP", "ms / call", "TFLOP/s", "calls / s", "time / RoPE", "fastest / RoPE's", "FLOPs / RoPE",
         "paper ms (A100)"] + (["CUDA peak (MiB)", "CUDA peak / RoPE"] if on_cuda else []), body)


def _train(res: dict[str, Any]) -> list[str]:
    sec = res["train_step"]
    c = sec["config"]
    rows = sec["rows"]
    any_row = next(r for r in rows.values() if "not_run" not in r)
    mem_keys = [k for k in ("saved_activation_bytes", "rss_step_peak_bytes", "cuda_peak_bytes", "cuda_total_peak_bytes")
                if k in any_row["memory"]]
    mem_names = {"saved_activation_bytes": "saved for backward (MiB)",
                 "rss_step_peak_bytes": "peak RSS of a step (MiB)",
                 "cuda_peak_bytes": "CUDA peak of a step above its start (MiB)",
                 "cuda_total_peak_bytes": "CUDA peak of a step in all, weights and AdamW state included (MiB)"}
    body = []
    for key, r in rows.items():
        vs = r.get("vs_rope", {})
        if "not_run" in r:
            body.append([_label(key), f"{r['params']:,}", f"{r['flops'] / 1e9:.4g}", r["not_run"], "", ""]
                        + [""] * len(mem_keys) + ["", "", "", _f(vs.get("flops"), ".3f")]
                        + [""] * len(mem_keys) + ([""] if sec["peak_bf16_flops"] else []))
            continue
        cpu = vs.get("cpu_time_paired", {})
        mem_cells = [_f(r["memory"].get(k) / MIB if isinstance(r["memory"].get(k), (int, float)) else None, ".1f")
                     for k in mem_keys]
        mem_ratio = [_f(vs.get("memory", {}).get(k), ".2f") for k in mem_keys]
        body.append([
            _label(key), f"{r['params']:,}", f"{r['flops'] / 1e9:.4g}",
            _time_cell(r["time_s"], 1.0, ".3f"), _tflops(r), f"{r['tokens_per_s']:,.0f}",
            *mem_cells, _f(vs.get("time"), ".3f"), _f(vs.get("time_min"), ".3f"), _f(cpu.get("median"), ".3f"),
            _f(vs.get("flops"), ".3f"), *mem_ratio,
        ] + ([_f(None if r["mfu"] is None else 100 * r["mfu"], ".1f")] if sec["peak_bf16_flops"] else []))
    m = any_row["model"]
    head = [
        "## (b) Training step: forward, loss, backward, AdamW",
        "",
        f"Model: {m['n_layers']} layers, d_model {m['d_model']}, {m['n_heads']} heads, SwiGLU "
        f"{m['d_ff'] or 4 * m['d_model']}, vocab {m['vocab_size']}; batch {c['batch']} x "
        f"{c['seq_len']} tokens; compute {sec['autocast'] or 'float32'}. Median [min, max] of "
        f"{c['repeats']} interleaved rounds after {c['warmup']} warm-up steps. GFLOP: forward + "
        "backward counted on the meta device (the optimizer's elementwise work is not counted).",
        "",
    ]
    header = (["variant", "params", "GFLOP", "s / step", "TFLOP/s", "tokens / s"]
              + [mem_names[k] for k in mem_keys]
              + ["time / RoPE", "fastest / RoPE's", "CPU time / RoPE (paired)", "FLOPs / RoPE"]
              + [mem_names[k].split(" (")[0] + " / RoPE" for k in mem_keys]
              + (["MFU %"] if sec["peak_bf16_flops"] else []))
    return head + _table(header, body)


def _pm(r: dict[str, float] | None) -> str:
    """A paired ratio as "median ± stderr"."""
    return "n/a" if not r else f"{r['median']:.3f} ± {r['stderr']:.3f}"


def _summary(res: dict[str, Any]) -> list[str]:
    s = res["tape_vs_rope"]
    op, train = s.get("attention_op", {}), s.get("train_step", {})
    names = [k for k in train if k not in ("flop_lower_bound", "saved_by_tensor_minus_rope")]
    body = []
    for name in names:
        a, b = op.get(name, {}), train[name]
        if "not_run" in b:
            body.append([_label(f"tape_{name}"), b["not_run"], "", "", "", _f(a.get("flops"), ".3f"),
                         _f(b.get("flops"), ".3f"), "", ""])
            continue
        mem = b.get("memory", {})
        body.append([
            _label(f"tape_{name}"), _f(a.get("time"), ".2f"), _pm(b.get("time_paired")),
            _pm(b.get("cpu_time_paired")), _f(b.get("time_min"), ".3f"), _f(a.get("flops"), ".3f"),
            _f(b.get("flops"), ".3f"), _f(mem.get("saved_activation_bytes"), ".3f"),
            _f(mem.get("rss_step_peak_bytes", mem.get("cuda_total_peak_bytes", mem.get("cuda_peak_bytes"))), ".2f"),
        ])
    paper = s["paper_table4"]
    head = [
        "## TAPE / RoPE",
        "",
        "Ratios within this run, per way of computing A·V and A·E (fused: one QKᵀ, the Triton "
        "kernel on CUDA and one SDPA call on CPU as `tape_fused=null` picks it; unfused: two "
        "calls; concat / padded: the two one-call SDPA layouts). (b) wall and CPU time are the "
        "medians of round-by-round ratios, ± their standard error (1.2533 · IQR / 1.349 / sqrt(rounds)). "
        f"FLOP lower bounds (one QKᵀ): (a) {_f(op.get('flop_lower_bound'), '.3f')}, (b) "
        f"{_f(train.get('flop_lower_bound'), '.3f')}; a FLOP-bound kernel cannot do better. "
        f"**The paper's** Table 4 ratios (A100, fused Triton kernel): fused {paper['fused']:.2f}, "
        f"unfused {paper['unfused']:.2f}.",
        "",
    ]
    table = _table(["TAPE variant", "(a) op time", "(b) step wall time (paired)", "(b) step CPU time (paired)",
                    "(b) fastest step", "(a) FLOPs", "(b) FLOPs", "(b) saved for backward",
                    "(b) peak memory of a step"], body)
    return head + table + [""] + _saved_gap(train)


def _saved_gap(train: dict[str, Any], top: int = 8) -> list[str]:
    """Where TAPE's extra saved-for-backward memory sits, by tensor shape."""
    gaps = train.get("saved_by_tensor_minus_rope", {})
    if not gaps:
        return []
    lines = ["### Saved for backward by tensor: TAPE minus RoPE (MiB)", "",
             "Storages autograd keeps during the forward pass, grouped by the shape and dtype of the "
             f"first tensor saved on each (B = batch, He = E heads, N = tokens); the {top} largest "
             "differences per variant, then the total.", ""]
    body = []
    for name, gap in gaps.items():
        items = list(gap.items())
        for shape, d in items[:top]:
            body.append([_label(f"tape_{name}"), f"`{shape}`", f"{d / MIB:+.2f}"])
        body.append([_label(f"tape_{name}"), "**total**", f"{sum(gap.values()) / MIB:+.2f}"])
    return lines + _table(["variant", "tensor (shape dtype)", "MiB"], body)


def render_markdown(res: dict[str, Any], notes: list[str] | None = None) -> str:
    """The whole efficiency.md page."""
    mach, ver = res["machine"], res["versions"]
    lines = [
        "# Efficiency: TAPE against RoPE, FIRE, T5 bias and the other PEs (paper Tables 3 and 4)",
        "",
        f"Generated by `{res.get('command', 'python -m pipelines.benchmark')}` on "
        f"{res.get('created_utc', 'unknown date')} (scale `{res['settings']['scale']}`, device "
        f"`{res['settings']['device']}`). Every number below comes from that run, except the "
        "columns marked as the paper's. Raw data: `efficiency.json` beside this file.",
        "",
        f"- Machine: {mach.get('gpu', mach['cpu'])}; {mach['cpu_count']} CPU cores, torch threads "
        f"{mach['torch_threads']}, {mach['memory_gib']} GiB RAM; {mach['os']}.",
        f"- 1-minute load average at the start and end of the run: "
        f"{mach.get('load_average_1min', {}).get('start')} / {mach.get('load_average_1min', {}).get('end')}"
        f" (other jobs on the machine disturb timings; compare the fastest-call columns).",
        "- Libraries: " + ", ".join(f"{k} {v}" for k, v in ver.items()) + ".",
    ]
    git = res.get("git")
    if git:
        lines.append(f"- Code: commit `{git.get('commit')}`" + (" (uncommitted changes present)" if git.get("dirty") else "") + ".")
    lines.append("")
    for part in (_summary, _table3, _op, _train):
        lines += part(res) + [""]
    if notes:
        lines += ["## How this is measured", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _names(names: list[str]) -> str:
    """Display names joined for prose: "A, B and C"."""
    shown = [tape.pe.display(n) for n in names]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _bias_encodings() -> list[str]:
    return [n for n in tape.pe.names() if tape.pe.get(n).materialises_bias]


def encoding_operators() -> str:
    """What each registered encoding adds to attention, grouped by its class attributes."""
    others = [n for n in tape.pe.names() if n != "tape"]
    rotary = [n for n in others if tape.pe.get(n).rotary]
    bias = [n for n in others if n in _bias_encodings()]
    plain = [n for n in others if n not in rotary and n not in bias]
    parts = []
    if rotary:
        parts.append(f"{_names(rotary)}: rotate q and k, then attention.")
    if bias:
        parts.append(f"{_names(bias)}: compute a (B, H, N, N) float32 bias (CoPE and PaTH from the "
                     "score matrix), then attention with a float mask; memory grows as N².")
    if plain:
        parts.append(f"{_names(plain)}: attention.")
    return " ".join(parts)


def default_notes(res: dict[str, Any]) -> list[str]:
    """The measurement notes for efficiency.md, specialised to what this run did."""
    t3 = res["table3"]["rows"]
    on_cuda = res["settings"]["device"].startswith("cuda")
    paper3, paper4 = paper_number("efficiency.table3.values"), paper_number("efficiency.table4.values")
    notes = [
        "**Attention operator (a).** Timed: one layer's work between the q/k/v projections and the "
        "output projection, plus the PE's own per-layer updates, through the same hooks the decoder "
        "calls (`tape/bench/attention_op.py`). " + encoding_operators() + " TAPE: rotate with E, "
        "attention with E as extra values (one call or two: "
        "the variants and the kernel note), the post-attention head map on A·E and the token-gated "
        "PE-MLP (one He x He matrix per token). Projections, the SwiGLU MLP and the once-per-forward position tables "
        "are excluded (identical for every PE, they would only dilute the ratios). Forward only, "
        "without autograd, as the paper's Table 4 timed inference steps.",
        "**Training step (b).** `DecoderLM` forward, next-token cross-entropy, backward and "
        "`torch.optim.AdamW.step`, on fixed random tokens; gradients are set to None before each step.",
        "**Timing.** All variants are built first, warmed up, then timed in interleaved rounds (each "
        "round calls every variant once, starting at a different one), so drift on a shared machine "
        "hits all alike; TAPE/RoPE ratios are taken round by round within the run. Each call also "
        "records the process's CPU time (`time.process_time`, all its threads): on a loaded machine "
        "wall time stretches while the process waits, CPU time much less, so the paired CPU-time "
        "ratio is the steadier measure of the work; on CUDA only wall time counts.",
        "**FLOPs.** `FlopCounterMode` counts matrix products only (2 FLOPs per MAC, so MACs = FLOPs / "
        "2) over the full N x N score matrix, as the paper's Table 3 does; causal kernels skip about "
        "half of it, which does not change the ratio of the N² terms. Rotations, softmax, norms and "
        "the optimizer are elementwise and not counted.",
        "**Lower bound.** TAPE's counted FLOPs over RoPE's for the measured configuration, with A·V "
        "and A·E sharing one QKᵀ. E stores each (cos, sin) pair once, so it is exactly as wide as V "
        "and A·E costs one more A·V: the operator's bound is about 1.5, not 1.25. It bounds a "
        "FLOP-bound kernel; small operators that are bound by memory traffic or kernel launches can "
        "land below it. The paper's fused kernel aggregates full-width cos and sin (two extra A·V), "
        "a FLOP ratio of about 2.0, yet the paper measured "
        f"{paper4['tape_fused']['time_s'] / paper4['rope']['time_s']:.2f}: its operator was not "
        "FLOP-bound at "
        "its size.",
    ]
    if "tape_fused" in t3 and "rope" in t3:
        d_flops = (t3["tape_fused"]["flops"] - t3["rope"]["flops"]) / 1e9
        notes.append(
            f"**Table 3 against the paper.** TAPE's extra work here is {d_flops:.2f} GFLOPs against "
            f"the paper's {paper3['tape']['gflops'] - paper3['rope']['gflops']:.2f}: the paper's code "
            "aggregates cos and sin at full head width (two "
            "extra A·V per layer), ours the d/2 pairs once (one). Our TAPE has 38,160 parameters "
            "fewer than the paper's count: its last layer has no E-update maps, because the last "
            "E is never read (the official code keeps them, untrained; with them the count is "
            f"{(t3['tape_fused']['params'] + 38160) / 2**20:.2f} x 2^20). RoPE: our product-only "
            f"count gives 320.91 GFLOPs against the paper's {paper3['rope']['gflops']:.2f} (its tool "
            "also counted some "
            "elementwise work).")
    if on_cuda:
        notes.append(
            "**Memory (CUDA).** `torch.cuda.max_memory_allocated` during one step, each variant "
            "alone on the device: in all (weights and AdamW state included; the TAPE / RoPE "
            "table's peak memory, where a run recorded it), and minus what was allocated before "
            "the step (its activations and transients). Saved-for-backward bytes "
            "as on CPU. MFU uses the forward+backward FLOP count and the GPU's dense bf16 peak; "
            "GPUs not in the table get no MFU.")
        notes.append(
            "**CUDA attention kernels.** `backend=auto` gives TAPE fused the Triton [V | E] kernel "
            "(one QKᵀ) when triton is installed, TAPE unfused one FlashAttention-2 call per value "
            "tensor with flash-attn (else two SDPA calls), and concat / padded one SDPA call; TAPE "
            "FlexAttention is one compiled `flex_attention` call with value [V | E] (`attn_backend=flex`). "
            f"{_names(_bias_encodings())} always run SDPA with a materialised float bias (FIRE and T5 "
            "as in the paper; CoPE and PaTH because their bias needs the scores), except ALiBi, whose "
            "slopes go to flash-attn where it is installed.")
    else:
        notes.append(
            "**Memory (CPU).** torch has no CPU allocator statistics, so two labelled measures: "
            "*saved for backward* = bytes of the distinct storages autograd keeps during the forward "
            "pass (activation memory, weights excluded; exact and repeatable; TAPE's E stream shows "
            "here); *peak RSS of a step* = in a fresh process per variant, after one warm-up step, "
            "the peak resident set during one step above the resident set before it (Linux "
            "`clear_refs`/`VmHWM`): activations, gradients, AdamW temporaries and allocator effects, "
            "page-granular and noisier.")
        notes.append(
            "**CPU attention kernels.** PyTorch's CPU SDPA uses its fast flash kernel only when V is "
            "as wide as q and k. TAPE's one-call layouts: *concat* passes [V | E] (width 2d), which "
            "drops SDPA to the math kernel (it materialises the N x N probabilities, hence its "
            "memory); *padded* zero-pads q and k to width 2d so the flash kernel takes the call "
            "(the logits are unchanged). `tape_fused=null` (auto) uses concat up to 512 keys and "
            "padded beyond, *unfused* makes two equal-width flash calls (`tape/model/attention.py`).")
        notes.append(
            "**Not run here.** The paper-scale GPU run (`python -m pipelines.benchmark device=cuda "
            "scale=paper`: the 155M model, bf16, the Triton [V | E] kernel and flash-attn when "
            "installed) was not run for this file, so the Triton kernel's row says so (its correctness "
            "is tested on CPU under the Triton interpreter; its GPU windows are in results/gpu.md). That "
            "path synchronises the device around every timed call and reports "
            "`torch.cuda.max_memory_allocated`.")
    return notes


def rerender(json_path: Path) -> Path:
    """Write efficiency.md beside a benchmark's efficiency.json, rendered by this code from that
    run's data: today's columns and notes, the same measurements. Returns the markdown's path."""
    if not json_path.is_file():
        raise FileNotFoundError(f"{json_path}: no such file; pass a benchmark's efficiency.json "
                                "(python -m pipelines.benchmark writes one)")
    res = json.loads(json_path.read_text())
    md = json_path.with_suffix(".md")
    md.write_text(render_markdown(res, default_notes(res)))
    return md


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tape.bench.render results/efficiency.json``: re-render the markdown beside it."""
    parser = argparse.ArgumentParser(prog="python -m tape.bench.render", description=rerender.__doc__)
    parser.add_argument("json", type=Path, nargs="+", help="efficiency.json files of benchmark runs")
    args = parser.parse_args(argv)
    for path in args.json:
        try:
            print(f"wrote {rerender(path)}")
        except (FileNotFoundError, json.JSONDecodeError, KeyError) as err:
            print(f"python -m tape.bench.render: {path}: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
