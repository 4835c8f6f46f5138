"""Throughput dry runs of the paper presets: random weights, synthetic tokens of each preset's
shape, ``steps`` timed training steps after ``warmup`` untimed ones; per preset the step time,
tokens/s, peak memory and the projected hours of its full step count
(``python -m pipelines.gpu_check throughput``, a step of ``make gpu-check``).

- The DecoderLM presets (``conf/experiment/*/paper*.yaml`` but context extension), with pe=tape:
  one call is one micro-batch (``micro_batch_shape``: task.batch_size x task.seq_len tokens, or a
  generated task's widest real batch) (forward, loss, backward, AdamW: tape.bench.TrainStep)
  under bf16 autocast; an optimizer step is
  trainer.accumulate_grad_batches calls (an upper bound: AdamW runs once per call here), and
  ``hours`` is trainer.max_steps of them in one process (the DDP presets, pretrain and scrolls,
  run this in each of their processes).
- Context extension: Llama-2-7B's layer shape with random weights, ``layers`` of its 32 layers,
  each recipe applied as the task applies it (frozen weights in model.frozen_dtype, trainable ones
  fp32, gradient checkpointing), one row of extend.context tokens a call; the step time is
  projected to 32 layers linearly (an upper bound: the embedding and the head are counted 32 /
  layers times), extend.grad_accum calls an optimizer step, extend.steps steps; the peak adds
  what a layer adds, measured as the peak's difference between ``layers`` and ``layers // 2``
  layers (weights, gradients, AdamW state and the activations gradient checkpointing keeps).
"""

from __future__ import annotations

import gc
import json
from typing import Any, Callable, Sequence

import torch
from omegaconf import DictConfig

from pipelines.gpu_check import _peak_gib, _reset_peak
from pipelines.hydra_conf import CONF_DIR

# Keys pipelines.train fills from elsewhere: scrolls adopts its pretraining run's model (the
# 155M of pretrain/paper, Llama-2 tokenizer); the A5 word problem has 60 elements + <pad>, <bos>.
FILLED = {"scrolls/paper": ("model=paper155m", "task.vocab_size=32000"),
          "word_problem/paper": ("task.vocab_size=62",)}
LLAMA_2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_heads=32, num_kv_heads=32)
LLAMA_2_7B_LAYERS = 32
EXTENSION = "context_extension/paper"
RECIPES = ("tape", "lora", "longlora")


def paper_presets() -> list[str]:
    return sorted(f"{p.parent.name}/{p.stem}" for p in (CONF_DIR / "experiment").glob("*/paper*.yaml"))


def compose_preset(preset: str, overrides: Sequence[str] = ()) -> DictConfig:
    from pipelines.preflight import compose_or_none

    cfg = compose_or_none("config", [f"experiment={preset}", *overrides])
    if cfg is None:
        raise ValueError(f"experiment={preset} {' '.join(overrides)} does not compose")
    return cfg


def _time(step: Any, device: str, steps: int, warmup: int) -> float:
    from tape.bench.timing import time_interleaved

    return time_interleaved({"step": step}, warmup, steps, torch.device(device))["step"].median_s


def _row(call_s: float, tokens: int, calls_per_step: int, max_steps: int, peak_gib: float) -> dict[str, float]:
    step_s = call_s * calls_per_step
    return {"step_s": step_s, "tokens_per_s": tokens / call_s, "peak_gib": peak_gib,
            "hours": step_s * max_steps / 3600, "steps": max_steps, "tokens_per_step": tokens * calls_per_step}


GENERATED_TASKS = ("addition", "word_problem", "flipflop")
"""Tasks whose batches are generated here (no data to fetch) and padded to their longest row."""


def micro_batch_shape(cfg: DictConfig, batches: int = 20) -> tuple[int, int]:
    """(rows, tokens a row) of the preset's training micro-batches: task.batch_size x
    task.seq_len, or for a generated task the widest of its first ``batches`` real batches (an
    addition batch is padded to its longest sum, 64 tokens at 20 digits, not to seq_len 80)."""
    if cfg.task.name not in GENERATED_TASKS:
        return int(cfg.task.batch_size), int(cfg.task.seq_len)
    from pipelines import tasks

    datamodule = tasks.get(cfg.task.name).datamodule(cfg)
    datamodule.setup("fit")
    loader = iter(datamodule.train_dataloader())
    shapes = [tuple(next(loader)["input_ids"].shape) for _ in range(batches)]
    return shapes[0][0], max(width for _, width in shapes)


def decoder_preset(preset: str, device: str, steps: int, warmup: int,
                   overrides: Sequence[str] = ()) -> dict[str, float]:
    """One DecoderLM preset (pe=tape): see the module's doc."""
    from pipelines.models import model_config
    from tape.bench.train_step import TrainStep

    cfg = compose_preset(preset, ("pe=tape", *FILLED.get(preset, ()), *overrides))
    batch, seq = micro_batch_shape(cfg)
    bf16 = "bf16" in str(cfg.trainer.precision)  # the preset's autocast, on a CPU too
    _reset_peak(device)
    step = TrainStep(model_config(cfg), batch, seq, torch.device(device), autocast=torch.bfloat16 if bf16 else None)
    call_s = _time(step, device, steps, warmup)
    return _row(call_s, batch * seq, int(cfg.trainer.get("accumulate_grad_batches") or 1),
                int(cfg.trainer.max_steps), _peak_gib(device))


