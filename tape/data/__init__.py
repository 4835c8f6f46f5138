"""Task data: generators, tokenizers and batch builders (pure PyTorch/NumPy, no Lightning)."""
