"""Run the whole efficiency comparison and return one JSON-ready dict (no Hydra, no files)."""

from __future__ import annotations

import gc
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

import tape.pe as pe_registry
from tape.bench.attention_op import build_attention_op
from tape.bench.flops import META, count_flops, model_costs
from tape.bench.machine import library_versions, machine_info, peak_bf16_flops
from tape.bench.memory import cuda_peak_bytes, cuda_peaks, rss_in_subprocess, saved_tensor_bytes, saved_tensors_by_shape
from tape.bench.timing import paired_ratio, time_interleaved
from tape.bench.train_step import TrainStep
from tape.bench.variants import DEFAULT_TAPE_MODES, Variant, counted_config, counted_on, make_variants, not_run_reason
from tape.model import ModelConfig
from tape.paper import paper_number

ALL_PES = ["tape", "rope"] + [name for name in pe_registry.names() if name not in ("tape", "rope")]


@dataclass
class OpSettings:
    """Attention-operator microbenchmark: one layer's shape and the timing schedule."""

    batch: int = 1
    seq_len: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_kv_heads: int | None = None
    warmup: int = 3
    repeats: int = 20


@dataclass
class TrainSettings:
    """Training-step benchmark: model size, batch and the timing schedule."""

    vocab_size: int = 4096
    n_layers: int = 2
    d_model: int = 768
    n_heads: int = 12
    n_kv_heads: int | None = None
    d_ff: int | None = None
    batch: int = 1
    seq_len: int = 1024
    warmup: int = 2
    repeats: int = 20
    lr: float = 1e-4


@dataclass
class BenchSettings:
    """Everything one benchmark run depends on."""

    device: str = "cpu"
    scale: str = "cpu"
    pes: list[str] = field(default_factory=lambda: list(ALL_PES))
    tape_modes: list[str] = field(default_factory=lambda: list(DEFAULT_TAPE_MODES))
    backend: str = "auto"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    op: OpSettings = field(default_factory=OpSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    rss: bool = True  # CPU only: peak RSS of a fresh process per variant
    table3_batch: int = 1
    table3_seq_len: int = 1024
    seed: int = 0
    threads: int | None = None


def _dtypes(settings: BenchSettings, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """(op tensor dtype, train autocast dtype or None)."""
    name = settings.dtype
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" else "float32"
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype={settings.dtype!r}; choose auto, float32, bfloat16 or float16")
    dt = getattr(torch, name)
    return dt, (None if dt == torch.float32 else dt)


def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name} but this machine has no usable CUDA GPU "
                         "(torch.cuda.is_available() is False); use device=cpu, or run where there is one")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device={name!r}; choose cpu or cuda")
    return device


def _load_average() -> float | None:
    """1-minute load average (other jobs on a shared machine disturb timings)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _table3(variants: list[Variant], s: BenchSettings, log: Callable[[str], None]) -> dict[str, Any]:
    """Exact params and forward FLOPs of the paper's 155M model (ModelConfig defaults), meta device."""
    base = ModelConfig(max_seq_len=s.table3_seq_len, attn_backend="sdpa")
    rows = {}
    for v in variants:
        costs = model_costs(counted_config(v, v.config(base), one_qk=True), s.table3_batch, s.table3_seq_len)
        rows[v.label] = {
            "pe": v.pe, "fused": v.fused, "params": costs["params"],
            "params_2p20": costs["params"] / 2**20, "flops": costs["flops"], "macs": costs["flops"] // 2,
        }
    log(f"table 3: counted {len(rows)} variants on the meta device")
    return {"model": base.to_dict(), "batch": s.table3_batch, "seq_len": s.table3_seq_len, "rows": rows}


