"""Child Python processes that import the uffdkvm under test.

A child started with ``cwd="/"`` (so that a source tree without a built
extension cannot shadow the package) imports whatever uffdkvm is installed,
which need not be the one these tests import (a worktree, an in-place
build). ``ENV`` puts the parent's own package first on the child's path.
"""
import os

import uffdkvm

# The directory that holds the uffdkvm package this process imported.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(uffdkvm.__file__)))

ENV = {**os.environ,
       "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT,
                                                    os.environ.get("PYTHONPATH")]))}
