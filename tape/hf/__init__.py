"""TAPE for pretrained Hugging Face Llama models and the PEFT recipes it is compared with."""

from tape.hf.llama import TapeLlamaForCausalLM, add_tape

__all__ = ["TapeLlamaForCausalLM", "add_tape"]
