"""Tests of scripts/llm8_checkpoint.py, scripts/convert_hf.py and the committed reference fixtures.

Needs numpy, safetensors, ml_dtypes and pytest; the HF load test runs only where torch and
transformers are installed.
"""
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
sys.path.insert(0, SCRIPTS)
import convert_hf  # noqa: E402
import llm8_checkpoint as ckpt  # noqa: E402

REF_MODEL = os.path.join(ROOT, "dev", "reference", "llama_ref_model.bin")
REF_STATE = os.path.join(ROOT, "dev", "reference", "llama_ref_state.bin")
SMALL = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 48, "vocab_size": 64,
         "max_seq_len": 16, "norm_eps": 1e-5, "rope_theta": 10000.0}


def readme_param_count(c):
    """P from docs/formats.md's parameter table, written out independently of llm8_checkpoint."""
    C, L, V, F = c["dim"], c["n_layers"], c["vocab_size"], c["ffn_dim"]
    kvc = c["n_kv_heads"] * (C // c["n_heads"])
    return V * C + L * C + L * (C + 2 * kvc) * C + L * C * C + L * C + L * 2 * F * C + L * C * F + C + V * C


def random_tensors(config, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in ckpt.param_shapes(config).items()}


def random_hf(config, seed=0):
    return ckpt.to_hf(random_tensors(config, seed), config)


def assert_same_tensors(a, b):
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype == np.float32, name
        assert a[name].shape == b[name].shape, name
        assert np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)), name


def test_param_count_matches_readme():
    assert ckpt.num_parameters(SMALL) == readme_param_count(SMALL)
    assert list(ckpt.param_shapes(SMALL)) == list(ckpt.PARAM_NAMES)


def test_write_read_round_trip(tmp_path):
    path = str(tmp_path / "model.bin")
    tensors = random_tensors(SMALL)
    ckpt.write_model(path, SMALL, tensors)
    assert not os.path.exists(path + ".tmp")
    assert os.path.getsize(path) == 1024 + 4 * readme_param_count(SMALL)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[0] == 20251129 and header[1] == 1 and header[11] == 0
    assert list(header[2:9]) == [32, 2, 4, 2, 48, 64, 16]
    assert header[9] == np.float32(1e-5).view(np.int32) and header[10] == np.float32(1e4).view(np.int32)
    assert not header[12:].any()
    config, back = ckpt.read_model(path)
    assert config == {**SMALL, "norm_eps": float(np.float32(1e-5))}
    assert_same_tensors(tensors, back)
    # parameters follow the header in docs/formats.md's order, flat
    flat = np.fromfile(path, dtype="<f4", offset=1024)
    assert np.array_equal(flat, np.concatenate([tensors[n].ravel() for n in ckpt.PARAM_NAMES]))


def test_write_rejects_wrong_shape(tmp_path):
    tensors = random_tensors(SMALL)
    tensors["wqkv"] = tensors["wqkv"][:, :-1]
    with pytest.raises(ValueError, match="wqkv"):
        ckpt.write_model(str(tmp_path / "m.bin"), SMALL, tensors)


def test_truncated_file_rejected(tmp_path):
    path = str(tmp_path / "model.bin")
    ckpt.write_model(path, SMALL, random_tensors(SMALL))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 4)
    with pytest.raises(ValueError) as e:
        ckpt.read_model(path)
    assert path in str(e.value) and "truncated" in str(e.value)
    assert f"expected {size} bytes, found {size - 4}" in str(e.value)
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="truncated"):
        ckpt.read_model(path)


def test_trailing_bytes_rejected(tmp_path):
    path = str(tmp_path / "model.bin")
    ckpt.write_model(path, SMALL, random_tensors(SMALL))
    with open(path, "ab") as f:
        f.write(b"\0" * 4)
    with pytest.raises(ValueError, match="trailing"):
        ckpt.read_model(path)


