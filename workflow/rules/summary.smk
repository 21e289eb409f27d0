# Stage 5: one tidy table over all cells, speedups with intervals, the crossover, the verdict.


rule summary:
    input:
        cells=cell_files("json"),
        requests=cell_files("requests.parquet"),
        matches=expand("results/prompts/{suite}.match.json", suite=SUITES),
        launches=expand("results/servers/{server}/launch.json", server=SERVERS),
    output:
        md=report(
            "results/summary/summary.md",
            caption="../report/summary.rst",
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
    log:
        "results/logs/summary.log",
    conda:
        "../../envs/specmatch.yaml"
    params:
        baseline=CFG["baseline"],
        settings=to_json(CFG["summary"]),
    shell:
        "python -m specmatch.summary --baseline {params.baseline} --settings {params.settings:q}"
        " --cells {input.cells} --matches {input.matches} --out-dir results/summary > {log} 2>&1"
