# Stage 2b: the traffic profiles (config `traffic`, and the training mix), resolved against the sources
# inspection found: a profile naming a source that does not exist fails here, right after inspection,
# not after the measurements. The summary predicts each profile from the per-source cells; a profile
# with `verify: true` is also measured, by its derived suite `traffic_<profile>` (an ordinary suite,
# prompts.smk and cells.smk).


rule traffic_profiles:
    input:
        manifest="results/inspect/manifest.json",
    output:
        profiles="results/prompts/traffic.json",
        provenance=prov("results/prompts/traffic.json"),
    log:
        "results/logs/traffic.log",
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    params:
        config=traffic_step_config(CFG),
    shell:
        "python -m specmatch traffic --config {params.config:q} --manifest {input.manifest}"
        " --out {output.profiles} > {log} 2>&1"
