"""Nothing lost, leaked or crashed (docs/robustness.md): pages under stress,
many runs in one process, far more threads than cores, random and hostile
Configs, every failure the core can meet mid-run, and interruption.
"""
