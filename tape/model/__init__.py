"""The decoder LM and its configuration."""

from tape.model.cache import KVCache
from tape.model.config import ConfigError, ModelConfig
from tape.model.decoder import DecoderLM, DecoderOutput

__all__ = ["ConfigError", "DecoderLM", "DecoderOutput", "KVCache", "ModelConfig"]
