"""Makes a small instruction set from the Shakespeare corpus Tessera fetches (`tessera data
fetch shakespeare`): each pair of consecutive speeches in a scene becomes a conversation in
which the user speaks the first (`COUNTESS: What hope is there ...`) and the assistant answers
with the second, in character (`LAFEU: He hath abandoned his physician ...`).

    python3 make_dialogues.py CORPUS_DIR OUT.jsonl [--limit N]

CORPUS_DIR holds the corpus's train.txt. Only short speeches (at most 60 words) are kept, so
a conversation fits a few hundred tokens. Standard library only.
"""

import json
import re
import sys

SPEAKER = re.compile(r"^([A-Z][A-Z' .-]{1,40})\.$")
SYSTEM = "You are a character in a Shakespeare play. Answer the line you are given in verse or prose, in character."


def speeches(text):
    """(speaker, speech) in order; None between scenes (a new scene breaks the dialogue)."""
    for block in re.split(r"\n\s*\n", text):
        lines = [l.strip() for l in block.strip().splitlines()]
        if not lines:
            continue
        if lines[0].startswith(("SCENE", "ACT ")):
            yield None
            continue
        m = SPEAKER.match(lines[0])
        body = " ".join(l for l in lines[1:] if not l.startswith("["))
        if m and body:
            yield m.group(1).title(), body


def main():
    corpus, out = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[sys.argv.index("--limit") + 1]) if "--limit" in sys.argv else 2000
    with open(f"{corpus}/train.txt", encoding="utf-8") as f:
        text = f.read()
    previous, written = None, 0
    with open(out, "w", encoding="utf-8") as f:
        for s in speeches(text):
            if s is not None and previous is not None:
                (a, said), (b, answer) = previous, s
                if a != b and len(said.split()) <= 60 and len(answer.split()) <= 60:
                    messages = [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"{a}: {said}"},
                        {"role": "assistant", "content": f"{b}: {answer}"},
                    ]
                    f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
                    written += 1
                    if written == limit:
                        break
            previous = s
    print(f"wrote {written} conversations to {out}")


if __name__ == "__main__":
    main()
