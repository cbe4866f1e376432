#!/usr/bin/env python3
"""Makes the small labelled text set of examples/finetune/labelled-text/ from the two text corpora.

Each line of the output is a JSON object {"text": PARAGRAPH, "label": SOURCE}: a paragraph of
Shakespeare's works ("shakespeare") or of a State of the Union address ("sotu"). Both corpora
are public domain (docs/text-data.md, "Corpora and licences"); nothing is downloaded here:
fetch them first with

    ./target/release/tessera data fetch shakespeare
    ./target/release/tessera data fetch sotu

then run

    python3 scripts/make_labelled_text.py [--data-dir DIR] [--out examples/finetune/labelled-text]

Training lines come from each corpus's training split (train.txt), evaluation lines from its
validation split (val.txt), so no passage is in both. The text is cut into blocks at blank lines
and each line (a State of the Union paragraph is one line); a play's speaker names (lines in
capitals) and stage directions (lines starting with "[") are dropped; the rest is cut into
sentences. Sentences of 60 to 200 characters, with at least 10 words and mostly letters, are
candidates, and the ones whose sha256 ranks first are taken (a fixed choice: the same corpora
give the same files). The lines of both sources are then ordered by the sha256 of the line,
which mixes them.
"""

import argparse
import hashlib
import json
import os
import re
from pathlib import Path

SOURCES = ("shakespeare", "sotu")
# About 150 characters a line: 320 lines, about 47 kB.
PER_SOURCE = {"train": 120, "eval": 40}
SPLIT_FILE = {"train": "train.txt", "eval": "val.txt"}
MIN_CHARS, MAX_CHARS, MIN_WORDS = 60, 200, 10


def cache_root() -> Path:
    """Tessera's data cache root: $TESSERA_DATA, else $XDG_CACHE_HOME/tessera/data, else
    ~/.cache/tessera/data."""
    if os.environ.get("TESSERA_DATA"):
        return Path(os.environ["TESSERA_DATA"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "tessera" / "data"
    return Path.home() / ".cache" / "tessera" / "data"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def passages(text: str):
    for block in re.split(r"\n\s*\n", text):
        lines = [
            line.strip()
            for line in block.splitlines()
            if line.strip() and line.strip() != line.strip().upper() and not line.strip().startswith("[")
        ]
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(" ".join(lines).split())):
            letters = sum(c.isalpha() for c in sentence)
            if (
                MIN_CHARS <= len(sentence) <= MAX_CHARS
                and len(sentence.split()) >= MIN_WORDS
                and letters >= 0.7 * len(sentence)
            ):
                yield sentence


def chosen(root: Path, source: str, split: str):
    path = root / source / SPLIT_FILE[split]
    if not path.is_file():
        raise SystemExit(
            f"{path} is missing: run `./target/release/tessera data fetch {source}` first"
        )
    candidates = sorted(set(passages(path.read_text(encoding="utf-8"))), key=sha)
    count = PER_SOURCE[split]
    if len(candidates) < count:
        raise SystemExit(f"{path}: only {len(candidates)} sentences fit, {count} are needed")
    return candidates[:count]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=cache_root())
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent.parent / "examples/finetune/labelled-text"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "eval"):
        lines = [
            json.dumps({"text": text, "label": source}, ensure_ascii=False)
            for source in SOURCES
            for text in chosen(args.data_dir, source, split)
        ]
        lines.sort(key=sha)
        out = args.out / f"{split}.jsonl"
        out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        print(f"{out}: {len(lines)} lines, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
