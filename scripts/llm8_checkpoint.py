"""llm8 model checkpoint: read, write, and map to/from HF LlamaForCausalLM names.

numpy only. The format is docs/formats.md's "Model checkpoint": 256 int32 header words
(magic, version, config, dtype) then the parameters, row-major float32, in PARAM_NAMES
order. Tensors are held in our layout: per-layer weights stacked on a leading L axis,
q/k/v rows fused into `wqkv` and gate/up rows fused into `w13`.
"""
import os

import numpy as np

MAGIC = 20251129
VERSION = 1
HEADER_WORDS = 256
HEADER_BYTES = HEADER_WORDS * 4
DTYPE_FLOAT32 = 0

# header word index of each config field; norm_eps and rope_theta are stored as float32 bits
CONFIG_WORDS = {
    "dim": 2,
    "n_layers": 3,
    "n_heads": 4,
    "n_kv_heads": 5,
    "ffn_dim": 6,
    "vocab_size": 7,
    "max_seq_len": 8,
    "norm_eps": 9,
    "rope_theta": 10,
}
FLOAT_FIELDS = ("norm_eps", "rope_theta")
DTYPE_WORD = 11

PARAM_NAMES = ("tok_embeddings", "attn_norm", "wqkv", "wo", "ffn_norm", "w13", "w2", "norm", "output")


def param_shapes(config):
    """Shape of every parameter tensor, in checkpoint order (docs/formats.md's table)."""
    C, L, NH = config["dim"], config["n_layers"], config["n_heads"]
    F, V = config["ffn_dim"], config["vocab_size"]
    kvc = config["n_kv_heads"] * (C // NH)
    return {
        "tok_embeddings": (V, C),
        "attn_norm": (L, C),
        "wqkv": (L, C + 2 * kvc, C),
        "wo": (L, C, C),
        "ffn_norm": (L, C),
        "w13": (L, 2 * F, C),
        "w2": (L, C, F),
        "norm": (C,),
        "output": (V, C),
    }


def num_parameters(config):
    """Total parameter count P."""
    return sum(int(np.prod(s)) for s in param_shapes(config).values())


def check_config(config):
    """Raise ValueError if the config is not a valid llm8 model shape."""
    for key in CONFIG_WORDS:
        if key not in config:
            raise ValueError(f"config is missing '{key}'")
    for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len"):
        if int(config[key]) <= 0:
            raise ValueError(f"config '{key}' must be positive, got {config[key]}")
    if config["dim"] % config["n_heads"]:
        raise ValueError(f"dim {config['dim']} is not a multiple of n_heads {config['n_heads']}")
    if config["n_heads"] % config["n_kv_heads"]:
        raise ValueError(f"n_heads {config['n_heads']} is not a multiple of n_kv_heads {config['n_kv_heads']}")


def _f32_bits(x):
    return int(np.array(x, dtype=np.float32).view(np.int32))


def _bits_f32(word):
    return float(np.array(word, dtype=np.int32).view(np.float32))


def make_header(config):
    """The 256-word int32 header for `config`."""
    check_config(config)
    header = np.zeros(HEADER_WORDS, dtype="<i4")
    header[0], header[1] = MAGIC, VERSION
    for key, word in CONFIG_WORDS.items():
        header[word] = _f32_bits(config[key]) if key in FLOAT_FIELDS else int(config[key])
    header[DTYPE_WORD] = DTYPE_FLOAT32
    return header


def parse_header(header, path="<header>"):
    """Config dict from a 256-word header; ValueError naming `path` if magic/version/dtype are wrong."""
    if header[0] != MAGIC:
        raise ValueError(f"{path}: bad magic {int(header[0])}, expected {MAGIC} (not an llm8 model checkpoint)")
    if header[1] != VERSION:
        raise ValueError(f"{path}: unsupported version {int(header[1])}, expected {VERSION}")
    if header[DTYPE_WORD] != DTYPE_FLOAT32:
        raise ValueError(f"{path}: unsupported parameter dtype {int(header[DTYPE_WORD])}, expected 0 (float32)")
    config = {}
    for key, word in CONFIG_WORDS.items():
        config[key] = _bits_f32(header[word]) if key in FLOAT_FIELDS else int(header[word])
    try:
        check_config(config)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return config


def read_model(path):
    """Read a checkpoint: (config dict, {name: float32 array in our layout}).

    Raises ValueError naming the file on a bad magic, version or dtype, or a size that
    does not equal header + parameter bytes.
    """
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"{path}: truncated: expected at least {HEADER_BYTES} header bytes, found {size}")
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
        config = parse_header(header, path)
        expected = HEADER_BYTES + 4 * num_parameters(config)
        if size != expected:
            what = "truncated" if size < expected else "trailing bytes"
            raise ValueError(f"{path}: {what}: expected {expected} bytes, found {size}")
        flat = np.frombuffer(f.read(), dtype="<f4")
    tensors, offset = {}, 0
    for name, shape in param_shapes(config).items():
        n = int(np.prod(shape))
        tensors[name] = flat[offset:offset + n].reshape(shape).astype(np.float32)
        offset += n
    return config, tensors


