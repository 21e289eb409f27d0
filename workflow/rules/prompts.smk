# Stage 2: prompt suites. Training suites follow the mix; control suites come from prompt files.


rule prompts:
    input:
        unpack(suite_inputs),
    output:
        prompts="results/prompts/{suite}.jsonl",
        match="results/prompts/{suite}.match.json",
        match_md=report(
            "results/prompts/{suite}.match.md",
            caption="../report/match.rst",
            category="2. Prompt suites",
            labels={"suite": "{suite}"},
        ),
    log:
        "results/logs/prompts/{suite}.log",
    conda:
        "../../envs/specmatch.yaml"
    params:
        spec=suite_json,
        holdout=holdout_json,
        tokenizer=dataset_tokenizer,
    shell:
        "python -m specmatch.prompts --suite {wildcards.suite} --spec {params.spec:q}"
        " --holdout {params.holdout:q} --manifest {input.manifest} --tokenizer {params.tokenizer:q}"
        " --out {output.prompts} --match {output.match} --match-md {output.match_md} > {log} 2>&1"