@pytest.mark.parametrize("word, value, what", [(0, 20240520, "magic"), (1, 2, "version"), (11, 1, "dtype")])
def test_bad_header_rejected(tmp_path, word, value, what):
    path = str(tmp_path / "model.bin")
    ckpt.write_model(path, SMALL, random_tensors(SMALL))
    with open(path, "r+b") as f:
        f.seek(4 * word)
        f.write(np.int32(value).tobytes())
    with pytest.raises(ValueError) as e:
        ckpt.read_model(path)
    assert path in str(e.value) and what in str(e.value)


def test_from_hf_to_hf_round_trip():
    hf = random_hf(SMALL, seed=1)
    ours = ckpt.from_hf(hf, SMALL)
    C, F, kvc = 32, 48, 16
    assert np.array_equal(ours["wqkv"][1, :C], hf["model.layers.1.self_attn.q_proj.weight"])
    assert np.array_equal(ours["wqkv"][1, C:C + kvc], hf["model.layers.1.self_attn.k_proj.weight"])
    assert np.array_equal(ours["wqkv"][0, C + kvc:], hf["model.layers.0.self_attn.v_proj.weight"])
    assert np.array_equal(ours["w13"][0, :F], hf["model.layers.0.mlp.gate_proj.weight"])
    assert np.array_equal(ours["w13"][1, F:], hf["model.layers.1.mlp.up_proj.weight"])
    assert np.array_equal(ours["ffn_norm"][1], hf["model.layers.1.post_attention_layernorm.weight"])
    back = ckpt.to_hf(ours, SMALL)
    assert sorted(back) == sorted(hf)
    for name in hf:
        assert np.array_equal(back[name], hf[name]), name
    del hf["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="up_proj"):
        ckpt.from_hf(hf, SMALL)


def run_cli(*args):
    result = subprocess.run([sys.executable, os.path.join(SCRIPTS, "convert_hf.py"), *args],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result


def test_export_then_import_is_bit_identical(tmp_path):
    src, hf_dir, out = str(tmp_path / "a.bin"), str(tmp_path / "hf"), str(tmp_path / "b.bin")
    tensors = random_tensors(SMALL, seed=2)
    ckpt.write_model(src, SMALL, tensors)
    run_cli("export", src, hf_dir)
    with open(os.path.join(hf_dir, "config.json")) as f:
        hf_config = json.load(f)
    assert hf_config["architectures"] == ["LlamaForCausalLM"] and hf_config["tie_word_embeddings"] is False
    assert hf_config["num_key_value_heads"] == 2 and hf_config["rms_norm_eps"] == 1e-5
    run_cli("import", hf_dir, out)
    config_a, a = ckpt.read_model(src)
    config_b, b = ckpt.read_model(out)
    assert config_a == config_b
    assert_same_tensors(a, b)
    with open(src, "rb") as fa, open(out, "rb") as fb:
        assert fa.read() == fb.read()


def test_import_sharded_bf16_and_fp16(tmp_path):
    hf = random_hf(SMALL, seed=3)
    names = sorted(hf)
    half = len(names) // 2
    # shard 1 in bf16, shard 2 in fp16, as HF writes sharded checkpoints
    shard1 = {n: hf[n].astype(ml_dtypes.bfloat16) for n in names[:half]}
    shard2 = {n: hf[n].astype(np.float16) for n in names[half:]}
    save_file(shard1, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(shard2, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {n: "model-00001-of-00002.safetensors" for n in shard1}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in shard2})
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    hf_config = convert_hf.config_to_hf(SMALL)
    del hf_config["rope_theta"]  # transformers 5.x keeps it only in rope_parameters
    with open(tmp_path / "config.json", "w") as f:
        json.dump(hf_config, f)
    out = str(tmp_path / "m.bin")
    assert convert_hf.main(["import", str(tmp_path), out]) == 0
    config, ours = ckpt.read_model(out)
    assert config["rope_theta"] == 10000.0
    expected = ckpt.from_hf({**{n: a.astype(np.float32) for n, a in shard1.items()},
                             **{n: a.astype(np.float32) for n, a in shard2.items()}}, SMALL)
    assert_same_tensors(expected, ours)
    # the bf16 values really are rounded (not the float32 originals)
    assert not np.array_equal(ours["tok_embeddings"], hf["model.embed_tokens.weight"])


def test_import_single_file_rejects_unsupported(tmp_path):
    hf = random_hf(SMALL, seed=4)
    save_file(hf, str(tmp_path / "model.safetensors"))
    hf_config = convert_hf.config_to_hf(SMALL)
    with open(tmp_path / "config.json", "w") as f:
        json.dump({**hf_config, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, f)
    assert convert_hf.main(["import", str(tmp_path / "model.safetensors"), str(tmp_path / "m.bin")]) == 1
    with open(tmp_path / "config.json", "w") as f:
        json.dump(hf_config, f)
    assert convert_hf.main(["import", str(tmp_path / "model.safetensors"), str(tmp_path / "m.bin")]) == 0
    assert_same_tensors(ckpt.from_hf(hf, SMALL), ckpt.read_model(str(tmp_path / "m.bin"))[1])


def read_reference_state():
    """(header, tokens, logits, loss, grads, losses) of the committed reference state."""
    header = np.fromfile(REF_STATE, dtype="<i4", count=256)
    B, T, S, P = (int(header[i]) for i in (2, 3, 4, 11))
    V = ckpt.read_model(REF_MODEL)[0]["vocab_size"]
    sizes = [B * (T + 1), B * T * V, 1, P, S]
    assert os.path.getsize(REF_STATE) == 1024 + 4 * sum(sizes)
    raw = np.fromfile(REF_STATE, dtype="<i4", offset=1024)
    parts, offset = [], 0
    for n in sizes:
        parts.append(raw[offset:offset + n])
        offset += n
    tokens = parts[0].reshape(B, T + 1)
    logits, loss, grads, losses = (p.view("<f4") for p in parts[1:])
    return header, tokens, logits.reshape(B, T, V), float(loss[0]), grads, losses


def test_reference_files_parse():
    config, tensors = ckpt.read_model(REF_MODEL)
    assert config == {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 176, "vocab_size": 256,
                      "max_seq_len": 64, "norm_eps": float(np.float32(1e-5)), "rope_theta": 10000.0}
    P = readme_param_count(config)
    assert os.path.getsize(REF_MODEL) == 1024 + 4 * P
    header, tokens, logits, loss, grads, losses = read_reference_state()
    assert header[0] == 20251201 and header[1] == 1 and int(header[11]) == P
    B, T, S = (int(header[i]) for i in (2, 3, 4))
    assert (B, T) == (2, 16) and S >= 2 and T <= config["max_seq_len"]
    hyper = header[5:11].view("<f4")
    assert np.array_equal(hyper, np.array([1e-3, 0.1, 0.9, 0.95, 1e-8, 1.0], dtype=np.float32))
    assert not header[12:].any()
    assert tokens.min() >= 0 and tokens.max() < config["vocab_size"]
    assert np.isfinite(logits).all() and np.isfinite(grads).all() and np.isfinite(losses).all()
    assert abs(loss - np.log(config["vocab_size"])) < 0.5  # small init: near uniform
    assert losses[0] == np.float32(loss) and losses[-1] < losses[0]
    # every parameter tensor gets a nonzero gradient, norm weights included
    offset = 0
    for name, shape in ckpt.param_shapes(config).items():
        n = int(np.prod(shape))
        assert np.abs(grads[offset:offset + n]).max() > 0, name
        offset += n
    norms = tensors["attn_norm"]
    assert 0.02 < norms.std() < 0.2 and abs(norms.mean() - 1) < 0.05
    assert os.path.getsize(REF_MODEL) + os.path.getsize(REF_STATE) < 2 * 1024 * 1024


def test_exported_reference_reproduces_logits_in_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    convert_hf.export_hf(REF_MODEL, str(tmp_path))
    model = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager")
    model = model.to(torch.float32).eval()
    _, tokens, logits, loss, _, _ = read_reference_state()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens[:, :-1].astype(np.int64)), use_cache=False).logits
    assert out.dtype == torch.float32
    assert np.abs(out.numpy() - logits).max() < 1e-5
    ce = torch.nn.functional.cross_entropy(out.double().reshape(-1, out.shape[-1]),
                                           torch.from_numpy(tokens[:, 1:].reshape(-1).astype(np.int64)))
    assert abs(ce.item() - loss) < 1e-5
