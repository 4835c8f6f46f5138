"""Refuse a training length no device here can hold, before any directory is claimed.

The check compares a floor, not an estimate: the bytes one training step must at least keep
(each layer's residual stream, four tensors of B x N x d_model, or with gradient checkpointing
each block's input and one block's four during its recompute; the logits and their gradient, and
the B x H x N x N bias that bias encodings materialise) with the memory of the device that
trains (of every process, for DDP on a CPU). A config under the floor may still run out of
memory; one over it cannot run at all.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipelines.errors import PipelineConfigError

GIB = 2**30
HALF_PRECISIONS = ("bf16-mixed", "16-mixed", "bf16", "16", "bf16-true", "16-true")


class Step(NamedTuple):
    """What sets the memory of one training step."""

    batch: int
    seq_len: int
    d_model: int
    n_layers: int
    n_heads: int
    vocab_size: int
    bias_pe: bool  # the encoding adds a materialised (B, H, N, N) float32 bias
    half: bool  # activations in 16 bits (mixed precision)
    checkpointing: bool = False  # model.gradient_checkpointing: blocks recomputed in backward


def step_floor_bytes(s: Step) -> int:
    """Bytes one training step cannot do without (see the module docstring)."""
    width = 2 if s.half else 4
    tokens = s.batch * s.seq_len
    kept = s.n_layers + 4 if s.checkpointing else 4 * s.n_layers  # (B, N, C) tensors kept
    residual = kept * tokens * s.d_model * width
    logits = 2 * tokens * s.vocab_size * width  # logits and their gradient, (B, N, V)
    bias = s.batch * s.n_heads * s.seq_len**2 * 4 if s.bias_pe else 0  # one layer's (B, H, N, N)
    return residual + logits + bias


def device_bytes(accelerator: str) -> tuple[int, str, bool]:
    """Total memory of the training device, its description, and whether it is a GPU (``auto``: a
    GPU where there is one, as Lightning picks)."""
    if accelerator in ("gpu", "cuda", "auto"):
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return props.total_memory, f"{props.name} has {props.total_memory / GIB:.0f} GiB", True
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram, f"this machine has {ram / GIB:.0f} GiB of RAM", False


def training_step(cfg: DictConfig) -> Step | None:
    """The step a train config asks for; None when the config has no single training length."""
    seq_len, batch = OmegaConf.select(cfg, "task.seq_len"), OmegaConf.select(cfg, "task.batch_size")
    model = cfg.get("model")
    if not isinstance(seq_len, int) or not isinstance(batch, int) or model is None:
        return None
    import tape.pe as pe_registry

    try:
        dims = [int(model[k]) for k in ("d_model", "n_layers", "n_heads", "vocab_size")]
    except (KeyError, TypeError, ValueError, OmegaConfBaseException):
        return None
    pe_name = OmegaConf.select(cfg, "pe.name")
    bias_pe = pe_name in pe_registry.names() and pe_registry.get(pe_name).materialises_bias
    precision = str(OmegaConf.select(cfg, "trainer.precision", default="32-true"))
    return Step(batch, seq_len, *dims, bias_pe=bias_pe, half=precision in HALF_PRECISIONS,
                checkpointing=OmegaConf.select(cfg, "model.gradient_checkpointing", default=False) is True)


def check_fits(cfg: DictConfig) -> None:
    """Refuse ``task.seq_len`` / ``task.batch_size`` whose training step exceeds the device."""
    step = training_step(cfg)
    if step is None or step.seq_len < 1 or step.batch < 1:
        return
    have, device, gpu = device_bytes(str(OmegaConf.select(cfg, "trainer.accelerator", default="cpu")))
    devices = OmegaConf.select(cfg, "trainer.devices", default=1)
    processes = devices if not gpu and isinstance(devices, int) and devices > 1 else 1  # DDP on a CPU: one RAM
    need = processes * step_floor_bytes(step)
    if need > have:
        each = f" ({need / processes / GIB:.1f} GiB in each of {processes} processes)" if processes > 1 else ""
        raise PipelineConfigError(
            f"task.seq_len={step.seq_len} with task.batch_size={step.batch} needs at least "
            f"{need / GIB:.1f} GiB for one training step{each} (a floor: activations of "
            f"{step.n_layers} layers of width {step.d_model} and the logits"
            f"{', plus the attention bias' if step.bias_pe else ''}), but {device}; "
            "lower task.seq_len or task.batch_size"
            + ("" if step.checkpointing else ", or set model.gradient_checkpointing=true")
        )
