#!/usr/bin/env python3
"""Tiny Hugging Face BERTs and the logits transformers computes, for tests/models/bert.rs:

    python3 tests/support/bert_reference.py make OUT_DIR VOCAB

writes into OUT_DIR
- `mlm/`: a `BertForMaskedLM` (2 layers, 2 heads, 32 features, 64 inner, 32 positions, VOCAB
  tokens, dropout 0, seeded random init) saved by `save_pretrained`;
- `cls/`: a `BertForSequenceClassification` of the same sizes with 3 labels;
- `io.safetensors`: `ids` (2, 10), `attention_mask` (2, 10; the second sequence padded after 7
  tokens, its padded ids random), and each model's eval-mode logits `mlm_logits` (2, 10, VOCAB),
  `cls_logits` (2, 3).

    python3 tests/support/bert_reference.py check KIND MODEL_DIR WEIGHTS IO

loads WEIGHTS (a safetensors state_dict, e.g. `tessera export`'s) into the model of
MODEL_DIR/config.json (KIND `mlm` or `cls`) with `load_state_dict(strict=False)`, runs IO's
`ids` and `attention_mask`, and prints JSON: the missing and unexpected keys and the largest
difference to IO's `logits`.

    python3 tests/support/bert_reference.py pairs OUT_DIR SEQ_LEN

writes into OUT_DIR a WordPiece BERT tokenizer (`BertTokenizerFast` over a vocabulary of 40
words, saved by `save_pretrained`: `tokenizer.json`), `train.jsonl` (48 lines) and `eval.jsonl`
(24 lines) of sentence pairs (`text`, `text_pair`, `label`: 1 when the pair starts with the
text's first word; lengths 1 to 14 words, so some pairs are cut) and `eval.safetensors`: what
the tokenizer makes of the evaluation pairs, `tokenizer(text, text_pair, truncation=True,
max_length=SEQ_LEN, padding="max_length")`'s `input_ids`, `token_type_ids` and
`attention_mask` (24, SEQ_LEN).

Nothing is downloaded: the models are built from their configs with the installed wheels.
"""

import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file


def config(vocab, **extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **extra,
    )


def make(out, vocab):
    from transformers import BertForMaskedLM, BertForSequenceClassification

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, vocab, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.int64)
    mask[1, 7:] = 0
    io = {"ids": ids, "attention_mask": mask}
    torch.manual_seed(13)
    mlm = BertForMaskedLM(config(vocab)).eval()
    mlm.save_pretrained(os.path.join(out, "mlm"))
    torch.manual_seed(17)
    cls = BertForSequenceClassification(config(vocab, num_labels=3)).eval()
    # A trained classifier's pooler and head are not zero-biased: draw them so the test sees it.
    with torch.no_grad():
        cls.classifier.bias.normal_(0.0, 0.5)
        cls.bert.pooler.dense.bias.normal_(0.0, 0.5)
    cls.save_pretrained(os.path.join(out, "cls"))
    with torch.no_grad():
        io["mlm_logits"] = mlm(input_ids=ids, attention_mask=mask).logits.contiguous()
        io["cls_logits"] = cls(input_ids=ids, attention_mask=mask).logits.contiguous()
    save_file(io, os.path.join(out, "io.safetensors"))
    print(json.dumps({k: sorted(os.listdir(os.path.join(out, k))) for k in ("mlm", "cls")}))


def check(kind, model_dir, weights, io_file):
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

    cfg = BertConfig.from_pretrained(model_dir)
    model = (BertForMaskedLM if kind == "mlm" else BertForSequenceClassification)(cfg).eval()
    result = model.load_state_dict(load_file(weights), strict=False)
    io = load_file(io_file)
    with torch.no_grad():
        logits = model(input_ids=io["ids"], attention_mask=io["attention_mask"]).logits
    print(
        json.dumps(
            {
                "missing": sorted(result.missing_keys),
                "unexpected": sorted(result.unexpected_keys),
                "max_abs_diff": (logits - io["logits"]).abs().max().item(),
            }
        )
    )


def pairs(out, seq_len):
    import random

    from transformers import BertTokenizerFast

    words = [f"w{i}" for i in range(40)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(os.path.join(out, "vocab.txt"))
    tokenizer.save_pretrained(out)
    rng = random.Random(7)

    def sentence():
        return [rng.choice(words) for _ in range(rng.randint(1, 14))]

    def lines(n):
        rows = []
        for i in range(n):
            a, b = sentence(), sentence()
            if i % 2 == 0:
                b[0] = a[0]
            label = int(b[0] == a[0])
            rows.append({"text": " ".join(a), "text_pair": " ".join(b), "label": label})
        return rows

    for name, n in (("train", 48), ("eval", 24)):
        with open(os.path.join(out, f"{name}.jsonl"), "w") as f:
            for row in lines(n):
                f.write(json.dumps(row) + "\n")
    with open(os.path.join(out, "eval.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    enc = tokenizer(
        [r["text"] for r in rows],
        [r["text_pair"] for r in rows],
        truncation=True,
        max_length=seq_len,
        padding="max_length",
        return_tensors="pt",
    )
    save_file(
        {k: enc[k].contiguous() for k in ("input_ids", "token_type_ids", "attention_mask")},
        os.path.join(out, "eval.safetensors"),
    )
    print(json.dumps({"files": sorted(os.listdir(out))}))


def main():
    if sys.argv[1] == "pairs":
        os.makedirs(sys.argv[2], exist_ok=True)
        pairs(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "make":
        os.makedirs(sys.argv[2], exist_ok=True)
        make(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "check":
        check(*sys.argv[2:6])
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}: make, check or pairs")


if __name__ == "__main__":
    main()
