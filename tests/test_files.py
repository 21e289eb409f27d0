"""Atomic folders: a model, a drafter or a data root is either whole or absent (or the old one)."""
import pytest

from specmatch.files import atomic_dir


def test_a_folder_appears_whole_and_replaces_the_old_one(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "stale").write_text("old")
    with atomic_dir(out) as tmp:
        assert tmp.name == ".model.partial" and not any(tmp.iterdir())
        (tmp / "config.json").write_text("{}")
        assert (out / "stale").exists()  # the old folder stays until the block succeeds
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_failed_block_leaves_the_old_folder_and_no_partial(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("old")
    (tmp_path / ".model.partial").mkdir()  # left by a killed run
    (tmp_path / ".model.partial" / "junk").write_text("x")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            assert not (tmp / "junk").exists()
            (tmp / "config.json").write_text("new")
            raise RuntimeError("killed half-way")
    assert (out / "config.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
