# Models the embedded default builds itself: nothing comes from a model hub.


rule embedded_model:
    output:
        directory(CFG["models"].get("embedded", {}).get("path", "results/models/embedded")),
    log:
        "results/logs/models/embedded.log",
    conda:
        "../../envs/specmatch.yaml"
    shell:
        "{PY} -m specmatch.model embedded --out {output} > {log} 2>&1"


def draft_target(wildcards):
    return CFG["models"]["drafts"][wildcards.draft]["from"]


def draft_layers(wildcards):
    return CFG["models"]["drafts"][wildcards.draft]["layers"]


rule draft_model:
    input:
        target=draft_target,
    output:
        directory("results/models/{draft}"),
    params:
        layers=draft_layers,
    wildcard_constraints:
        draft="|".join(CFG["models"].get("drafts", {})) or "__none__",
    log:
        "results/logs/models/{draft}.log",
    conda:
        "../../envs/specmatch.yaml"
    shell:
        "{PY} -m specmatch.model draft --target {input.target} --layers {params.layers} --out {output} > {log} 2>&1"
