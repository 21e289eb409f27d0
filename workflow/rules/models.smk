# Models the embedded default builds itself: nothing comes from a model hub.


rule embedded_tokenizer:
    output:
        directory(
            CFG["models"]
            .get("embedded", {})
            .get("tokenizer_path", "results/models/embedded-tokenizer")
        ),
    log:
        "results/logs/models/embedded_tokenizer.log",
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    shell:
        "python -m specmatch model tokenizer --out {output} > {log} 2>&1"


rule embedded_model:
    input:
        # the tokenizer folder when the config names one: converted once, the data steps need not wait
        # for the weights (they run beside this rule)
        tokenizer=embedded_tokenizer_input(),
    output:
        directory(
            CFG["models"].get("embedded", {}).get("path", "results/models/embedded")
        ),
    log:
        "results/logs/models/embedded.log",
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    params:
        tokenizer=lambda wildcards, input: (
            ["--tokenizer", input.tokenizer] if input.tokenizer else []
        ),
    shell:
        "python -m specmatch model embedded --out {output} {params.tokenizer:q} > {log} 2>&1"


rule draft_model:
    input:
        target=draft_target,
    output:
        directory("results/models/{draft}"),
    log:
        "results/logs/models/{draft}.log",
    wildcard_constraints:
        draft="|".join(CFG["models"].get("drafts", {})) or "__none__",
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    params:
        layers=draft_layers,
    shell:
        "python -m specmatch model draft --target {input.target} --layers {params.layers} --out {output} > {log} 2>&1"


rule train_drafter:
    input:
        target=drafter_target,
        manifest="results/inspect/manifest.json",
        cuts="results/inspect/cuts.parquet",
        tokenizer=tokenizer_input(),
        # the target's own answers for the seen rows, when models.eagle3.<name>.regenerate is on
        regenerated=drafter_regenerated,
    output:
        model=directory("results/models/{drafter}"),
        provenance=prov("results/models/{drafter}"),
    log:
        "results/logs/models/{drafter}.log",
    benchmark:
        "results/benchmarks/train_drafter/{drafter}.tsv"
    wildcard_constraints:
        drafter="|".join(CFG["models"].get("eagle3", {})) or "__none__",
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    threads: whole_machine
    params:
        budget=drafter_budget,
        aux=drafter_args,  # --aux-layers, --regenerated
        tokenizer=dataset_tokenizer,
    shell:
        "python -m specmatch drafter --target {input.target} --manifest {input.manifest} --cuts {input.cuts}"
        " --tokenizer {params.tokenizer:q} --budget {params.budget:q} {params.aux} --out {output.model}"
        " > {log} 2>&1"
