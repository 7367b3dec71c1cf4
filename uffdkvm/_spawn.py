"""How uffdkvm starts a Python child of its own (the page server, say).

``python -m module`` and ``python -c code`` put the child's working
directory first on ``sys.path``. Run from a clone of this repository's root
(or from any directory that holds a ``uffdkvm/`` folder), such a child
imports that folder instead of the installed package, and fails on the
missing extension ("cannot import name '_core' from partially initialized
module 'uffdkvm'"), or worse, runs code that is not the package the parent
imported. So every child this package starts goes through
:func:`python_command`, which keeps the working directory off the child's
path, and :func:`child_env`, which puts the parent's own uffdkvm first on
it:

- Python 3.11 and later: ``-P`` (safe path), which adds neither the working
  directory nor a script's directory to ``sys.path``.
- Python 3.10 has no ``-P``: the child runs a one-line bootstrap with ``-c``
  that removes ``-c``'s working-directory entry (``''``) from ``sys.path``
  before it imports anything else, then runs the module (``runpy``, as
  ``-m`` would, with ``sys.argv`` as ``-m`` sets it) or the code.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# The directory that holds the uffdkvm package this process imported (site-
# packages, or a source tree with an in-place build).
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)

HAVE_SAFE_PATH = sys.version_info >= (3, 11)

# Run by `python -c` on 3.10: drop the working directory ('' leads sys.path
# under -c), then take the module or code from argv[1], leaving argv as the
# child expects it (-m: argv[0] becomes the module's file; -c: '-c').
_BOOT_MODULE = ("import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; import runpy; "
                "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")
_BOOT_CODE = ("import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "
              "exec(compile(sys.argv.pop(1), '<string>', 'exec'))")


def python_command(*, module: str | None = None, code: str | None = None,
                   args: Sequence[str] = (), flags: Sequence[str] = (),
                   safe_path: bool | None = None) -> list[str]:
    """The argv that runs this interpreter on `module` (as ``-m``) or `code`
    (as ``-c``) with `args`, never importing from its working directory.
    `flags` go to the interpreter (``-S``, ``-X faulthandler``); `safe_path`
    (default: where the interpreter has it) picks ``-P`` or the bootstrap,
    for the tests of both."""
    assert (module is None) != (code is None), "one of module= or code="
    if safe_path is None:
        safe_path = HAVE_SAFE_PATH
    if module is not None:
        option, what, boot = "-m", module, _BOOT_MODULE
    else:
        assert code is not None
        option, what, boot = "-c", code, _BOOT_CODE
    if safe_path:
        return [sys.executable, *flags, "-P", option, what, *args]
    return [sys.executable, *flags, "-c", boot, what, *args]


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) with the uffdkvm this
    process imported first on PYTHONPATH, so that the child imports the
    same one wherever it was installed."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT,
                                         *filter(None, [env.get("PYTHONPATH")])])
    return env
