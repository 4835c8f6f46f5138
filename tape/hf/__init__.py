"""TAPE for pretrained Hugging Face Llama models and the PEFT recipes it is compared with.

Importing this package registers ``TapeLlamaConfig`` / ``TapeLlamaForCausalLM`` with
transformers' Auto classes, so ``AutoModelForCausalLM.from_pretrained`` reloads saved TAPE models.
"""

from tape.hf.llama import TapeLlamaConfig, TapeLlamaForCausalLM, add_tape, register_auto_classes, switch_off_maps

register_auto_classes()

__all__ = ["TapeLlamaConfig", "TapeLlamaForCausalLM", "add_tape", "switch_off_maps"]
