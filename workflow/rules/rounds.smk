# Stage 4b (sequential design, `repeats: {min, max}`): after round R, decide which configurations
# get repeat R+1. Every cell is measured `min` times (cells.smk); each round's plan
# (records.RoundPlan) lists the cells of the next repeat: the servers whose verdict on
# summary.recommend_metric is still inconclusive and that another repeat can narrow, and the
# baseline there. Only those servers are launched again (fresh sessions); finished cells never rerun.


checkpoint sequential_round:
    input:
        cells=lambda wildcards: cells_through(int(wildcards.round), "json"),
        requests=lambda wildcards: cells_through(
            int(wildcards.round), "requests.parquet"
        ),
        launches=lambda wildcards: launches_through(int(wildcards.round)),
        # the earlier rounds' plans: the configurations they stopped keep their verdicts
        rounds=lambda wildcards: round_plans(int(wildcards.round)),
    output:
        plan="results/rounds/r{round}.json",
        provenance=prov("results/rounds/r{round}.json"),
    log:
        "results/logs/rounds/r{round}.log",
    wildcard_constraints:
        round=r"\d+",
    conda:
        "../../envs/specmatch.yaml"
    params:
        baseline=CFG["baseline"],
        settings=analysis_settings(),
        servers=to_json(CFG["servers"]),
        # the k sweeps' undecided choices are planned on the suites their k is decided on
        suites=RECOMMEND_SUITES,
        rounds=lambda wildcards, input: (
            f"--rounds {' '.join(input.rounds)}" if input.rounds else ""
        ),
    shell:
        "python -m specmatch rounds --round {wildcards.round} --baseline {params.baseline}"
        " --settings {params.settings:q} --servers {params.servers:q} --cells {input.cells}"
        " --requests {input.requests} --launches {input.launches} --suites {params.suites}"
        " --out {output.plan} {params.rounds} > {log} 2>&1"
