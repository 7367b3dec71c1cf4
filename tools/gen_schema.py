#!/usr/bin/env python3
"""Writes (--write) or checks (--check) every file generated from
uffdkvm/schema.py: csrc/config_schema.h, the marked sections of
uffdkvm/config.py, uffdkvm/_core.pyi and docs/config.md.

It loads schema.py by its path, not through the uffdkvm package (whose
__init__ imports the built extension), so it runs before any build.
"""
import importlib.util
import sys
from pathlib import Path

path = Path(__file__).resolve().parent.parent / "uffdkvm" / "schema.py"
spec = importlib.util.spec_from_file_location("uffdkvm_schema", path)
schema = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = schema  # dataclasses looks its module up
spec.loader.exec_module(schema)
sys.exit(schema.main(sys.argv[1:]))
