"""Write the raw corpus examples/data-prep cleans: short product reviews, one per line as
``<label>\t<text>`` (1 liked, 0 not), in three files, with what raw data has — capitals,
punctuation, stray spaces, duplicates, lines too short to keep. Seeded: the same bytes every
time, so its dataset version's manifest digest is the same on every machine.

    python examples/data-prep/make_raw.py /tmp/reviews-raw
    tau data dataset ingest reviews-raw /tmp/reviews-raw
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

LIKED = ["great", "sturdy", "reliable", "quiet", "excellent", "comfortable", "bright", "fast"]
DISLIKED = ["broken", "flimsy", "noisy", "slow", "awful", "cheap", "dull", "leaky"]
THINGS = ["kettle", "lamp", "chair", "backpack", "keyboard", "blender", "tent", "jacket"]
FILLER = ["the", "this", "my", "really", "very", "and", "it", "is", "was", "so"]
ENDINGS = [".", "!", "!!", "...", "?!", ""]


def review(rng: random.Random) -> str:
    liked = rng.random() < 0.5
    words = [rng.choice(FILLER), rng.choice(THINGS), rng.choice(FILLER)]
    for _ in range(rng.randint(2, 4)):
        words.append(rng.choice(LIKED if liked else DISLIKED))
        words.append(rng.choice(FILLER))
    if rng.random() < 0.15:  # one word of the other side: not every review is clear-cut
        words.append(rng.choice(DISLIKED if liked else LIKED))
    text = " ".join(word.upper() if rng.random() < 0.1 else word for word in words)
    text = text.capitalize() + rng.choice(ENDINGS)
    if rng.random() < 0.1:
        text = "  " + text.replace(" ", "   ", 1) + " "
    return f"{int(liked)}\t{text}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20261206)  # noqa: S311 - reproducible data, not secrets
    lines = [review(rng) for _ in range(600)]
    lines += lines[:40]  # duplicates, as scraped data has
    lines += ["1\tOk", "0\t", "1\t!!!"]  # too short to say anything
    rng.shuffle(lines)
    for part in range(3):
        chunk = lines[part::3]
        (out / f"reviews-{part}.tsv").write_text("\n".join(chunk) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
