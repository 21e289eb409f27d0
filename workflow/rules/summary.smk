# Stage 5: the decision. The recommend checkpoint decides from the configured servers' cells and
# derives `<server>__recommended` servers, which are then measured on the same grid; the summary
# renders verdicts, crossovers, recommendations and their verification.


checkpoint recommend:
    input:
        cells=lambda wildcards: configured_cells("json"),
        requests=lambda wildcards: configured_cells("requests.parquet"),
        launches=lambda wildcards: launches_through(DESIGN.max),
        rounds=lambda wildcards: round_plans() if DESIGN.sequential else [],
    output:
        servers="results/recommend/servers.json",
        recommendations="results/recommend/recommendations.json",
        k_schedules="results/recommend/k_schedules.json",
        adaptive=directory("results/recommend/adaptive"),
        provenance=prov(
            "results/recommend/servers.json",
            "results/recommend/recommendations.json",
            "results/recommend/k_schedules.json",
        ),
    log:
        "results/logs/recommend.log",
    conda:
        "../../envs/specmatch.yaml"
    params:
        baseline=CFG["baseline"],
        settings=analysis_settings(),
        servers=to_json(CFG["servers"]),
        suites=RECOMMEND_SUITES,
        verify="" if CFG["summary"]["verify_recommendation"] else "--no-verify",
        rounds=lambda wildcards, input: (
            f"--rounds {' '.join(input.rounds)}" if input.rounds else ""
        ),
    shell:
        "python -m specmatch recommend --baseline {params.baseline} --settings {params.settings:q}"
        " --servers {params.servers:q} --cells {input.cells} --requests {input.requests}"
        " --launches {input.launches} --suites {params.suites} {params.verify} {params.rounds}"
        " --out {output.servers} --recommendations {output.recommendations}"
        " --k-schedules {output.k_schedules} --adaptive-dir {output.adaptive} > {log} 2>&1"


rule summary:
    input:
        cells=summary_cells,
        requests=summary_requests,
        launches=summary_launches,
        matches=expand("results/prompts/{suite}.match.json", suite=SUITES),
        derived="results/recommend/servers.json",
        recommendations="results/recommend/recommendations.json",
        rounds=lambda wildcards: round_plans() if DESIGN.sequential else [],
    output:
        md=report(
            "results/summary/summary.md",
            caption="../report/summary.rst",
            category="4. Verdict",
        ),
        table="results/summary/cells.csv",
        parquet="results/summary/cells.parquet",
        speedups="results/summary/speedups.csv",
        verdicts="results/summary/verdicts.json",
        recommendations="results/summary/recommendations.json",
        attribution="results/summary/attribution.json",
        k_sweeps="results/summary/k_sweeps.json",
        plots=report(
            directory("results/summary/plots"),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="3. Plots",
        ),
        provenance=prov(
            "results/summary/summary.md",
            "results/summary/cells.csv",
            "results/summary/cells.parquet",
            "results/summary/speedups.csv",
            "results/summary/verdicts.json",
            "results/summary/recommendations.json",
            "results/summary/attribution.json",
            "results/summary/k_sweeps.json",
        ),
    log:
        "results/logs/summary.log",
    conda:
        "../../envs/specmatch.yaml"
    params:
        baseline=CFG["baseline"],
        settings=analysis_settings(),
        servers=to_json(CFG["servers"]),
        suites=RECOMMEND_SUITES,
        out_dir=lambda wildcards, output: os.path.dirname(output.md),
        rounds=lambda wildcards, input: (
            f"--rounds {' '.join(input.rounds)}" if input.rounds else ""
        ),
    shell:
        "python -m specmatch summary --baseline {params.baseline} --settings {params.settings:q}"
        " --servers {params.servers:q} --cells {input.cells} --requests {input.requests}"
        " --launches {input.launches} --matches {input.matches} --suites {params.suites}"
        " --recommendations {input.recommendations} --derived {input.derived}"
        " {params.rounds} --out-dir {params.out_dir} > {log} 2>&1"
