"""A tiny random Llama in Hugging Face's layout, made on the spot for the real vLLM (no hub): run by
.venv-vllm's python, which has transformers and tokenizers (`python tests/tiny_vllm_model.py DIR [HIDDEN]`).

2 layers, hidden size 128, bf16 safetensors (about 1 MB; a larger HIDDEN makes a larger file, for loading
tests), and a byte-level BPE tokenizer trained on this file's own text, saved with a chat template so that
the server's chat route loads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def write(directory: Path, hidden: int = 128) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([Path(__file__).read_text()] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32, max_position_embeddings=1024,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, torch_dtype="bfloat16")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    return directory


if __name__ == "__main__":
    write(Path(sys.argv[1]), *map(int, sys.argv[2:3]))