def write_model(path, config, tensors):
    """Write a checkpoint atomically (path.tmp, fsync, rename). Tensors are cast to float32;
    ValueError if one is missing or has the wrong shape."""
    header = make_header(config)
    shapes = param_shapes(config)
    for name, shape in shapes.items():
        if name not in tensors:
            raise ValueError(f"missing tensor '{name}'")
        if tuple(np.shape(tensors[name])) != shape:
            raise ValueError(f"tensor '{name}' has shape {tuple(np.shape(tensors[name]))}, expected {shape}")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        for name in shapes:
            f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def from_hf(state_dict, config):
    """HF LlamaForCausalLM state dict (numpy arrays, any float dtype) -> our tensors (float32)."""
    shapes = param_shapes(config)
    L = config["n_layers"]

    def get(name):
        if name not in state_dict:
            raise ValueError(f"HF state dict is missing '{name}'")
        return np.asarray(state_dict[name], dtype=np.float32)

    def layers(fmt, *parts):
        return np.stack([np.concatenate([get(fmt.format(l=l, p=p)) for p in parts], axis=0) for l in range(L)])

    out = {
        "tok_embeddings": get("model.embed_tokens.weight"),
        "attn_norm": layers("model.layers.{l}.input_layernorm.weight", ""),
        "wqkv": layers("model.layers.{l}.self_attn.{p}_proj.weight", "q", "k", "v"),
        "wo": layers("model.layers.{l}.self_attn.o_proj.weight", ""),
        "ffn_norm": layers("model.layers.{l}.post_attention_layernorm.weight", ""),
        "w13": layers("model.layers.{l}.mlp.{p}_proj.weight", "gate", "up"),
        "w2": layers("model.layers.{l}.mlp.down_proj.weight", ""),
        "norm": get("model.norm.weight"),
        "output": get("lm_head.weight"),
    }
    for name, shape in shapes.items():
        if out[name].shape != shape:
            raise ValueError(f"HF tensors for '{name}' give shape {out[name].shape}, expected {shape}")
    return out


def to_hf(tensors, config):
    """Our tensors -> HF LlamaForCausalLM state dict (float32 numpy arrays, contiguous)."""
    C, F = config["dim"], config["ffn_dim"]
    kvc = config["n_kv_heads"] * (C // config["n_heads"])
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)
    hf = {"model.embed_tokens.weight": f32(tensors["tok_embeddings"])}
    for l in range(config["n_layers"]):
        p = f"model.layers.{l}."
        wqkv, w13 = tensors["wqkv"][l], tensors["w13"][l]
        hf[p + "input_layernorm.weight"] = f32(tensors["attn_norm"][l])
        hf[p + "self_attn.q_proj.weight"] = f32(wqkv[:C])
        hf[p + "self_attn.k_proj.weight"] = f32(wqkv[C:C + kvc])
        hf[p + "self_attn.v_proj.weight"] = f32(wqkv[C + kvc:])
        hf[p + "self_attn.o_proj.weight"] = f32(tensors["wo"][l])
        hf[p + "post_attention_layernorm.weight"] = f32(tensors["ffn_norm"][l])
        hf[p + "mlp.gate_proj.weight"] = f32(w13[:F])
        hf[p + "mlp.up_proj.weight"] = f32(w13[F:])
        hf[p + "mlp.down_proj.weight"] = f32(tensors["w2"][l])
    hf["model.norm.weight"] = f32(tensors["norm"])
    hf["lm_head.weight"] = f32(tensors["output"])
    return hf
