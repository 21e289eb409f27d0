# Stage 4: one benchmark cell per (server, suite, repeat, concurrency).
#
# One server at a time: every launch and cell holds the `serving_slot` resource, of which
# profiles/default provides one, so no two benchmarks (or a benchmark and a server start) overlap;
# this is the only mechanism. A cell also takes every core, so no other job (training, inspection)
# runs beside a measurement. Priorities order the cells repeat by repeat, servers interleaved
# (common.smk, server_priority). The group only packs a server session's jobs into one cluster
# allocation (profiles/slurm): its launch and its cells, or, when the launch is done, the cells
# a rerun adds (the profile's group-components joins them into one allocation, one server start).


rule cell:
    input:
        prompts="results/prompts/{suite}.jsonl",
        launch=LAUNCH,
    output:
        cell=CELL_JSON,
        requests=CELL_REQUESTS,
        provenance=prov(CELL_JSON, CELL_REQUESTS),
    log:
        cell="results/logs/cells/{server}/{suite}/r{repeat}/c{concurrency}.log",
        server="results/logs/cells/{server}/{suite}/r{repeat}/c{concurrency}.server.log",
    wildcard_constraints:
        concurrency=r"\d+",
        repeat=r"\d+",
    priority: server_priority
    group:
        "session_{server}_r{repeat}"
    conda:
        "../../envs/specmatch.yaml"
    threads: whole_machine
    resources:
        serving_slot=1,
        gpu=server_gpus,
        runtime=session_runtime,
    params:
        server=server_json,
        requests=requests_json,
        max_batch=launch_max_batch,
    shell:
        "python -m specmatch cell --name {wildcards.server} --server {params.server:q} --suite {wildcards.suite}"
        " --prompts {input.prompts} --concurrency {wildcards.concurrency} --repeat {wildcards.repeat}"
        " --max-batch {params.max_batch} --requests {params.requests:q}"
        " --launch {input.launch} --out {output.cell} --requests-out {output.requests}"
        " --server-log {log.server} > {log.cell} 2>&1"
