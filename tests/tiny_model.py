"""A tiny random llama model in GGUF, small enough for llama.cpp to load on a CPU in a second."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

VOCAB, WIDTH, LAYERS, FFN, HEADS = 64, 64, 2, 128, 4


def write_tiny_llama(path: Path, width: int = WIDTH, layers: int = LAYERS, ffn: int = FFN, heads: int = HEADS) -> Path:
    """The model; larger `width`, `layers` and `ffn` make a bigger file (f32: 4 bytes a weight) for loading tests."""
    rng = np.random.default_rng(0)

    def weights(*shape: int) -> np.ndarray:  # numpy order: the reverse of ggml's ne[]
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(width // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all f32
    # SentencePiece-style vocabulary: the three specials, then byte tokens (llama.cpp looks up <0x0A>).
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(VOCAB - 3)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * (VOCAB - 3)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    writer.add_tensor("token_embd.weight", weights(VOCAB, width))
    writer.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    writer.add_tensor("output.weight", weights(VOCAB, width))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(width, width))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(ffn, width))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(ffn, width))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(width, ffn))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