def extension_recipe(recipe_name: str, device: str, steps: int, warmup: int, layers: int = 8,
                     shape: dict | None = None, overrides: Sequence[str] = ()) -> dict[str, float]:
    """One context-extension recipe at Llama-2-7B's layer shape: see the module's doc."""
    cfg = compose_preset(EXTENSION, overrides)
    x = cfg.extend
    _reset_peak(device)
    step, trainable = _extension_step(cfg, recipe_name, device, layers, shape or LLAMA_2_7B)
    call_s = _time(step, device, steps, warmup)
    peak = _peak_gib(device)
    del step
    half = layers // 2
    if half >= 1:  # what a layer adds to the peak, measured: weights, optimizer state, activations
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        _reset_peak(device)
        step, _ = _extension_step(cfg, recipe_name, device, half, shape or LLAMA_2_7B)
        for _ in range(warmup + 1):
            step()
        per_layer = (peak - _peak_gib(device)) / (layers - half)
        del step
    else:
        per_layer = float("nan")
    scale = LLAMA_2_7B_LAYERS / layers
    row = _row(call_s * scale, int(x.batch_size) * int(x.context), int(x.grad_accum), int(x.steps),
               peak + (LLAMA_2_7B_LAYERS - layers) * per_layer)
    row.update(measured_layers=layers, measured_call_s=call_s, measured_peak_gib=peak, peak_gib_per_layer=per_layer,
               trainable_params=trainable)
    return row


def _extension_step(cfg: DictConfig, recipe_name: str, device: str, layers: int,
                    shape: dict) -> tuple[Callable[[], None], int]:
    """A training call (forward, loss, backward, AdamW) of the recipe on ``layers`` layers of
    ``shape``, built as the task builds it, and its trainable parameter count."""
    from pipelines.tasks.context_extension.checks import recipe_spec
    from pipelines.tasks.context_extension.stages import set_dtypes
    from tape.hf.io import build_llama, enable_checkpointing
    from tape.hf.loss import split_losses
    from tape.hf.recipes import apply_recipe
    from tape.hf_names import DTYPES

    x, frozen = cfg.extend, DTYPES[cfg.model.frozen_dtype]
    recipe, options = recipe_spec(cfg, recipe_name)
    with torch.device(device):
        model = build_llama(**shape, num_layers=layers, context=int(cfg.model.context)).to(frozen)
        torch.manual_seed(0)
        model = apply_recipe(model, recipe, target_context=int(x.context), original_context=int(cfg.model.context),
                             **options)
    if x.gradient_checkpointing:
        enable_checkpointing(model)
    model = set_dtypes(model.to(device).train(), frozen)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=float(x.lr))
    ids = torch.randint(0, shape["vocab_size"], (int(x.batch_size), int(x.context)),
                        generator=torch.Generator().manual_seed(0)).to(device)
    bf16 = "bf16" in str(cfg.trainer.precision)  # the preset's autocast, on a CPU too

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, use_cache=False).logits
        split_losses(logits, ids, None)["text"].backward()
        optimizer.step()

    return step, sum(p.numel() for p in trainable)


def throughput(device: str = "cuda", steps: int = 10, warmup: int = 2, presets: Sequence[str] | None = None,
               recipes: Sequence[str] = RECIPES, layers: int = 8, llama: dict | None = None,
               decoder_overrides: Sequence[str] = (), extension_overrides: Sequence[str] = (),
               echo: bool = False) -> dict[str, dict[str, float]]:
    """Every paper preset (or ``presets``), context extension once per recipe
    (``context_extension/paper:<recipe>``). With ``echo``, prints the numbers so far as one JSON
    line after each preset, so a window cut off keeps what ran."""
    out: dict[str, dict[str, float]] = {}
    for preset in presets or paper_presets():
        if preset == EXTENSION:
            for recipe in recipes:
                out[f"{preset}:{recipe}"] = extension_recipe(recipe, device, steps, warmup, layers, llama,
                                                             extension_overrides)
                _echo(out, echo)
                gc.collect()  # the recipe's model is gone: give its memory back before the next
                if device == "cuda":
                    torch.cuda.empty_cache()
        else:
            out[preset] = decoder_preset(preset, device, steps, warmup, decoder_overrides)
            _echo(out, echo)
    return out


def _echo(out: dict[str, dict[str, float]], echo: bool) -> None:
    if echo:
        print(json.dumps({k: {m: None if v != v else float(f"{v:.3g}") for m, v in row.items()}  # NaN: no GPU
                          for k, row in out.items()}), flush=True)
