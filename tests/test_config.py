import copy

import pytest
import yaml

from conftest import REPO
from specmatch.config import load, validate
from specmatch.files import SpecmatchError


def base():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_shipped_config_is_valid_and_gets_defaults():
    cfg = load(REPO / "config.yaml")
    assert cfg["baseline"] == "baseline"
    assert cfg["servers"]["ngram"]["host"] == "127.0.0.1"
    assert cfg["servers"]["ngram"]["startup_timeout_s"] == 1200
    assert cfg["suites"]["train_mix"]["turn"] == "last"
    assert cfg["requests"]["request_rate"] is None
    assert cfg["requests"]["passes"] == 1 and cfg["repeats"] >= 2
    assert cfg["summary"]["min_effect"] == 0.05 and cfg["summary"]["verify_recommendation"] is True


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["servers"]["ngram"]["speculative"].update(method="magic"), "servers.ngram.speculative.method"),
    (lambda c: c.update(concurrency=[0]), "concurrency.0"),
    (lambda c: c.update(baseline="nope"), "baseline: 'nope' is not a server"),
    (lambda c: c["servers"]["baseline"].update(speculative={"method": "ngram"}), "the baseline must not speculate"),
    (lambda c: c["servers"]["eagle3"]["speculative"].pop("model"), "servers.eagle3.speculative.model"),
    (lambda c: c["servers"].update(ext={"engine": "external"}), "servers.ext.base_url"),
    (lambda c: c["servers"].update(ext={"engine": "external", "base_url": "10.0.0.5:8000"}), "servers.ext.base_url"),
    (lambda c: c["suites"]["generic"].pop("path"), "suites.generic.path"),
    (lambda c: c.update(typo_key=1), "Additional properties are not allowed ('typo_key'"),
    (lambda c: c["requests"].update(temperature="hot"), "requests.temperature"),
    (lambda c: c["suites"]["generic"].update(size=4), "suites.generic.size: 4 prompts x 1 pass(es) cannot keep concurrency 16 busy"),
    (lambda c: c["summary"].update(recommend_metric="goodput"), "goodput needs summary.slo"),
    (lambda c: c["summary"].update(recommend_suites=["nope"]), "summary.recommend_suites: 'nope' is not a suite"),
    (lambda c: c["servers"].update(x__recommended={"engine": "vllm", "model": "m"}), "the workflow's own"),
    (lambda c: c.update(repeats=0), "repeats"),
    (lambda c: c["servers"]["ngram"].update(suites=["nope"]), "servers.ngram.suites: 'nope' is not a suite"),
    (lambda c: c["servers"]["baseline"].update(suites=["generic"]), "servers.baseline.suites: the baseline is compared"),
    (lambda c: c["servers"]["ngram"].update(suites=[]), "servers.ngram.suites"),
])
def test_bad_config_names_the_key(mutate, message):
    cfg = copy.deepcopy(base())
    mutate(cfg)
    with pytest.raises(SpecmatchError) as e:
        validate(cfg, "my.yaml")
    assert message in str(e.value)
    assert "my.yaml" in str(e.value)


def test_shipped_example_configs_validate_and_build():
    from specmatch.engines import get_engine

    for f in sorted((REPO / "resources" / "configs").glob("*.yaml")):
        cfg = load(f)
        for name, srv in cfg["servers"].items():
            if srv["engine"] == "sglang":
                srv = {**srv, "sglang_version": "0.5.23"}  # planned here, where SGLang is not installed
            plan = get_engine(srv).launch_plan(port=30000, max_batch=max(cfg["concurrency"]))
            assert plan.argv and plan.host == "127.0.0.1", (f.name, name)
            if srv["engine"] == "sglang":
                assert plan.argv[plan.argv.index("--max-running-requests") + 1] == "256"
