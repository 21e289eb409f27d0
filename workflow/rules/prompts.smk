# Stage 2: prompt suites. Training suites sample the cut table across the whole mix and read back only
# the rows they chose; control suites come from prompt files.


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
        provenance=prov(
            "results/prompts/{suite}.jsonl",
            "results/prompts/{suite}.match.json",
            "results/prompts/{suite}.match.md",
        ),
    log:
        "results/logs/prompts/{suite}.log",
    priority: UPSTREAM
    conda:
        "../../envs/specmatch.yaml"
    params:
        spec=suite_json,
        tokenizer=dataset_tokenizer,
        endpoint=CFG["requests"]["endpoint"],
        cuts=suite_cuts_arg,
    shell:
        "python -m specmatch prompts --suite {wildcards.suite} --spec {params.spec:q}"
        " --manifest {input.manifest} {params.cuts} --tokenizer {params.tokenizer:q}"
        " --endpoint {params.endpoint} --out {output.prompts} --match {output.match}"
        " --match-md {output.match_md} > {log} 2>&1"
