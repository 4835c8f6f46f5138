"""Evaluation metrics (arithmetic grid; later SCROLLS and perplexity)."""
