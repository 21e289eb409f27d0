# Stage 1: the training data, described whole (every source, every file, every skipped row).


rule demo_data:
    input:
        tokenizer=tokenizer_input(),
    output:
        directory(CFG["dataset"]["root"])
        if CFG["demo"].get("enabled")
        else "results/.demo_disabled",
    log:
        "results/logs/demo_data.log",
    conda:
        "../../envs/specmatch.yaml"
    params:
        rows=to_json(CFG["demo"].get("rows_per_source", {})),
        tokenizer=dataset_tokenizer,
    shell:
        "python -m specmatch.demo --tokenizer {params.tokenizer:q} --rows {params.rows:q} --out {output} > {log} 2>&1"


rule inspect:
    input:
        data=training_inputs(),
        tokenizer=tokenizer_input(),
    output:
        manifest="results/inspect/manifest.json",
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
    log:
        "results/logs/inspect.log",
    benchmark:
        "results/benchmarks/inspect.tsv"
    conda:
        "../../envs/specmatch.yaml"
    params:
        root=dataset_root,
        tokenizer=dataset_tokenizer,
        max_malformed=CFG["dataset"]["max_malformed_fraction"],
    shell:
        "python -m specmatch.inspect --root {params.root:q} --tokenizer {params.tokenizer:q}"
        " --max-malformed-fraction {params.max_malformed}"
        " --out {output.manifest} --report {output.report} > {log} 2>&1"
