"""Convert between HF LlamaForCausalLM safetensors and llm8 model checkpoints.

    python scripts/convert_hf.py import HF_DIR_OR_SAFETENSORS OUT.bin
    python scripts/convert_hf.py export IN.bin OUT_DIR

import reads config.json and the *.safetensors beside it (sharded ones through
model.safetensors.index.json), converts bf16/fp16 to float32 and writes our checkpoint.
export writes config.json and one float32 model.safetensors that
LlamaForCausalLM.from_pretrained loads. No torch needed.
"""
import argparse
import glob
import json
import os
import struct
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llm8_checkpoint as ckpt  # noqa: E402

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def _bf16_from_file(path, name):
    """One BF16 tensor read from the raw safetensors bytes, widened to float32 exactly.

    Read by hand because older safetensors.numpy cannot represent bfloat16; bf16 is the
    top half of a float32, so a 16-bit shift is the exact conversion.
    """
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))[name]
        begin, end = meta["data_offsets"]
        f.seek(8 + n + begin)
        raw = np.frombuffer(f.read(end - begin), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(meta["shape"])


class SafetensorsModel:
    """Lazy name -> float32 array view over one or more .safetensors files."""

    def __init__(self, files):
        self.where = {}  # tensor name -> (file, name stored in that file)
        for path in files:
            with safe_open(path, framework="numpy") as f:
                for name in f.keys():
                    self.where[name] = (path, name)

    def __contains__(self, name):
        return name in self.where

    def alias(self, name, existing):
        """Make `name` read the tensor stored as `existing`."""
        self.where[name] = self.where[existing]

    def __getitem__(self, name):
        path, name = self.where[name]
        with safe_open(path, framework="numpy") as f:
            dtype = f.get_slice(name).get_dtype()
            if dtype not in FLOAT_DTYPES:
                raise ValueError(f"{path}: tensor '{name}' has dtype {dtype}, expected a float type")
            if dtype == "BF16":
                return _bf16_from_file(path, name)
            return f.get_tensor(name).astype(np.float32)


def find_hf_files(src):
    """(config.json path, list of safetensors files) for a HF folder or a single .safetensors file."""
    if os.path.isfile(src):
        folder, files = os.path.dirname(os.path.abspath(src)), [src]
    elif os.path.isdir(src):
        folder = src
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            files = [os.path.join(folder, s) for s in shards]
        else:
            files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
        if not files:
            raise ValueError(f"{src}: no *.safetensors files found")
    else:
        raise ValueError(f"{src}: no such file or folder")
    config_path = os.path.join(folder, "config.json")
    if not os.path.exists(config_path):
        raise ValueError(f"{config_path}: not found (a HF config.json must sit beside the weights)")
    return config_path, files


def config_from_hf(hf, path="config.json"):
    """Our config dict from a HF Llama config.json dict; ValueError for what llm8 cannot run."""
    def need(ok, what):
        if not ok:
            raise ValueError(f"{path}: {what} is not supported by llm8")

    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    need(rope.get("rope_type", rope.get("type", "default")) == "default", f"rope type {rope}")
    need(hf.get("hidden_act", "silu") == "silu", f"hidden_act {hf.get('hidden_act')}")
    need(not hf.get("attention_bias", False) and not hf.get("mlp_bias", False), "a bias in attention or MLP")
    config = {
        "dim": hf["hidden_size"],
        "n_layers": hf["num_hidden_layers"],
        "n_heads": hf["num_attention_heads"],
        "n_kv_heads": hf.get("num_key_value_heads") or hf["num_attention_heads"],
        "ffn_dim": hf["intermediate_size"],
        "vocab_size": hf["vocab_size"],
        "max_seq_len": hf["max_position_embeddings"],
        "norm_eps": hf.get("rms_norm_eps", 1e-5),
        "rope_theta": hf.get("rope_theta", rope.get("rope_theta", 10000.0)),
    }
    head_dim = hf.get("head_dim")
    need(head_dim in (None, config["dim"] // config["n_heads"]), f"head_dim {head_dim} != hidden_size / heads")
    ckpt.check_config(config)
    return config


def config_to_hf(config):
    """HF LlamaForCausalLM config.json dict for our config."""
    # shortest decimal that rounds back to the stored float32 (1e-05, not 9.99999974e-06)
    as_decimal = lambda x: float(str(np.float32(x)))
    theta = as_decimal(config["rope_theta"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config["dim"],
        "num_hidden_layers": config["n_layers"],
        "num_attention_heads": config["n_heads"],
        "num_key_value_heads": config["n_kv_heads"],
        "head_dim": config["dim"] // config["n_heads"],
        "intermediate_size": config["ffn_dim"],
        "vocab_size": config["vocab_size"],
        "max_position_embeddings": config["max_seq_len"],
        "rms_norm_eps": as_decimal(config["norm_eps"]),
        # rope_theta for transformers 4.x, rope_parameters for 5.x
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def import_hf(src, out_path):
    """HF folder or .safetensors file -> llm8 checkpoint at out_path; returns the config."""
    config_path, files = find_hf_files(src)
    with open(config_path) as f:
        hf_config = json.load(f)
    config = config_from_hf(hf_config, config_path)
    weights = SafetensorsModel(files)
    if "lm_head.weight" not in weights and hf_config.get("tie_word_embeddings", False):
        # llm8 has an untied lm_head: start it as a copy of the embedding
        weights.alias("lm_head.weight", "model.embed_tokens.weight")
    ckpt.write_model(out_path, config, ckpt.from_hf(weights, config))
    return config


def export_hf(in_path, out_dir):
    """llm8 checkpoint -> out_dir/config.json + out_dir/model.safetensors (float32); returns the config."""
    config, tensors = ckpt.read_model(in_path)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_to_hf(config), f, indent=2)
        f.write("\n")
    save_file(ckpt.to_hf(tensors, config), os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("import", help="HF safetensors -> llm8 checkpoint")
    p.add_argument("src", help="HF model folder (config.json + *.safetensors) or one .safetensors file")
    p.add_argument("out", help="llm8 checkpoint to write (.bin)")
    p = sub.add_parser("export", help="llm8 checkpoint -> HF folder")
    p.add_argument("src", help="llm8 checkpoint to read (.bin)")
    p.add_argument("out", help="folder to write config.json and model.safetensors into")
    args = parser.parse_args(argv)
    try:
        if args.command == "import":
            config = import_hf(args.src, args.out)
        else:
            config = export_hf(args.src, args.out)
    except (ValueError, KeyError, OSError) as e:
        print(f"convert_hf.py {args.command}: error: {e}", file=sys.stderr)
        return 1
    print(f"{args.command}: {args.src} -> {args.out}: {config}, {ckpt.num_parameters(config):,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
