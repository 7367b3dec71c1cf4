"""Many runs and what they say together (internal; the public names are
re-exported by uffdkvm): sweeps over a grid of configs (sweep.py), and
medians, intervals and ratios between them (spread.py)."""
