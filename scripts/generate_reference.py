"""Tiny random causal language models and their greedy generations by Hugging Face
transformers, for the parity test of `tessera generate` (tests/models/generate.rs).

    python3 scripts/generate_reference.py VARIANT OUT

VARIANT: `llama` (4 query heads over 2 key/value heads, untied head) or `gpt2` (tied head).
Writes OUT/model/ (the model's save_pretrained folder with a byte-level BPE tokenizer.json
trained on a fixed text, `<|endoftext|>` its end token), OUT/prompts.jsonl and OUT/expected.json:
each prompt's ids and the ids `model.generate(..., do_sample=False)` appends to it, the prompt
alone (no padding). Nothing is downloaded: the model is drawn from a fixed seed.
"""

import json
import os
import sys

import torch

PROMPTS = [
    "the river runs",
    "a boat sails under grey sky while gulls",
    "dawn",
]
MAX_NEW_TOKENS = 24
TEXT = (
    "the river runs to the sea and a boat sails under grey sky while gulls call over the old "
    "harbour wall at dawn light falls softly on the water and the wind turns the sails home "
) * 8


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer)
    return tok


def build(variant, vocab, eos):
    import transformers

    if variant == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rms_norm_eps=1e-6,
            rope_theta=500.0,
            tie_word_embeddings=False,
            initializer_range=0.3,
            bos_token_id=eos,
            eos_token_id=eos,
        )
        return transformers.LlamaForCausalLM(config)
    if variant == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab,
            n_layer=2,
            n_head=2,
            n_embd=32,
            n_positions=64,
            initializer_range=0.3,
            bos_token_id=eos,
            eos_token_id=eos,
        )
        return transformers.GPT2LMHeadModel(config)
    raise SystemExit(f"unknown variant {variant!r}")


def main():
    variant, out = sys.argv[1], sys.argv[2]
    tok = tokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    model = build(variant, tok.get_vocab_size(), eos).float().eval()
    folder = os.path.join(out, "model")
    model.save_pretrained(folder)
    tok.save(os.path.join(folder, "tokenizer.json"))
    expected = {"prompt_ids": [], "generated": [], "eos": eos}
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok.encode(prompt).ids
            input_ids = torch.tensor([ids])
            output = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )
            expected["prompt_ids"].append(ids)
            expected["generated"].append(output[0, len(ids):].tolist())
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
    with open(os.path.join(out, "prompts.jsonl"), "w") as f:
        for prompt in PROMPTS:
            f.write(json.dumps({"prompt": prompt}) + "\n")
    print(json.dumps({"variant": variant, "vocab": tok.get_vocab_size(), **expected}))


if __name__ == "__main__":
    main()
