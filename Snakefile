# specmatch: does speculative decoding pay off on your traffic, at your load?
#
# training data (demo_data) -> inspect (cut table) -> prompts (suites) ---------------------+
#                                   +-> traffic_profiles (traffic.smk: mixes; a verified one -> prompts)
#                                   |                                                      |
# models (embedded target, drafts) -+-> regenerate -> train_drafter (EAGLE-3 head)         |
#   |                                                   |                                  v
#   +---------------------------------------------------+-> launch (server sessions) -> cells
#                                                            (server x suite x repeat x concurrency)
# cells -> sequential_round (rounds.smk: another repeat where still undecided) -> cells
# cells -> recommend (checkpoint: what to deploy; <server>__recommended, measured as cells too)
#       -> decide (every decision once, written as records: verdicts, recommendations, attribution,
#          k sweeps, analysis, your traffic, context, stopping) -> summary (renders the records)
# The step behind each rule: python -m specmatch <step> (workflow/specmatch/cli.py; stages in
# workflow/specmatch/{data,training,serving,measuring,deciding,reporting,calibration}).
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
include: "workflow/rules/stepcost.smk"
include: "workflow/rules/summary.smk"


rule all:
    default_target: True
    input:
        all_targets(),


onsuccess:
    stop_servers()


onerror:
    stop_servers()
