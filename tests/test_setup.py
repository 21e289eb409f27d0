"""scripts/uv-sources.py: pip's package sources handed to uv (scripts/setup.sh installs with uv,
which reads neither pip.conf nor PIP_* variables). The parsing and the flags are tested on given
values, so the machine's own pip config cannot leak in."""
from __future__ import annotations

import importlib.util

from builders import REPO

spec = importlib.util.spec_from_file_location("uv_sources", REPO / "scripts" / "uv-sources.py")
uv_sources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_sources)


def test_pip_config_list_is_read_as_pip_install_reads_it():
    # `pip config list` prints values as Python literals: a multi-line value keeps its "\\n"s
    listing = ("global.extra-index-url='\\nhttps://a.example/simple\\nhttps://b.example/simple'\n"
               "global.index-url='https://global.example/simple'\n"
               "install.index-url='https://install.example/simple'\n"
               ":env:.find-links='/opt/wheels'\n")
    conf = uv_sources.parse_config(listing)
    assert conf["extra-index-url"].split() == ["https://a.example/simple", "https://b.example/simple"]
    assert conf["index-url"] == "https://install.example/simple"      # install.* over global.*
    assert "find-links" not in conf                                     # the environment's, read from env


def test_sources_become_uv_flags_leaving_out_local_ones_that_do_not_exist(tmp_path):
    wheels, spaced = tmp_path / "wheels", tmp_path / "w 2"
    wheels.mkdir()
    spaced.mkdir()
    conf = {"index-url": "https://mirror.example/simple",
            "extra-index-url": f"file://{tmp_path}/missing https://download.pytorch.org/whl/cpu "
                               f"file://{str(spaced).replace(' ', '%20')}",
            "find-links": f"{wheels} {tmp_path}/nowhere", "constraint": f"{tmp_path}/nope.txt"}
    assert uv_sources.uv_flags({}, conf) == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "https://download.pytorch.org/whl/cpu",
        "--extra-index-url", f"file://{str(spaced).replace(' ', '%20')}",
        "--find-links", str(wheels)]


def test_a_pip_variable_wins_over_the_config_and_no_index_goes_along(tmp_path):
    cons = tmp_path / "constraints.txt"
    cons.write_text("torch<=2.14.1\n")
    conf = {"extra-index-url": "https://a.example/simple", "constraint": str(cons)}
    assert uv_sources.uv_flags({"PIP_EXTRA_INDEX_URL": "https://b.example/simple", "PIP_NO_INDEX": "1"}, conf) == [
        "--extra-index-url", "https://b.example/simple", "--constraint", str(cons), "--no-index"]
    assert uv_sources.uv_flags({}, {}) == []
