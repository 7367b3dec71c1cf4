#!/usr/bin/env python3
"""The one command that regenerates every file made from the schemas:

    python tools/gen_schema.py --write     # rewrite every stale generated file
    python tools/gen_schema.py --check     # exit 1 naming any stale one

From uffdkvm/schema/fields.py (the config): csrc/config_schema.h and the marked
sections of uffdkvm/config.py, uffdkvm/_core.pyi and docs/config.md. From
uffdkvm/schema/results.py (the results, through tools/gen_results.py):
csrc/result_schema.h and the marked sections of uffdkvm/result.py and
docs/results.md. From uffdkvm/schema/faults.py (the test-only fault
injections, through tools/gen_faults.py): csrc/testhooks.h and the INJECT_
constants of uffdkvm/_core.pyi. tests/project/test_schema.py fails while any of
them is stale.

It loads the schemas by their paths, not through the uffdkvm package (whose
__init__ imports the built extension), so it runs before any build.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module


schema = _load("uffdkvm_schema", ROOT / "uffdkvm" / "schema" / "fields.py")
schema_results = _load("uffdkvm_schema_results", ROOT / "uffdkvm" / "schema" / "results.py")
gen_results = _load("uffdkvm_gen_results", ROOT / "tools" / "gen_results.py")
schema_faults = _load("uffdkvm_schema_faults", ROOT / "uffdkvm" / "schema" / "faults.py")
gen_faults = _load("uffdkvm_gen_faults", ROOT / "tools" / "gen_faults.py")
COMMAND = schema.COMMAND


def generated(root: Path = ROOT) -> dict[str, str]:
    """Every generated file's path (from root) and the text it should hold."""
    out = {**schema.generated(root), **gen_results.generated(schema_results, root, COMMAND)}
    # The faults' constants share _core.pyi with the config's: spliced into its text.
    return {**out, **gen_faults.generated(schema_faults, root, COMMAND, out, gen_results.banner)}


def stale(root: Path = ROOT) -> list[str]:
    """The generated files whose checked-in text differs from the schemas'."""
    return [path for path, text in generated(root).items()
            if not (root / path).exists() or
            (root / path).read_text(encoding="utf-8") != text]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        for path, text in generated().items():
            p = ROOT / path
            if not p.exists() or p.read_text(encoding="utf-8") != text:
                p.write_text(text, encoding="utf-8")
                print(f"wrote {path}")
        return 0
    if argv == ["--check"]:
        bad = stale()
        for path in bad:
            print(f"{path} is stale: run {COMMAND}", file=sys.stderr)
        return 1 if bad else 0
    print("usage: python tools/gen_schema.py --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
