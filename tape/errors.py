"""Errors shared by the model and the positional encodings (a module neither side imports from)."""


class ConfigError(ValueError):
    """A ModelConfig field has a value that cannot work; the message names the field and the fix."""
