# specmatch: does speculative decoding pay off on your traffic, at your load?
# training data -> inspect -> prompt suites -+
# server configs -> launch records ----------+-> cells (server x suite x concurrency) -> summary
#                                                 (rounds: another repeat where still undecided)
from snakemake.utils import min_version

min_version("9.0")


# The embedded default, unless the user names their own config (`--configfile my.yaml` replaces it
# whole, so none of the demo servers or suites leak into a real run; `--config k=v` edits it).
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/regenerate.smk"
include: "workflow/rules/inspect.smk"
include: "workflow/rules/prompts.smk"
include: "workflow/rules/traffic.smk"
include: "workflow/rules/servers.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/rounds.smk"
include: "workflow/rules/summary.smk"


rule all:
    default_target: True
    input:
        all_targets(),


onsuccess:
    stop_servers()


onerror:
    stop_servers()
