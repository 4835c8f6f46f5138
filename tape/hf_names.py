"""The names the Hugging Face track's configs accept (recipes, weight dtypes), importable
without transformers: configs are checked before ``tape.hf`` loads it."""

from __future__ import annotations

import torch

RECIPES = ("tape", "lora", "longlora", "theta", "embed_norm")  # tape.hf.recipes.apply_recipe
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # config name -> dtype