def _op_bench(
    variants: list[Variant], s: BenchSettings, device: torch.device, dtype: torch.dtype,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """(a) FLOPs (meta device) and interleaved forward timings of each variant's attention op."""
    o = s.op
    # Two layers so that layer 0 is not the last one: TAPE's last layer has no E updates.
    base = ModelConfig(vocab_size=8, n_layers=2, d_model=o.d_model, n_heads=o.n_heads,
                       n_kv_heads=o.n_kv_heads, max_seq_len=o.seq_len, attn_backend=s.backend)
    rows: dict[str, dict[str, Any]] = {}
    ops = {}
    for v in variants:
        cfg = v.config(base)
        meta_op = build_attention_op(counted_on(v, cfg, device), o.batch, o.seq_len, META, dtype, s.seed)
        rows[v.label] = {"pe": v.pe, "fused": v.fused, "flops": count_flops(meta_op)}
        if (why := not_run_reason(v, device)) is not None:
            rows[v.label].update(backend=cfg.attn_backend, not_run=why)
            continue
        ops[v.label] = build_attention_op(cfg, o.batch, o.seq_len, device, dtype, s.seed)
        rows[v.label]["backend"] = ops[v.label].resolved_backend()
    log(f"attention op: timing {len(ops)} variants, {o.warmup} warm-up + {o.repeats} interleaved rounds")
    with torch.no_grad():
        timings = time_interleaved(ops, o.warmup, o.repeats, device)
        if device.type == "cuda":
            for label, op in ops.items():
                rows[label]["memory"] = {"cuda_peak_bytes": cuda_peak_bytes(op, device)}
    for label, t in timings.items():
        rows[label]["time_s"] = t.to_dict()
        rows[label]["it_per_s"] = 1.0 / t.median_s
    del ops
    return {"config": asdict(o), "dtype": str(dtype).removeprefix("torch."), "rows": rows,
            "_timings": timings}


def _train_bench(
    variants: list[Variant], s: BenchSettings, device: torch.device,
    autocast: torch.dtype | None, log: Callable[[str], None],
) -> dict[str, Any]:
    """(b) FLOPs, interleaved timings and memory of a full training step per variant."""
    t = s.train
    base = ModelConfig(vocab_size=t.vocab_size, n_layers=t.n_layers, d_model=t.d_model,
                       n_heads=t.n_heads, n_kv_heads=t.n_kv_heads, d_ff=t.d_ff,
                       max_seq_len=t.seq_len, attn_backend=s.backend)
    rows: dict[str, dict[str, Any]] = {}
    steps = {}
    peak = peak_bf16_flops(device) if autocast == torch.bfloat16 else None
    for v in variants:
        cfg = v.config(base)
        costs = model_costs(counted_on(v, cfg, device), t.batch, t.seq_len, backward=True)
        rows[v.label] = {"pe": v.pe, "fused": v.fused, "params": costs["params"],
                         "flops": costs["flops"], "model": cfg.to_dict()}
        if (why := not_run_reason(v, device)) is not None:
            rows[v.label]["not_run"] = why
            continue
        steps[v.label] = TrainStep(cfg, t.batch, t.seq_len, device, autocast, t.lr, s.seed)
    log(f"train step: timing {len(steps)} variants, {t.warmup} warm-up + {t.repeats} interleaved rounds")
    timings = time_interleaved(steps, t.warmup, t.repeats, device)
    configs = {label: step.model.cfg for label, step in steps.items()}
    del steps  # memory is measured one variant at a time: 16 resident models would skew and crowd it
    _release(device)
    tokens = t.batch * t.seq_len
    for label, cfg in configs.items():
        row, tm = rows[label], timings[label]
        memory = _step_memory(cfg, row["pe"], t, s.seed, device, autocast)
        row.update(time_s=tm.to_dict(), steps_per_s=1.0 / tm.median_s,
                   tokens_per_s=tokens / tm.median_s, memory=memory,
                   mfu=None if peak is None else row["flops"] / tm.median_s / peak)
    if device.type == "cpu" and s.rss:
        log(f"train step: peak RSS of one step, {len(timings)} fresh processes")
        for v in variants:
            if v.label not in timings:
                continue
            spec = {"model": rows[v.label]["model"], "batch": t.batch, "seq_len": t.seq_len,
                    "threads": s.threads, "seed": s.seed,  # the timed steps' autocast, measured alike
                    "autocast": None if autocast is None else str(autocast).removeprefix("torch.")}
            rows[v.label]["memory"].update(rss_in_subprocess(spec))
    return {"config": asdict(t), "autocast": None if autocast is None else str(autocast).removeprefix("torch."),
            "tokens_per_step": tokens, "peak_bf16_flops": peak, "rows": rows, "_timings": timings}


def _release(device: torch.device) -> None:
    """Free what dropped objects held, on the host and in the CUDA caching allocator."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _step_memory(cfg: ModelConfig, pe: str, t: TrainSettings, seed: int, device: torch.device,
                 autocast: torch.dtype | None) -> dict[str, Any]:
    """Memory of one training step of a freshly built variant, alone on the device, after one
    warm step (AdamW state allocated, as in steady training)."""
    step = TrainStep(cfg, t.batch, t.seq_len, device, autocast, t.lr, seed)
    step()
    params = list(step.model.parameters())
    mem: dict[str, Any] = {"saved_activation_bytes": saved_tensor_bytes(step.loss, exclude=params)}
    if pe in ("tape", "rope"):  # explains TAPE's memory gap tensor by tensor
        mem["saved_by_tensor"] = saved_tensors_by_shape(step.loss, exclude=params)
    if device.type == "cuda":
        mem.update(cuda_peaks(step, device))  # the step's added peak, and in all
    del step, params
    _release(device)
    return mem


def _memory_keys(row: dict[str, Any]) -> list[str]:
    return [k for k in ("saved_activation_bytes", "rss_step_peak_bytes", "cuda_peak_bytes", "cuda_total_peak_bytes")
            if isinstance(row.get("memory", {}).get(k), (int, float))]


def _add_ratios(section: dict[str, Any], ref: str = "rope") -> None:
    """Per row: time, FLOP and memory ratios against RoPE's row of the same section."""
    rows, timings = section["rows"], section.pop("_timings")
    if ref not in rows or ref not in timings:
        return
    r = rows[ref]
    for label, row in rows.items():
        if label not in timings:
            row["vs_rope"] = {"flops": _ratio(row["flops"], r["flops"])}
            continue
        row["vs_rope"] = {
            "time": row["time_s"]["median_s"] / r["time_s"]["median_s"],
            "time_min": row["time_s"]["min_s"] / r["time_s"]["min_s"],  # least disturbed calls
            "time_paired": paired_ratio(timings[label], timings[ref]),
            "cpu_time_paired": paired_ratio(timings[label], timings[ref], cpu=True),
            "flops": _ratio(row["flops"], r["flops"]),
            "memory": {k: _ratio(row["memory"][k], r["memory"].get(k)) for k in _memory_keys(row)},
        }


def _saved_gap(tape_row: dict[str, Any], rope_row: dict[str, Any]) -> dict[str, int]:
    """Saved-for-backward bytes by "shape dtype", TAPE minus RoPE (non-zero entries, largest first)."""
    a = tape_row.get("memory", {}).get("saved_by_tensor", {})
    b = rope_row.get("memory", {}).get("saved_by_tensor", {})
    gap = {k: a.get(k, {}).get("bytes", 0) - b.get(k, {}).get("bytes", 0) for k in set(a) | set(b)}
    return dict(sorted(((k, d) for k, d in gap.items() if d), key=lambda kv: -abs(kv[1])))


def _tape_summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per TAPE variant its ratios to RoPE, the FLOP lower bound, and the paper's ratios."""
    out: dict[str, Any] = {}
    for section in ("attention_op", "train_step"):
        rows = result[section]["rows"]
        tapes = {k.removeprefix("tape_"): r for k, r in rows.items() if r["pe"] == "tape"}
        if not tapes or "rope" not in rows:
            continue
        entry: dict[str, Any] = {name: r.get("vs_rope", {}) | ({"not_run": r["not_run"]} if "not_run" in r else {})
                                 for name, r in tapes.items()}
        # The least work exact TAPE needs: one QKᵀ for V and E (the smallest TAPE count).
        entry["flop_lower_bound"] = min(r["vs_rope"]["flops"] for r in tapes.values())
        if section == "train_step":
            entry["saved_by_tensor_minus_rope"] = {
                name: _saved_gap(r, rows["rope"]) for name, r in tapes.items() if "not_run" not in r}
        out[section] = entry
    p = paper_number("efficiency.table4.values")
    out["paper_table4"] = {"fused": p["tape_fused"]["time_s"] / p["rope"]["time_s"],
                           "unfused": p["tape_unfused"]["time_s"] / p["rope"]["time_s"]}
    return out


def run_benchmark(settings: BenchSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Counts, timings, memory and ratios for every variant, as one JSON-ready dict."""
    device = _device(settings.device)
    if settings.threads:
        torch.set_num_threads(int(settings.threads))
    op_dtype, autocast = _dtypes(settings, device)
    variants = make_variants(settings.pes, settings.tape_modes)
    load_start = _load_average()
    result: dict[str, Any] = {
        "settings": asdict(settings),
        "machine": machine_info(device),
        "versions": library_versions(),
        "variants": [asdict(v) for v in variants],
        "table3": _table3(variants, settings, log),
    }
    result["attention_op"] = _op_bench(variants, settings, device, op_dtype, log)
    gc.collect()
    result["train_step"] = _train_bench(variants, settings, device, autocast, log)
    for section in ("attention_op", "train_step"):
        _add_ratios(result[section])
    result["tape_vs_rope"] = _tape_summary(result)
    result["machine"]["load_average_1min"] = {"start": load_start, "end": _load_average()}
    result["paper"] = {"table3": paper_number("efficiency.table3.values"),
                       "table4": paper_number("efficiency.table4.values")}
    return result
