# Stage 5: the decision. The recommend checkpoint decides from the configured servers' cells and
# derives `<server>__recommended` servers, which are then measured on the same grid; `decide` then
# decides everything once, from every cell, and writes it as records (verdicts, the recommendations
# with their verification, attribution, k sweeps, the analysis record); the summary renders those
# records (summary.md, tables, plots) and decides nothing.


checkpoint recommend:
    input:
        cells=lambda wildcards: configured_cells("json"),
        requests=lambda wildcards: configured_cells("requests.parquet"),
        launches=lambda wildcards: launches_through(DESIGN.max),
        rounds=lambda wildcards: round_plans() if DESIGN.sequential else [],
        stepcost="results/stepcost/stepcost.json",
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
        " --stepcost {input.stepcost} --out {output.servers} --recommendations {output.recommendations}"
        " --k-schedules {output.k_schedules} --adaptive-dir {output.adaptive} > {log} 2>&1"


rule decide:
    input:
        cells=summary_cells,
        requests=summary_requests,
        launches=summary_launches,
        matches=expand("results/prompts/{suite}.match.json", suite=SUITES),
        derived="results/recommend/servers.json",
        recommendations="results/recommend/recommendations.json",
        traffic="results/prompts/traffic.json",
        rounds=lambda wildcards: round_plans() if DESIGN.sequential else [],
    output:
        **DECIDED,
        provenance=prov(*DECIDED.values()),
    log:
        "results/logs/decide.log",
    conda:
        "../../envs/specmatch.yaml"
    params:
        baseline=CFG["baseline"],
        settings=analysis_settings(),
        servers=to_json(CFG["servers"]),
        suites=RECOMMEND_SUITES,
        out_dir=lambda wildcards, output: os.path.dirname(output.verdicts),
        rounds=lambda wildcards, input: (
            f"--rounds {' '.join(input.rounds)}" if input.rounds else ""
        ),
    shell:
        "python -m specmatch decide --baseline {params.baseline} --settings {params.settings:q}"
        " --servers {params.servers:q} --cells {input.cells} --requests {input.requests}"
        " --launches {input.launches} --matches {input.matches} --suites {params.suites}"
        " --recommendations {input.recommendations} --derived {input.derived} --traffic {input.traffic}"
        " {params.rounds} --out-dir {params.out_dir} > {log} 2>&1"


rule summary:
    input:
        **DECIDED,
        cells=summary_cells,
        map_cells=lambda wildcards: map_cells("json"),
        matches=expand("results/prompts/{suite}.match.json", suite=SUITES),
        rounds=lambda wildcards: round_plans() if DESIGN.sequential else [],
        stepcost="results/stepcost/stepcost.json",
    output:
        md=report(
            "results/summary/summary.md",
            caption="../report/summary.rst",
            category="4. Verdict",
        ),
        html=report(
            "results/summary/report.html",
            caption="../report/page.rst",
            category="4. Verdict",
        ),
        table="results/summary/cells.csv",
        parquet="results/summary/cells.parquet",
        speedups="results/summary/speedups.csv",
        plots=report(
            directory("results/summary/plots"),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="3. Plots",
        ),
        provenance=prov(
            "results/summary/summary.md",
            "results/summary/report.html",
            "results/summary/cells.csv",
            "results/summary/cells.parquet",
            "results/summary/speedups.csv",
        ),
    log:
        "results/logs/summary.log",
    conda:
        "../../envs/specmatch.yaml"
    params:
        decided=lambda wildcards, input: os.path.dirname(input.verdicts),
        out_dir=lambda wildcards, output: os.path.dirname(output.md),
        rounds=lambda wildcards, input: (
            f"--rounds {' '.join(input.rounds)}" if input.rounds else ""
        ),
        map_cells=lambda wildcards, input: (
            f"--map-cells {' '.join(input.map_cells)}" if input.map_cells else ""
        ),
    shell:
        "python -m specmatch summary --decided {params.decided} --cells {input.cells} {params.map_cells}"
        " --matches {input.matches} {params.rounds} --stepcost {input.stepcost}"
        " --out-dir {params.out_dir} > {log} 2>&1"
