"""What every number means (docs/measurements.md), checked against a record the
statistics did not make: the fault trace, numpy on raw samples, /proc, the
guest's own stamps. The fault's timeline and the online statistics.

callcount.c is test_effects_stats.py's LD_PRELOAD counter of clock reads and
allocations.
"""
