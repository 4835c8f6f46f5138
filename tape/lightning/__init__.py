"""Lightning wrappers around the pure-PyTorch library: modules, data modules, callbacks."""

from tape.lightning.callbacks import TokensPerSecond
from tape.lightning.datamodule import (
    AdditionDataModule, FineTuneDataModule, IndexedBatchDataModule, TextDataModule,
)
from tape.lightning.hf_module import HFCausalLMModule
from tape.lightning.module import CausalLMModule

__all__ = ["AdditionDataModule", "CausalLMModule", "FineTuneDataModule", "HFCausalLMModule",
           "IndexedBatchDataModule", "TextDataModule", "TokensPerSecond"]
