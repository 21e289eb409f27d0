# Stage 5a: the step-cost map. From every cell of the configured servers and the map's own cells
# (config `step_cost`: more concurrencies on one suite, some held out to check the map), what a
# speculative step costs at every batch size and context against the baseline's plain step, the
# acceptance a drafter needs there, and every suite's speedup predicted up to the largest batch.


rule stepcost:
    input:
        cells=lambda wildcards: configured_cells("json") + map_cells("json"),
        requests=lambda wildcards: configured_cells("requests.parquet")
        + map_cells("requests.parquet"),
        launches=lambda wildcards: launches_through(DESIGN.max),
        traffic="results/prompts/traffic.json",
    output:
        stepcost="results/stepcost/stepcost.json",
        provenance=prov("results/stepcost/stepcost.json"),
    log:
        "results/logs/stepcost.log",
    conda:
        "../../envs/specmatch.yaml"
    params:
        baseline=CFG["baseline"],
        settings=analysis_settings(),
        servers=to_json(CFG["servers"]),
        suites=RECOMMEND_SUITES,
        step_cost=to_json(CFG["step_cost"]),
    shell:
        "python -m specmatch stepcost --baseline {params.baseline} --settings {params.settings:q}"
        " --servers {params.servers:q} --cells {input.cells} --requests {input.requests}"
        " --launches {input.launches} --suites {params.suites} --step-cost {params.step_cost:q}"
        " --traffic {input.traffic}"
        " --out {output.stepcost} > {log} 2>&1"
