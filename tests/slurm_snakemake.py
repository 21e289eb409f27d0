"""Snakemake as tests/test_slurm.py runs it: the SLURM executor plugin as installed and the profile as
users copy it, with one change, the plugin's pause between two looks at the queue. The plugin waits 10
s more after every look in which no job ended (up to 3 minutes), so on the one-node test cluster an
allocation that ended was seen up to a minute late, every time; here the pause stays at most
MAX_POLL_S. The jobs, their allocations and what the plugin submits are the same.

    python tests/slurm_snakemake.py <snakemake arguments>
"""
import sys

import snakemake_executor_plugin_slurm as plugin
from snakemake.cli import main

MAX_POLL_S = 2

_pause = plugin.Executor.next_seconds_between_status_checks   # the executor interface's property
plugin.Executor.next_seconds_between_status_checks = property(
    _pause.fget, lambda self, seconds: _pause.fset(self, min(seconds, MAX_POLL_S)))

if __name__ == "__main__":
    sys.exit(main())
