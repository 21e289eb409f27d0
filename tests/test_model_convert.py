"""The embedded model's conversion parses its GGUF once (transformers would parse it for the config,
the weights and the tokenizer), and puts gguf's own functions back afterwards."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from specmatch.training.model import gguf_parsed_once  # noqa: E402


def tiny_gguf(path):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_each_file_is_parsed_once_inside_and_gguf_is_restored_after(tmp_path):
    a, b = tiny_gguf(tmp_path / "a.gguf"), tiny_gguf(tmp_path / "b.gguf")
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once():
        r1 = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is r1  # the same file by another spelling: one parse
        assert gguf.GGUFReader(b) is not r1
        assert [t.name for t in r1.tensors] == ["token_embd.weight"]
        assert r1.tensors[0].data.reshape(-1).tolist() == list(range(12))
        arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "llama")
        m = gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 2) is m
        assert m.get_name("model.embed_tokens") == "token_embd"
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(a) is not r1


def test_gguf_is_restored_when_the_conversion_fails():
    reader = gguf.GGUFReader
    with pytest.raises(RuntimeError):
        with gguf_parsed_once():
            raise RuntimeError("conversion failed")
    assert gguf.GGUFReader is reader
