"""A full training step (forward, loss, backward, AdamW) of a DecoderLM on fixed random tokens."""

from __future__ import annotations

import contextlib

import torch

from tape.bench.flops import lm_loss
from tape.model import DecoderLM, ModelConfig
from tape.model.compiling import compile_model as compile_model_for_training


class TrainStep:
    """Callable: one optimizer step. fp32 weights; ``autocast`` (e.g. bf16 on CUDA) for compute."""

    def __init__(
        self,
        cfg: ModelConfig,
        batch: int,
        seq_len: int,
        device: torch.device,
        autocast: torch.dtype | None = None,
        lr: float = 1e-4,
        seed: int = 0,
        compile_model: bool = False,
        compile_mode: str = "default",
    ) -> None:
        torch.manual_seed(seed)
        self.device, self.autocast = device, autocast
        self.model = DecoderLM(cfg).to(device).train()
        # CUDA graphs (reduce-overhead) replay a step's launches at once; they run on CUDA only
        self.cuda_graphs = compile_model and compile_mode == "reduce-overhead" and device.type == "cuda"
        if compile_model:  # torch.compile: fused elementwise kernels, far fewer launches per step
            self.model = compile_model_for_training(self.model, compile_mode)
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen).to(device)  # (B, N)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def loss(self) -> torch.Tensor:
        """Forward pass and loss only (the memory probe wraps this)."""
        with self._autocast():
            return lm_loss(self.model, self.ids)

    def __call__(self) -> None:
        if self.cuda_graphs:  # a new step: the graphs may reuse the last step's output memory
            torch.compiler.cudagraph_mark_step_begin()
        loss = self.loss()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # no gradients stay resident between steps
