"""A tiny Llama model written as a GGUF file, the way llama.cpp's converter writes one.

The model is a seeded, randomly initialised ``LlamaForCausalLM`` (2 layers,
hidden size 64) over a byte-level BPE vocabulary (three ChatML special tokens,
the 256 byte symbols and a few merges), with SmolLM2's chat template. Its
tensors are float32 and named as llama.cpp names them; the query and key
projections are permuted as llama.cpp permutes them (transformers undoes this
on load), so an import that works reproduces the model's logits exactly.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "tiny_llama", "write_tiny_gguf"]

HEADS, KV_HEADS = 4, 2
ROPE_THETA = 10000.0
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "Ġt he", "i n", "Ġ a")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[byte] for byte in range(256)]


def vocabulary() -> list[str]:
    merged = [merge.replace(" ", "") for merge in MERGES]
    return [*SPECIAL_TOKENS, *_byte_symbols(), *merged]


def tiny_llama(*, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(vocabulary()),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of a query or key projection's rows (rotary halves interleaved)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    config = model.config
    state = {name: t.detach().numpy().astype(np.float32) for name, t in model.state_dict().items()}
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for layer in range(config.num_hidden_layers):
        for gguf_name, hf_name in names.items():
            weights = state[f"model.layers.{layer}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                weights = _permute(weights, HEADS)
            elif gguf_name == "attn_k":
                weights = _permute(weights, KV_HEADS)
            tensors[f"blk.{layer}.{gguf_name}.weight"] = weights
    return tensors


def write_tiny_gguf(path: Path, model: LlamaForCausalLM) -> Path:
    """Write ``model`` (from :func:`tiny_llama`) with its tokenizer as the GGUF file ``path``."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // HEADS)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
        + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS))
    )
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, weights in _tensors(model).items():
        writer.add_tensor(name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
