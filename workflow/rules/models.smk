# Models the embedded default builds itself: nothing comes from a model hub.


rule embedded_model:
    output:
        directory(
            CFG["models"].get("embedded", {}).get("path", "results/models/embedded")
        ),
    log:
        "results/logs/models/embedded.log",
    conda:
        "../../envs/specmatch.yaml"
    shell:
        "python -m specmatch.model embedded --out {output} > {log} 2>&1"


rule draft_model:
    input:
        target=draft_target,
    output:
        directory("results/models/{draft}"),
    log:
        "results/logs/models/{draft}.log",
    wildcard_constraints:
        draft="|".join(CFG["models"].get("drafts", {})) or "__none__",
    conda:
        "../../envs/specmatch.yaml"
    params:
        layers=draft_layers,
    shell:
        "python -m specmatch.model draft --target {input.target} --layers {params.layers} --out {output} > {log} 2>&1"
