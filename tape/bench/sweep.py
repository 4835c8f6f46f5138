"""The attention operator by sequence length (issue 21: N = 1k to 16k, forward and
forward+backward): TAPE's one-QKᵀ paths beside RoPE and the bias encodings, time and TFLOP/s per
call, the tokens per call held fixed (batch = tokens / N).

FLOPs are counted on the meta device over the full N x N score matrix (Table 3's convention,
tape/bench/flops.py), so a causal kernel's TFLOP/s here is about twice the work it really does;
the ratios between variants do not depend on that. FIRE and T5 materialise (B, H, N, N) biases,
so they run only up to ``bias_max_len``.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tape.bench.attention_op import AttentionOp, build_attention_op
from tape.bench.flops import META, count_flops
from tape.bench.timing import time_interleaved
from tape.bench.variants import TAPE_MODES, Variant, counted_on, make_variants, not_run_reason
from tape.model import ModelConfig
from tape.pe.tape import TAPELayer

BIAS_PES = ("fire", "t5")


@dataclass
class SweepSettings:
    """Which variants, at which lengths, and the timing schedule."""

    seq_lens: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    tokens: int = 16384  # per call: batch = max(1, tokens // N)
    d_model: int = 768
    n_heads: int = 12
    variants: list[str] = field(default_factory=lambda: [
        "rope", "tape_triton", "tape_flex", "tape_unfused", "tape_concat", "fire", "t5"])
    bias_max_len: int = 4096
    backend: str = "auto"
    warmup: int = 3
    repeats: int = 10
    seed: int = 0


def _with_grads(op: AttentionOp) -> Callable[[], Any]:
    """One forward and backward of ``op``: the gradients of q, k, v, the layer's weights and,
    for TAPE, of E (past layer 0 E is computed, so its gradient flows back through A·E)."""
    for t in (op.q, op.k, op.v):
        t.requires_grad_(True)
    inputs = [op.q, op.k, op.v, *(p for p in op.layer.parameters() if p.requires_grad)]
    if isinstance(op.layer, TAPELayer) and any(True for _ in op.layer.parameters()):  # E is updated
        op.state = op.state.with_rot(op.state.rot.detach().requires_grad_(True))
        inputs.append(op.state.rot)

    def step() -> Any:
        out, rot = op()
        loss = out.float().sum()
        if rot is not None and rot.requires_grad:
            loss = loss + rot.float().sum()
        return torch.autograd.grad(loss, inputs, allow_unused=True)
    return step


def _forward(op: AttentionOp) -> Callable[[], Any]:
    def call() -> Any:
        with torch.no_grad():
            return op()
    return call


def _variants(names: list[str]) -> list[Variant]:
    pes = sorted({"tape" if n.startswith("tape_") else n for n in names})
    modes = [n.removeprefix("tape_") for n in names if n.startswith("tape_")]
    by_label = {v.label: v for v in make_variants(pes, modes)}
    if unknown := [n for n in names if n not in by_label]:
        raise ValueError(f"--variants {' '.join(unknown)}: name an encoding (rope, fire, ...) or a TAPE path "
                         f"tape_<mode>, mode one of {', '.join(TAPE_MODES)}")
    return [by_label[n] for n in names]


def sweep(s: SweepSettings, device: torch.device, dtype: torch.dtype,
          log: Callable[[str], None] = print,
          on_length: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """{"settings", "rows": {N: {label: {...}}}}: per length and variant the batch, the resolved
    backend, and per pass ("forward", "forward_backward") the counted FLOPs, the timing, TFLOP/s
    and the time ratio to RoPE; or why the variant did not run. ``on_length`` gets the result so
    far after each length (a run cut off keeps what it measured)."""
    variants = _variants(s.variants)
    rows: dict[int, dict[str, Any]] = {}
    settings = {**s.__dict__, "device": str(device), "dtype": str(dtype).removeprefix("torch.")}
    for n in s.seq_lens:
        try:
            rows[n] = _one_length(s, variants, n, device, dtype, log)
        except torch.OutOfMemoryError as err:  # this length only: the next may still fit (smaller batch)
            why = f"not run: out of memory at this length ({str(err).splitlines()[0][:80]})"
            rows[n] = {v.label: {"batch": _batch(s, n), "not_run": why} for v in variants}
            log(f"N = {n}: {why}")
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if on_length is not None:
            on_length({"settings": settings, "rows": rows})
    return {"settings": settings, "rows": rows}


def _batch(s: SweepSettings, n: int) -> int:
    """Sequences a call at length n: about ``s.tokens`` tokens in all, at least one."""
    return max(1, s.tokens // n)


def _one_length(s: SweepSettings, variants: list[Variant], n: int, device: torch.device, dtype: torch.dtype,
                log: Callable[[str], None]) -> dict[str, Any]:
    """Every variant at one length: counted FLOPs, then both passes timed, interleaved."""
    batch = _batch(s, n)
    base = ModelConfig(vocab_size=8, n_layers=2, d_model=s.d_model, n_heads=s.n_heads, max_seq_len=n,
                       attn_backend=s.backend)
    row: dict[str, Any] = {}
    calls: dict[str, dict[str, Callable[[], Any]]] = {"forward": {}, "forward_backward": {}}
    for v in variants:
        cfg = v.config(base)
        meta = build_attention_op(counted_on(v, cfg, device), batch, n, META, dtype, s.seed)  # as it runs there
        row[v.label] = {"batch": batch, "flops": {"forward": count_flops(_forward(meta)),
                                                  "forward_backward": count_flops(_with_grads(meta))}}
        why = not_run_reason(v, device)
        if why is None and v.pe in BIAS_PES and n > s.bias_max_len:
            why = f"not run: a materialised (B, H, N, N) bias past N = {s.bias_max_len}"
        if why is not None:
            row[v.label]["not_run"] = why
            continue
        op = build_attention_op(cfg, batch, n, device, dtype, s.seed)
        row[v.label]["backend"] = op.resolved_backend()
        calls["forward"][v.label] = _forward(op)
        calls["forward_backward"][v.label] = _with_grads(op)
    for name, fns in calls.items():
        log(f"N = {n}, batch {batch}: {name}, {len(fns)} variants, {s.warmup} warm-up + {s.repeats} rounds")
        for label, t in time_interleaved(fns, s.warmup, s.repeats, device).items():
            flops = row[label]["flops"][name]
            row[label][name] = {"time_s": t.to_dict(), "tflops": flops / t.median_s / 1e12}
    for name in calls:
        ref = row.get("rope", {}).get(name)
        for entry in row.values():
            if ref is not None and name in entry:
                entry[name]["vs_rope"] = entry[name]["time_s"]["median_s"] / ref["time_s"]["median_s"]
    return row


TAPE_PATHS = {"tape_triton": "triton", "tape_flex": "flex", "tape_unfused": "two_calls", "tape_concat": "concat"}


def fastest_tape_path(row: dict[str, Any], name: str = "forward_backward") -> str | None:
    """The fastest exact TAPE path that ran at one length (tape/model/attention.py's
    ``CUDA_TAPE_PATH`` names), or None when none ran."""
    timed = {TAPE_PATHS[label]: e[name]["time_s"]["median_s"] for label, e in row.items()
             if label in TAPE_PATHS and name in e}
    return min(timed, key=timed.__getitem__) if timed else None


def markdown(result: dict[str, Any], command: str) -> str:
    """Per pass a table, variants by length: median ms, TFLOP/s and the ratio to RoPE."""
    rows = result["rows"]
    lens = list(rows)
    labels = list(next(iter(rows.values()))) if rows else []
    st = result["settings"]
    out = [f"# The attention operator by length ({st['device']}, {st['dtype']})", "",
           f"`{command}`: {st['d_model']} wide, {st['n_heads']} heads, {st['tokens']} tokens a call "
           f"(batch = tokens / N), median of {st['repeats']} interleaved rounds after {st['warmup']} "
           "warm-up calls. A cell: ms, TFLOP/s (full N x N count), time / RoPE's.", ""]
    for name, title in (("forward", "Forward"), ("forward_backward", "Forward and backward")):
        at = next((n for n in lens if "flops" in rows[n].get("rope", {})), None)  # the ratio falls with N
        counted = rows[at] if at is not None else {}
        out += [f"## {title}", "", "| variant | " + " | ".join(f"N = {n}" for n in lens)
                + f" | FLOPs / RoPE's{f' (N = {at})' if at is not None else ''} |",
                "|---|" + "---|" * (len(lens) + 1)]
        for label in labels:
            flops = (f"{counted[label]['flops'][name] / counted['rope']['flops'][name]:.2f}"
                     if "flops" in counted.get(label, {}) else "n/a")
            cells = []
            for n in lens:
                entry = rows[n][label]
                if name not in entry:
                    cells.append(entry.get("not_run", "not run"))
                    continue
                e = entry[name]
                ratio = f", {e['vs_rope']:.2f}x" if "vs_rope" in e else ""
                cells.append(f"{1e3 * e['time_s']['median_s']:.3g} ms, {e['tflops']:.3g}{ratio}")
            out.append(f"| {label} | " + " | ".join(cells) + f" | {flops} |")
        fastest = [fastest_tape_path(rows[n], name) or "-" for n in lens]
        out += ["| fastest TAPE path | " + " | ".join(fastest) + " | |", ""]
    return "\n".join(out)
