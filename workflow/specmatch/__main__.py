"""`python -m specmatch <step> ...`: the one entry point of every workflow step (specmatch.cli)."""
import sys

from .cli import main

sys.exit(main())
