"""tape-repro: TAPE (contextualized equivariant positional encoding) and its baselines.

The library is pure PyTorch: ``tape.model`` holds the decoder, ``tape.pe`` the positional
encodings. Hydra, Lightning and W&B live only in ``pipelines/`` and ``tape.lightning``.
"""

__version__ = "0.1.0"
