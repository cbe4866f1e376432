"""Chat templates rendered by Hugging Face transformers, for the parity test of Tessera's
`dataset = "chat"` (tests/models/chat.rs): a small byte-level BPE with chat special tokens (trained
here by the `tokenizers` package, nothing downloaded) saved with two chat templates in the forms
models ship them (SmolLM2's ChatML with a default system prompt; Llama 3's headers with a BOS
and `| trim`), and how `apply_chat_template` renders and tokenizes a few conversations.

    python3 scripts/chat_reference.py OUT

Writes OUT/<template>/tokenizer.json and tokenizer_config.json for `smol` and `llama3`, and
OUT/cases.json: a list of {"template", "messages", "text", "ids", "prompt"} where `text` and
`ids` are `apply_chat_template(messages)` untokenized and tokenized, and `prompt` is
`apply_chat_template(messages[:-1], add_generation_prompt=True)`.
"""

import json
import os
import sys

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

TEMPLATES = {
    "smol": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}",
        "<|im_start|>",
        "<|im_end|>",
    ),
    "llama3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}"
        "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
        "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
        "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
        "{% endif %}",
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
}

CONVERSATIONS = [
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "  Colour of the sky?  "},
        {"role": "assistant", "content": "Blue"},
        {"role": "user", "content": "And grass — in café light ☕?"},
        {"role": "assistant", "content": "Green,\n  mostly."},
    ],
]


def main():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import transformers

    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [m["content"] for c in CONVERSATIONS for m in c] * 20
    corpus += ["the quick brown fox jumps over the lazy dog"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    cases = []
    for name, (template, bos, eos) in TEMPLATES.items():
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        tok.save(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": bos,
                    "eos_token": eos,
                    "chat_template": template,
                },
                f,
                indent=2,
            )
        hf = transformers.AutoTokenizer.from_pretrained(folder)
        for messages in CONVERSATIONS:
            ids = hf.apply_chat_template(messages, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            cases.append(
                {
                    "template": name,
                    "messages": messages,
                    "text": hf.apply_chat_template(messages, tokenize=False),
                    "ids": list(ids),
                    "prompt": hf.apply_chat_template(
                        messages[:-1], tokenize=False, add_generation_prompt=True
                    ),
                }
            )
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
