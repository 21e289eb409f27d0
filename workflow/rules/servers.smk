# Stage 3: one launch record per server configuration. The server itself is kept running by the
# server manager (workflow/specmatch/server.py) for the cells that follow; see DESIGN "Server lifecycle".


rule launch:
    input:
        models=server_model_inputs,
    output:
        "results/servers/{server}/launch.json",
    params:
        server=server_json,
        max_concurrency=launch_concurrency_param,
    resources:
        serving_slot=1,
        gpu=server_gpus,
    priority: server_priority
    log:
        "results/servers/{server}/server.log",
    conda:
        "../../envs/vllm-cpu.yaml"
    shell:
        "{PY} -m specmatch.launch --name {wildcards.server} --server {params.server:q}"
        " --max-concurrency {params.max_concurrency} --out {output} --log {log}"
