"""The scripts of benchmarks/, each at its smallest: they run, and measure what
they say they measure.
"""
