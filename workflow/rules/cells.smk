# Stage 4: one benchmark cell per (server, suite, concurrency). Each cell holds the serving slot,
# so no two cells load the machine at once, and cells of one server run back to back (priority).


rule cell:
    input:
        prompts="results/prompts/{suite}.jsonl",
        launch="results/servers/{server}/launch.json",
    output:
        cell="results/cells/{server}/{suite}/c{concurrency}.json",
        requests="results/cells/{server}/{suite}/c{concurrency}.requests.parquet",
    log:
        "results/logs/cells/{server}/{suite}/c{concurrency}.log",
    wildcard_constraints:
        concurrency=r"\d+",
    priority: server_priority
    group:
        "server_{server}"
    conda:
        "../../envs/specmatch.yaml"
    resources:
        serving_slot=1,
    params:
        server=server_json,
        requests=requests_json,
        max_concurrency=launch_concurrency_param,
    shell:
        "python -m specmatch.cell --name {wildcards.server} --server {params.server:q} --suite {wildcards.suite}"
        " --prompts {input.prompts} --concurrency {wildcards.concurrency}"
        " --max-concurrency {params.max_concurrency} --requests {params.requests:q}"
        " --launch {input.launch} --out {output.cell} --requests-out {output.requests}"
        " --log results/servers/{wildcards.server}/server.log > {log} 2>&1"
