# Stage 3: one launch record per server configuration and repeat: each repeat measures a fresh server
# session. The server itself is kept running by the server manager (workflow/specmatch/serving/server.py)
# for the cells that follow; see DESIGN "Server lifecycle". It writes its log to this rule's log.


rule launch:
    input:
        models=server_model_inputs,
    output:
        launch=LAUNCH,
        provenance=prov(LAUNCH),
    log:
        "results/servers/{server}/r{repeat}/server.log",
    wildcard_constraints:
        repeat=r"\d+",
    priority: server_priority
    # one server session per cluster allocation (profiles/slurm): the launch and its session's cells
    group:
        "session_{server}_r{repeat}"
    conda:
        launch_env
    # every core: a server starts only when nothing else runs, so everything upstream (which has
    # priority) is done before the first server starts, and no job slows a start-up down
    threads: whole_machine
    resources:
        serving_slot=1,
        gpu=server_gpus,
        runtime=session_runtime,
    params:
        server=server_json,
        max_batch=launch_max_batch,
    shell:
        "python -m specmatch launch --name {wildcards.server} --server {params.server:q} --repeat {wildcards.repeat}"
        " --max-batch {params.max_batch} --out {output.launch} --log {log}"
