"""The plain PyTorch side of `scripts/bench-gpt.sh`: the GPT of `examples/gpt` (4 layers, width
256, 4 heads, context 128, dropout 0.1, tied embeddings) trained on the SAME cached Shakespeare
token file Tessera reads (`<data>/shakespeare/tokens-<sha16>/train.u16`, little-endian), packed
the same way (sequence i = tokens [i*T, i*T+T], input the first T, target the last T), shuffled
by sequence each epoch, batch 32, `torch.optim.AdamW` (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 0.1 on every parameter, as Tessera's AdamW), constant rate, mean token
cross-entropy on the logits. The model is transformers' `GPT2LMHeadModel` with
`attn_implementation="sdpa"` when it imports, else a hand-written twin (same module tree and
computation: fused SDPA, tanh GELU).

Timed: the training steps after WARMUP batches (`time.perf_counter` around them; batch building
included, as in a user's loop), with `torch.set_num_threads(THREADS)`. Prints one JSON line:
tokens/s of the timed steps and the mean loss over each LOG_EVERY batches.

Environment: BATCHES (35), WARMUP (5), THREADS (2), SEED (0), LOG_EVERY (5), DATA (the cache
root, default ~/.cache/tessera/data), ACT (the GPT2Config activation, default `gelu_new`, GPT-2's;
`gelu_pytorch_tanh` is the same function as one fused kernel, the one Tessera calls), TWIN (1:
use the hand-written twin even when transformers imports), SHUFFLE (1; 0 keeps the sequences in
stream order, as Tessera's `data.shuffle = false`, so both sides see the same batches).
"""

import hashlib
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

VOCAB, T, C, L, H, DROPOUT, BATCH = 4096, 128, 256, 4, 4, 0.1, 32
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.1


def token_file(data_root, split="train"):
    """The split's token ids (int64) from the corpus cache Tessera wrote."""
    # The encoding by THIS vocabulary's tokenizer: the cache holds one folder per tokenizer
    # (tokens-<first 16 hex of its sha256>), e.g. also the tests' 1024-token one.
    corpus = Path(data_root) / "shakespeare"
    tokenizer = corpus / f"tokenizer-bpe-{VOCAB}.json"
    if not tokenizer.is_file():
        raise SystemExit(f"no {tokenizer}: run tessera first")
    folder = corpus / f"tokens-{hashlib.sha256(tokenizer.read_bytes()).hexdigest()[:16]}"
    manifest = dict(
        line.split(" ", 1)
        for line in (folder / "MANIFEST").read_text().splitlines()
        if line and not line.startswith("#")
    )
    width = int(manifest["width"])
    name = f"{split}.u{8 * width}"
    raw = bytearray((folder / name).read_bytes())
    dtype = torch.uint16 if width == 2 else torch.uint32
    ids = torch.frombuffer(raw, dtype=dtype).to(torch.int64)
    assert ids.numel() == int(manifest[f"{name}.tokens"])
    return ids


def hf_model(act):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=T,
        n_embd=C,
        n_layer=L,
        n_head=H,
        resid_pdrop=DROPOUT,
        embd_pdrop=DROPOUT,
        attn_pdrop=DROPOUT,
        layer_norm_epsilon=1e-5,
        activation_function=act,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(config)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return model, lambda x: model(input_ids=x).logits


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(C, eps=1e-5)
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C, eps=1e-5)
        self.c_fc = torch.nn.Linear(C, 4 * C)
        self.m_proj = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        heads = lambda z: z.view(b, t, H, C // H).transpose(1, 2)  # noqa: E731
        p = DROPOUT if self.training else 0.0
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, C)
        x = x + F.dropout(self.c_proj(y), DROPOUT, self.training)
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + F.dropout(self.m_proj(h), DROPOUT, self.training)


class Twin(torch.nn.Module):
    """GPT-2 written out: learned positions, pre-LN blocks, tied head."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, C)
        self.wpe = torch.nn.Embedding(T, C)
        self.h = torch.nn.ModuleList(Block() for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif "ln" not in name:
                std = 0.02 / math.sqrt(2 * L) if "proj" in name else 0.02
                torch.nn.init.normal_(p, 0.0, std)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        x = F.dropout(self.wte(x) + self.wpe(pos), DROPOUT, self.training)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def build(act, twin):
    if not twin:
        try:
            return ("transformers GPT2LMHeadModel (sdpa, " + act + ")",) + hf_model(act)
        except ImportError:
            pass
    model = Twin()
    return ("hand-written twin (sdpa, fused tanh gelu)", model, model)


def main():
    batches = int(os.environ.get("BATCHES", "35"))
    warmup = int(os.environ.get("WARMUP", "5"))
    threads = int(os.environ.get("THREADS", "2"))
    seed = int(os.environ.get("SEED", "0"))
    log_every = int(os.environ.get("LOG_EVERY", "5"))
    data = os.environ.get("DATA", str(Path.home() / ".cache/tessera/data"))
    act = os.environ.get("ACT", "gelu_new")
    shuffle = os.environ.get("SHUFFLE", "1") != "0"
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tokens = token_file(data)
    n_seq = (tokens.numel() - 1) // T
    offsets = torch.arange(T + 1)
    name, model, forward = build(act, os.environ.get("TWIN") == "1")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    gen = torch.Generator().manual_seed(seed)
    per_epoch = n_seq // BATCH
    losses, window, done, started = [], [], 0, None
    while done < batches:
        order = torch.randperm(n_seq, generator=gen) if shuffle else torch.arange(n_seq)
        for i in range(min(per_epoch, batches - done)):
            if done == warmup:
                started = time.perf_counter()
            index = order[i * BATCH : (i + 1) * BATCH]
            rows = tokens[(index * T).unsqueeze(1) + offsets]
            x, y = rows[:, :-1], rows[:, 1:]
            optimizer.zero_grad()
            logits = forward(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            optimizer.step()
            window.append(loss.detach())
            done += 1
            if done % log_every == 0:
                losses.append([done, torch.stack(window).mean().item()])
                window = []
    seconds = time.perf_counter() - started
    timed = batches - warmup
    print(
        json.dumps(
            {
                "side": "pytorch",
                "model": name,
                "params": sum(p.numel() for p in model.parameters()),
                "torch": torch.__version__,
                "threads": threads,
                "timed_batches": timed,
                "seconds": seconds,
                "tokens_per_second": timed * BATCH * T / seconds,
                "losses": losses,
            }
        )
    )


if __name__ == "__main__":
    main()
