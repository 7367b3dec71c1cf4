"""python -m uffdkvm: the same as the uffdkvm command."""
import sys

from .cli import main

sys.exit(main())
