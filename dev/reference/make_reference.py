"""Write the reference state the CPU and GPU trainers are tested against.

Builds a small HF transformers LlamaForCausalLM (eager attention, GQA on), runs it in
float64 on one random batch and writes, in docs/formats.md's formats:
  llama_ref_model.bin  the initial model (llm8 checkpoint, float32 weights)
  llama_ref_state.bin  tokens, logits, loss, every gradient, and the losses of S AdamW steps

    pip install torch transformers
    python dev/reference/make_reference.py
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import llm8_checkpoint as ckpt  # noqa: E402

STATE_MAGIC = 20251201
STATE_VERSION = 1
MODEL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=176, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0)
LR, WEIGHT_DECAY, BETA1, BETA2, ADAM_EPS, GRAD_CLIP = 1e-3, 0.1, 0.9, 0.95, 1e-8, 1.0
NORM_WEIGHT_STD = 0.1  # norm weights 1 + 0.1 * randn, so their gradients are not all alike
MAX_FIXTURE_BYTES = 2 * 1024 * 1024


# HF upcasts to float32 inside RMSNorm, RoPE and the eager softmax (meant for bf16 runs); in a
# float64 run that is a downcast. These three are the same math kept in the input dtype.

def rms_norm_same_dtype(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def rope_same_dtype(config):
    head_dim = config.hidden_size // config.num_attention_heads
    theta = config.rope_parameters["rope_theta"]

    def forward(x, position_ids):
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    return forward


def eager_attention_same_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key = modeling_llama.repeat_kv(key, module.num_key_value_groups)
    value = modeling_llama.repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def use_full_precision(model):
    """Take the three float32 round trips out of HF's Llama (for the rest of this process)."""
    modeling_llama.LlamaRMSNorm.forward = rms_norm_same_dtype
    modeling_llama.eager_attention_forward = eager_attention_same_dtype
    model.model.rotary_emb.forward = rope_same_dtype(model.config)


def our_config(hf):
    return {"dim": hf.hidden_size, "n_layers": hf.num_hidden_layers, "n_heads": hf.num_attention_heads,
            "n_kv_heads": hf.num_key_value_heads, "ffn_dim": hf.intermediate_size, "vocab_size": hf.vocab_size,
            "max_seq_len": hf.max_position_embeddings, "norm_eps": hf.rms_norm_eps,
            "rope_theta": hf.rope_parameters["rope_theta"]}


def loss_of(model, inputs, targets):
    """(logits (B, T, V), mean cross-entropy) in the model's dtype."""
    logits = model(input_ids=inputs, use_cache=False).logits
    return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def f32_bits(x):
    return int(np.array(x, dtype=np.float32).view(np.int32))


def write_atomic(path, chunks):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1337, help="torch seed for weights and tokens")
    parser.add_argument("--batch", "-B", type=int, default=2, help="batch size B")
    parser.add_argument("--seq", "-T", type=int, default=16, help="sequence length T")
    parser.add_argument("--steps", "-S", type=int, default=10, help="AdamW steps S")
    parser.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)), help="output folder")
    args = parser.parse_args()
    B, T, S = args.batch, args.seq, args.steps
    print(f"seed {args.seed}, torch {torch.__version__}")

    torch.manual_seed(args.seed)
    hf_config = LlamaConfig(**MODEL, tie_word_embeddings=False, attn_implementation="eager")
    model = LlamaForCausalLM(hf_config)  # HF default init: normal(0, initializer_range 0.02), norms 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_WEIGHT_STD * torch.randn_like(p))
    # built in float32, so the float64 model holds exactly the float32 values we write
    model = model.double()
    params = dict(model.named_parameters())
    for name, p in params.items():
        assert torch.equal(p, p.float().double()), name
    config = our_config(hf_config)
    tensors = ckpt.from_hf({n: p.detach().numpy() for n, p in params.items()}, config)
    P = ckpt.num_parameters(config)
    assert P == sum(p.numel() for p in params.values())

    tokens = torch.randint(0, hf_config.vocab_size, (B, T + 1), dtype=torch.long)
    inputs, targets = tokens[:, :T], tokens[:, 1:]

    with torch.no_grad():  # check: HF's own float32 round trips change nothing beyond float32 rounding
        hf_logits, _ = loss_of(model, inputs, targets)
    use_full_precision(model)

    decay = [p for p in params.values() if p.ndim == 2]
    no_decay = [p for p in params.values() if p.ndim != 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=LR, betas=(BETA1, BETA2), eps=ADAM_EPS)
    losses = []
    for step in range(S):
        optimizer.zero_grad(set_to_none=True)
        logits, loss = loss_of(model, inputs, targets)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            logits0, loss0 = logits.detach().clone(), loss.item()
            grads = ckpt.from_hf({n: p.grad.numpy() for n, p in params.items()}, config)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP).item()
        optimizer.step()
        if step == 0:
            grad_norm = norm
        print(f"step {step}: loss {loss.item():.9f} grad norm {norm:.9f}")
    with torch.no_grad():
        _, final = loss_of(model, inputs, targets)

    print(f"max |logit| {logits0.abs().max().item():.9f}")
    print(f"max |logit - HF with its float32 casts| {(logits0 - hf_logits).abs().max().item():.3e}")
    print(f"loss {loss0:.9f} (ln V = {np.log(hf_config.vocab_size):.6f})")
    print(f"grad norm {grad_norm:.9f}")
    print(f"loss {S - 1} (after {S - 1} updates) {losses[-1]:.9f}, after {S} updates {final.item():.9f}")

    model_path = os.path.join(args.out_dir, "llama_ref_model.bin")
    state_path = os.path.join(args.out_dir, "llama_ref_state.bin")
    ckpt.write_model(model_path, config, tensors)
    header = np.zeros(256, dtype="<i4")
    header[:12] = [STATE_MAGIC, STATE_VERSION, B, T, S, f32_bits(LR), f32_bits(WEIGHT_DECAY), f32_bits(BETA1),
                   f32_bits(BETA2), f32_bits(ADAM_EPS), f32_bits(GRAD_CLIP), P]
    write_atomic(state_path, [
        header,
        tokens.numpy().astype("<i4"),
        logits0.numpy().astype("<f4"),
        np.array([loss0], dtype="<f4"),
        np.concatenate([grads[name].ravel() for name in ckpt.PARAM_NAMES]).astype("<f4"),
        np.array(losses, dtype="<f4"),
    ])
    sizes = {path: os.path.getsize(path) for path in (model_path, state_path)}
    for path, size in sizes.items():
        print(f"wrote {os.path.relpath(path, ROOT)} ({size:,} bytes)")
    assert sum(sizes.values()) < MAX_FIXTURE_BYTES, "reference fixtures grew past 2 MiB"


if __name__ == "__main__":
    main()
