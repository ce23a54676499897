"""Clean and tokenize a raw review corpus: the data-preparation stage of a training.

Reads every ``*.tsv`` file of the raw dataset at ``$TAU_DATA_DIR/raw`` (lines
``<label>\t<text>``), and writes to ``$TAU_OUTPUT_DIR/tokenized/``, which becomes the next
version of the dataset ``reviews-tokenized`` when the run succeeds (``outputs.dataset``),
derived from the raw version it read:

* cleaning: lower case, letters only, single spaces; lines of fewer than two words and exact
  duplicates (after cleaning) dropped;
* ``vocab.txt``: the words seen at least twice, the most frequent first (ties by the word),
  at most ``--vocab`` of them;
* ``examples.jsonl``: one ``{"ids": [...], "label": 0 or 1}`` per kept line, the sorted ids
  of its words in the vocabulary;
* ``stats.json``: what was read, kept and dropped.

Deterministic: the same raw version gives the same bytes, so the same manifest digest.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

try:
    import tau  # the TauGrid workload SDK
except ImportError:
    tau = None

NOT_LETTERS = re.compile(r"[^a-z]+")


def clean(text: str) -> str:
    return NOT_LETTERS.sub(" ", text.lower()).strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=64, help="the most words kept")
    args = parser.parse_args(argv)
    raw = Path(os.environ.get("TAU_DATA_DIR", "data")) / "raw"
    out = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs")) / "tokenized"
    out.mkdir(parents=True, exist_ok=True)

    stats = Counter()
    seen: set[str] = set()
    kept: list[tuple[int, list[str]]] = []
    for path in sorted(raw.glob("*.tsv")):
        for line in path.read_text(encoding="utf-8").splitlines():
            stats["lines_read"] += 1
            label, _, text = line.partition("\t")
            words = clean(text).split()
            if label not in ("0", "1") or len(words) < 2:
                stats["too_short"] += 1
                continue
            key = f"{label} {' '.join(words)}"
            if key in seen:
                stats["duplicates"] += 1
                continue
            seen.add(key)
            kept.append((int(label), words))
    counts = Counter(word for _, words in kept for word in words)
    frequent = sorted((word for word, n in counts.items() if n >= 2), key=lambda w: (-counts[w], w))
    vocab = frequent[: args.vocab]
    ids = {word: index for index, word in enumerate(vocab)}
    (out / "vocab.txt").write_text("".join(f"{word}\n" for word in vocab), encoding="utf-8")
    with open(out / "examples.jsonl", "w", encoding="utf-8") as examples:
        for label, words in kept:
            row = {"ids": sorted({ids[word] for word in words if word in ids}), "label": label}
            examples.write(json.dumps(row) + "\n")
    summary = {**stats, "kept": len(kept), "vocab": len(vocab)}
    (out / "stats.json").write_text(json.dumps(summary, sort_keys=True) + "\n", encoding="utf-8")
    if tau is not None:
        tau.log_metrics(0, **{key: float(value) for key, value in summary.items()})
        tau.flush(timeout=10)
    print(
        f"read {stats['lines_read']} lines: kept {len(kept)}, dropped {stats['duplicates']} "
        f"duplicates and {stats['too_short']} too short; {len(vocab)} words in the vocabulary"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
