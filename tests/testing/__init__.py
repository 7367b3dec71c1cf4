"""uffdkvm/testing/: the A/B API (compare, assert_not_slower) and the pytest plugin."""
