"""Markdown for results/efficiency.md from the dict ``run_benchmark`` returns (plus command info)."""

from __future__ import annotations

from typing import Any

from tape.bench import paper_numbers

LABELS = {
    "tape_fused": "TAPE fused", "tape_unfused": "TAPE unfused", "rope": "RoPE", "fire": "FIRE",
    "t5": "T5 bias", "alibi": "ALiBi", "xpos": "xPos", "randpe": "RandPE", "nope": "NoPE",
}
MIB = 2**20


def _label(key: str) -> str:
    return LABELS.get(key, key)


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _time_cell(t: dict[str, float], scale: float, fmt: str) -> str:
    """median [min, max] in the given unit."""
    return f"{t['median_s'] * scale:{fmt}} [{t['min_s'] * scale:{fmt}}, {t['max_s'] * scale:{fmt}}]"


def _table3(res: dict[str, Any]) -> list[str]:
    t3 = res["table3"]
    rows = t3["rows"]
    rope = rows.get("rope")
    body = []
    for key, r in rows.items():
        paper = paper_numbers.TABLE3.get(r["pe"]) if (r["pe"] != "tape" or r["fused"]) else None
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
        "device (nothing allocated). MACs = FLOPs / 2. The last three columns are **the paper's** "
        "Table 3 numbers.",
        "",
    ]
    return head + _table(
        ["PE", "params", "params (2^20)", "vs RoPE", "GFLOPs", "GMACs", "FLOPs / RoPE",
         "paper params (2^20)", "paper GFLOPs", "paper GMACs"], body)


