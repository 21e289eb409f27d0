# The target's own answers for a drafter's seen training rows (SpecForge's regenerate_train_data
# recipe): only when `models.eagle3.<name>.regenerate` is on; train_drafter then reads these rows in
# place of the originals, with the holdout of the original rows (the cut table's).


rule regenerate:
    input:
        target=drafter_target,
        manifest="results/inspect/manifest.json",
        cuts="results/inspect/cuts.parquet",
        tokenizer=tokenizer_input(),
    output:
        rows=directory("results/regenerate/{drafter}"),
        provenance=prov("results/regenerate/{drafter}"),
    log:
        "results/logs/regenerate/{drafter}.log",
    benchmark:
        "results/benchmarks/regenerate/{drafter}.tsv"
    wildcard_constraints:
        drafter="|".join(
            n for n in CFG["models"].get("eagle3", {}) if drafter_regenerate(n)
        )
        or "__none__",
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    threads: whole_machine
    params:
        settings=regenerate_settings,
        tokenizer=dataset_tokenizer,
    shell:
        "python -m specmatch regenerate --target {input.target} --manifest {input.manifest} --cuts {input.cuts}"
        " --tokenizer {params.tokenizer:q} --settings {params.settings:q} --out {output.rows}"
        " > {log} 2>&1"
