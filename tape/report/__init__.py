"""Rendering results: heatmaps (and later tables with the paper's reference numbers)."""
