# Stage 1: the training data, described whole (every source, every file, every skipped row), and the
# cut table: one row per assistant turn of every row, which prompt extraction samples from.


rule demo_data:
    input:
        tokenizer=tokenizer_input(),
    output:
        directory(CFG["dataset"]["root"])
        if CFG["demo"].get("enabled")
        else "results/.demo_disabled",
    log:
        "results/logs/demo_data.log",
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    params:
        rows=to_json(CFG["demo"].get("rows_per_source", {})),
        tokenizer=dataset_tokenizer,
    shell:
        "python -m specmatch demo --tokenizer {params.tokenizer:q} --rows {params.rows:q} --out {output} > {log} 2>&1"


rule inspect:
    input:
        data=training_inputs(),
        tokenizer=tokenizer_input(),
    output:
        manifest="results/inspect/manifest.json",
        cuts="results/inspect/cuts.parquet",
        report=report(
            "results/inspect/report.md",
            caption="../report/inspect.rst",
            category="1. Training data",
        ),
        chart=report(
            "results/inspect/mix.png",
            caption="../report/mix.rst",
            category="1. Training data",
        ),
        provenance=prov(
            "results/inspect/manifest.json",
            "results/inspect/cuts.parquet",
            "results/inspect/report.md",
            "results/inspect/mix.png",
        ),
    log:
        "results/logs/inspect.log",
    benchmark:
        "results/benchmarks/inspect.tsv"
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    threads: whole_machine
    params:
        root=dataset_root,
        tokenizer=dataset_tokenizer,
        holdout=holdout_json,
        max_malformed=CFG["dataset"]["max_malformed_fraction"],
    shell:
        "python -m specmatch inspect --root {params.root:q} --tokenizer {params.tokenizer:q}"
        " --holdout {params.holdout:q} --max-malformed-fraction {params.max_malformed} --workers {threads}"
        " --out {output.manifest} --cuts {output.cuts} --report {output.report} --chart {output.chart}"
        " > {log} 2>&1"
