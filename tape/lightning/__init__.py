"""Lightning wrappers around the pure-PyTorch library: modules, data modules, callbacks."""

from tape.lightning.callbacks import TokensPerSecond
from tape.lightning.datamodule import (
    AdditionDataModule, FineTuneDataModule, TextDataModule,
)
from tape.lightning.module import CausalLMModule

__all__ = ["AdditionDataModule", "FineTuneDataModule", "CausalLMModule", "TextDataModule", "TokensPerSecond"]
