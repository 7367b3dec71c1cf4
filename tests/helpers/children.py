"""Child Python processes that import the uffdkvm under test.

Every test that starts a Python child builds its command here, the way
uffdkvm starts its own (uffdkvm._spawn): ``python -m`` and ``python -c``
would put the child's working directory first on its path, and the tests
run from the repository's root, whose ``uffdkvm/`` has no built extension
(or from anywhere a stray ``uffdkvm/`` may sit). So::

    subprocess.run(python("arg", code=CHILD), env=ENV, ...)
    subprocess.run(uffdkvm_command("-b", "1M"), env=ENV, ...)

``ENV`` puts the parent's own package first on the child's path: the
installed uffdkvm need not be the one these tests import (a worktree, an
in-place build). No working directory is needed for either; a test may
still pick one.
"""
from uffdkvm._spawn import PACKAGE_PARENT, child_env, python_command

# The directory that holds the uffdkvm package this process imported.
PACKAGE_ROOT = PACKAGE_PARENT

ENV = child_env()


def python(*args, module=None, code=None, flags=()):
    """This interpreter on `module` (as -m) or `code` (as -c) with `args`,
    never importing from its working directory; `flags` go to the
    interpreter (-S, say)."""
    return python_command(module=module, code=code, args=[str(a) for a in args],
                          flags=flags)


def uffdkvm_command(*args):
    """The command line, ``python -m uffdkvm`` made safe."""
    return python(*args, module="uffdkvm")
