"""The command line (uffdkvm/cli/), one file per command, and its exit status
and live progress.
"""
