"""`python -m specmatch <step> ...`: the one entry point of every workflow step (specmatch.cli)."""
import sys

from .ending import announce_termination

# before any step's imports: a step ended by SLURM while it loads says so in its log. The watchdog
# handles SIGTERM itself (it is how a server is stopped), so it is left alone.
if sys.argv[1:2] != ["watchdog"]:
    announce_termination(sys.argv[1] if len(sys.argv) > 1 else "specmatch")

from .cli import main  # noqa: E402

sys.exit(main())
