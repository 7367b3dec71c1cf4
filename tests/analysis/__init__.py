"""uffdkvm/analysis/: sweep() and the spread helpers (medians, intervals, ratios)."""