def _op(res: dict[str, Any]) -> list[str]:
    sec = res["attention_op"]
    c = sec["config"]
    on_cuda = "memory" in next(iter(sec["rows"].values()))
    body = []
    for key, r in sec["rows"].items():
        vs = r.get("vs_rope", {})
        paper = paper_numbers.TABLE4.get(key)
        body.append([
            _label(key), r["backend"], f"{r['flops'] / 1e9:.4g}",
            _time_cell(r["time_s"], 1e3, ".2f"), f"{r['it_per_s']:.1f}",
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
        ["variant", "backend", "GFLOP", "ms / call", "calls / s", "time / RoPE", "fastest / RoPE's", "FLOPs / RoPE",
         "paper ms (A100)"] + (["CUDA peak (MiB)", "CUDA peak / RoPE"] if on_cuda else []), body)


def _train(res: dict[str, Any]) -> list[str]:
    sec = res["train_step"]
    c = sec["config"]
    rows = sec["rows"]
    any_row = next(iter(rows.values()))
    mem_keys = [k for k in ("saved_activation_bytes", "rss_step_peak_bytes", "cuda_peak_bytes")
                if k in any_row["memory"]]
    mem_names = {"saved_activation_bytes": "saved for backward (MiB)",
                 "rss_step_peak_bytes": "peak RSS of a step (MiB)",
                 "cuda_peak_bytes": "CUDA peak of a step (MiB)"}
    body = []
    for key, r in rows.items():
        vs = r.get("vs_rope", {})
        mem_cells = [_f(r["memory"].get(k) / MIB if isinstance(r["memory"].get(k), (int, float)) else None, ".1f")
                     for k in mem_keys]
        mem_ratio = [_f(vs.get("memory", {}).get(k), ".2f") for k in mem_keys]
        body.append([
            _label(key), f"{r['params']:,}", f"{r['flops'] / 1e9:.4g}",
            _time_cell(r["time_s"], 1.0, ".3f"), f"{r['tokens_per_s']:,.0f}",
            *mem_cells, _f(vs.get("time"), ".2f"), _f(vs.get("time_min"), ".2f"),
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
    header = (["variant", "params", "GFLOP", "s / step", "tokens / s"]
              + [mem_names[k] for k in mem_keys] + ["time / RoPE", "fastest / RoPE's", "FLOPs / RoPE"]
              + [mem_names[k].split(" (")[0] + " / RoPE" for k in mem_keys]
              + (["MFU %"] if sec["peak_bf16_flops"] else []))
    return head + _table(header, body)


def _summary(res: dict[str, Any]) -> list[str]:
    s = res["tape_vs_rope"]
    body = []
    for section, name in (("attention_op", "(a) attention op time"), ("train_step", "(b) train step time")):
        if section not in s:
            continue
        e = s[section]
        cells = []
        for v in ("fused", "unfused"):
            cells += [f"{e[v]['time']:.2f}", f"{e[v]['time_min']:.2f}"]
        paper = s["paper_table4"]
        paper_cells = ([f"{paper['fused']:.2f}", f"{paper['unfused']:.2f}"]
                       if section == "attention_op" else ["", ""])
        body.append([name, *cells, f"{e['flop_lower_bound']:.3f}", *paper_cells])
    for section, tag in (("attention_op", "(a)"), ("train_step", "(b)")):
        if section not in s:
            continue
        e = s[section]
        for key, name in (("saved_activation_bytes", f"{tag} memory: saved for backward"),
                          ("rss_step_peak_bytes", f"{tag} memory: peak RSS of a step"),
                          ("cuda_peak_bytes", f"{tag} memory: CUDA peak")):
            if key in e["fused"]["memory"]:
                body.append([name, _f(e["fused"]["memory"][key], ".2f"), "",
                             _f(e["unfused"]["memory"].get(key), ".2f"), "", "", "", ""])
    head = [
        "## TAPE / RoPE",
        "",
        "Ratios within this run: of the medians, and of the fastest calls (the calls least "
        "disturbed by other load on a shared machine; the JSON also holds the round-by-round "
        "ratios). Memory rows hold their one measurement in the median columns. Lower bound: TAPE's FLOPs over RoPE's for "
        "the measured configuration, counting A·V and A·E with one QKᵀ (the least work exact "
        "TAPE needs); a FLOP-bound kernel cannot do better. The paper columns are **the paper's** "
        "Table 4 ratios (A100, fused Triton kernel).",
        "",
    ]
    return head + _table(["", "fused: median", "fused: fastest", "unfused: median", "unfused: fastest",
                          "FLOP lower bound", "paper fused", "paper unfused"], body)


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


def default_notes(res: dict[str, Any]) -> list[str]:
    """The measurement notes for efficiency.md, specialised to what this run did."""
    t3 = res["table3"]["rows"]
    on_cuda = res["settings"]["device"].startswith("cuda")
    notes = [
        "**Attention operator (a).** Timed: one layer's work between the q/k/v projections and the "
        "output projection, plus the PE's own per-layer updates, through the same hooks the decoder "
        "calls (`tape/bench/attention_op.py`). RoPE, xPos, RandPE: rotate q and k, then attention. "
        "FIRE, T5, ALiBi: compute the (B, H, N, N) bias, then attention with a float mask. NoPE: "
        "attention. TAPE: rotate with E, attention with E as extra values (fused: one call on "
        "[V | E]; unfused: two calls of equal width), the post-attention head map on A·E and the "
        "token-gated PE-MLP. Projections, the SwiGLU MLP and the once-per-forward position tables "
        "are excluded (identical for every PE, they would only dilute the ratios). Forward only, "
        "without autograd, as the paper's Table 4 timed inference steps.",
        "**Training step (b).** `DecoderLM` forward, next-token cross-entropy, backward and "
        "`torch.optim.AdamW.step`, on fixed random tokens; gradients are set to None before each step.",
        "**Timing.** All variants are built first, warmed up, then timed in interleaved rounds (each "
        "round calls every variant once, starting at a different one), so drift on a shared machine "
        "hits all alike; TAPE/RoPE ratios are taken within the run. Identical runs on this kind of "
        "CPU differ by about 15 %.",
        "**FLOPs.** `FlopCounterMode` counts matrix products only (2 FLOPs per MAC, so MACs = FLOPs / "
        "2) over the full N x N score matrix, as the paper's Table 3 does; causal kernels skip about "
        "half of it, which does not change the ratio of the N² terms. Rotations, softmax, norms and "
        "the optimizer are elementwise and not counted.",
        "**Lower bound.** TAPE's counted FLOPs over RoPE's for the measured configuration, with A·V "
        "and A·E sharing one QKᵀ. E stores each (cos, sin) pair once, so it is exactly as wide as V "
        "and A·E costs one more A·V: the operator's bound is about 1.5, not 1.25. It bounds a "
        "FLOP-bound kernel; small operators that are bound by memory traffic or kernel launches can "
        "land below it. The paper's fused kernel aggregates full-width cos and sin (two extra A·V), "
        "a FLOP ratio of about 2.0, yet the paper measured 1.23: its operator was not FLOP-bound at "
        "its size.",
    ]
    if "tape_fused" in t3 and "rope" in t3:
        d_flops = (t3["tape_fused"]["flops"] - t3["rope"]["flops"]) / 1e9
        notes.append(
            f"**Table 3 against the paper.** TAPE's extra work here is {d_flops:.2f} GFLOPs against "
            "the paper's 44.55: the paper's code aggregates cos and sin at full head width (two "
            "extra A·V per layer), ours the d/2 pairs once (one). Our TAPE has 38,160 parameters "
            "fewer than the paper's count: its last layer has no E-update maps, because the last "
            "E is never read (the official code keeps them, untrained; with them the count is "
            f"{(t3['tape_fused']['params'] + 38160) / 2**20:.2f} x 2^20). RoPE: our product-only "
            "count gives 320.91 GFLOPs against the paper's 321.10 (its tool also counted some "
            "elementwise work).")
    if on_cuda:
        notes.append(
            "**Memory (CUDA).** `torch.cuda.max_memory_allocated` during one step minus what was "
            "allocated before it (other variants' weights stay resident). Saved-for-backward bytes "
            "as on CPU. MFU uses the forward+backward FLOP count and the GPU's dense bf16 peak; "
            "GPUs not in the table get no MFU.")
        notes.append(
            "**CUDA attention kernels.** With flash-attn installed, `backend=auto` gives RoPE and "
            "TAPE one FlashAttention-2 call per value tensor (it wants V as wide as q and k), so "
            "TAPE fused and unfused run the same schedule there; `backend=sdpa` compares PyTorch's "
            "kernels on one [V | E] call against two calls. FIRE and T5 always run SDPA with a "
            "materialised float bias, as in the paper.")
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
            "as wide as q and k; the fused [V | E] call (width 2d) drops to the math kernel, which "
            "materialises the N x N matrix, while the unfused path pays a second QKᵀ but keeps the "
            "fast kernel. On CPU the unfused path is therefore the faster one (see "
            "`tape/model/attention.py`).")
        notes.append(
            "**Not run here.** The paper-scale GPU run (`python -m pipelines.benchmark device=cuda "
            "scale=paper`: the 155M model, bf16, flash-attn when installed) was not run for this "
            "file: no GPU was available. That path synchronises the device around every timed call "
            "and reports `torch.cuda.max_memory_allocated`.")
    return notes
