"""Batch inference with Ray Data: the reviews classifier over a dataset version of reviews.

Reads every ``*.tsv`` and ``*.txt`` file of the dataset staged at ``$TAU_DATA_DIR/<--data>``
(lines ``<label>\\t<text>``, as examples/data-prep's raw reviews, or ``<text>`` alone) with
``ray.data.read_text``, and classifies the lines with ``map_batches`` on a pool of Ray actors,
one classifier per actor: the model version staged at ``$TAU_DATA_DIR/<--model>``
(examples/train-on-data's ``model.json`` and ``vocab.txt``) is read once per actor, not once
per batch. The driver writes the predictions, in the order of the input, to
``$TAU_OUTPUT_DIR/<--output>/``, which becomes the next version of the dataset
``reviews-predictions`` when the run succeeds (``outputs.dataset``), derived from both the
reviews version and the model version it read:

* ``predictions.jsonl``: one ``{"file", "text", "label", "positive", "predicted", "words"}``
  per line read: the file (relative to the dataset), the text, the line's own label (``null``
  when it has none), the classifier's probability of a positive review and its 0/1 answer
  (positive at 0.5 or above), and how many of the model's words the text has;
* ``summary.json``: rows, positive rows and their share, and how many labelled rows the
  classifier agrees with.

Rows and the positive share are reported as metrics through the workload SDK. Text is
cleaned exactly as examples/data-prep cleaned the training data and examples/serve-cpu cleans
a request (lower case, letters only), so the same text gets the same answer there. The same
input and model versions give the same bytes, so the same manifest digest.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

try:
    import tau  # the TauGrid workload SDK
except ImportError:
    tau = None

NOT_LETTERS = re.compile(r"[^a-z]+")
#: The longest text read (characters), as examples/serve-cpu.
MAX_TEXT = 100_000
#: A line without a label of its own (``null`` in predictions.jsonl).
NO_LABEL = -1
SUFFIXES = (".tsv", ".txt")


def clean(text: str) -> str:
    return NOT_LETTERS.sub(" ", text.lower()).strip()


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class Classifier:
    """The trained model: a weight per vocabulary word and a bias (examples/serve-cpu's)."""

    def __init__(self, folder: Path) -> None:
        model = json.loads((folder / "model.json").read_text(encoding="utf-8"))
        words = (folder / "vocab.txt").read_text(encoding="utf-8").split()
        self.weights = [float(w) for w in model["weights"]]
        self.bias = float(model["bias"])
        if len(words) != len(self.weights):
            raise ValueError(f"{len(words)} words in vocab.txt, {len(self.weights)} weights")
        self.ids = {word: index for index, word in enumerate(words)}

    def predict(self, text: str) -> tuple[float, int, int]:
        """The probability that ``text`` is a positive review, rounded; 0 or 1; the words."""
        found = {self.ids[word] for word in clean(text[:MAX_TEXT]).split() if word in self.ids}
        positive = round(sigmoid(self.bias + sum(self.weights[index] for index in found)), 6)
        return positive, int(positive >= 0.5), len(found)


def split_line(line: str) -> tuple[int, str]:
    """``<label>\\t<text>`` → (label, text); a line without a 0/1 label is all text."""
    label, tab, text = line.partition("\t")
    if tab and label.strip() in ("0", "1"):
        return int(label), text.strip()
    return NO_LABEL, line.strip()


class Predict:
    """``map_batches``' callable class: Ray Data makes one per actor of its pool, so each
    actor reads the model once and then classifies batch after batch."""

    def __init__(self, model_dir: str) -> None:
        import ray

        self.model = Classifier(Path(model_dir))
        node = ray.get_runtime_context().get_node_id()[:8]
        print(f"loaded the classifier ({len(self.model.ids)} words) on node {node}", flush=True)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        labels, texts, positives, answers, words = [], [], [], [], []
        for line in batch["text"]:
            label, text = split_line(str(line))
            positive, answer, found = self.model.predict(text)
            labels.append(label)
            texts.append(text)
            positives.append(positive)
            answers.append(answer)
            words.append(found)
        return {
            "path": batch["path"],
            "text": np.array(texts, dtype=object),
            "label": np.array(labels, dtype=np.int64),
            "positive": np.array(positives, dtype=np.float64),
            "predicted": np.array(answers, dtype=np.int64),
            "words": np.array(words, dtype=np.int64),
        }


def data_folder(name: str) -> Path:
    base = os.environ.get("TAU_DATA_DIR")
    return Path(base) / name if base and not Path(name).is_absolute() else Path(name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="reviews", help="under $TAU_DATA_DIR: the texts")
    parser.add_argument("--model", default="model", help="under $TAU_DATA_DIR: the model")
    parser.add_argument("--output", default="predictions", help="under $TAU_OUTPUT_DIR")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--actors", type=int, default=2, help="classifiers at once")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data, model = data_folder(args.data), data_folder(args.model)
    out = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs")) / args.output
    files = sorted(p for p in data.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    if not files:
        print(f"no {' or '.join('*' + s for s in SUFFIXES)} files under {data}", file=sys.stderr)
        return 1

    import ray

    ray.init()  # the run's Ray cluster (RAY_ADDRESS); outside TauGrid, a Ray of its own
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # predictions in the order of the input
    context.enable_progress_bars = False  # the run's log, not a terminal
    # Half a CPU each, so that the read tasks find room beside the actors on one-CPU workers.
    lines = ray.data.read_text([str(f) for f in files], include_paths=True, num_cpus=0.5)
    predictions = lines.map_batches(
        Predict,
        fn_constructor_kwargs={"model_dir": str(model)},
        batch_size=args.batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=args.actors),
        num_cpus=0.5,
    )

    names = {str(f): f.relative_to(data).as_posix() for f in files}
    out.mkdir(parents=True, exist_ok=True)
    rows = positive_rows = labelled = agreed = 0
    with open(out / "predictions.jsonl", "w", encoding="utf-8") as handle:
        for batch in predictions.iter_batches(batch_size=args.batch_size, batch_format="numpy"):
            for index in range(len(batch["text"])):
                label = int(batch["label"][index])
                answer = int(batch["predicted"][index])
                row = {
                    "file": names.get(path := str(batch["path"][index]), Path(path).name),
                    "text": str(batch["text"][index]),
                    "label": None if label == NO_LABEL else label,
                    "positive": float(batch["positive"][index]),
                    "predicted": answer,
                    "words": int(batch["words"][index]),
                }
                handle.write(json.dumps(row) + "\n")
                rows += 1
                positive_rows += answer
                if label != NO_LABEL:
                    labelled += 1
                    agreed += int(answer == label)
    share = positive_rows / rows if rows else 0.0
    summary = {
        "rows": rows,
        "positive": positive_rows,
        "positive_share": round(share, 6),
        "labelled": labelled,
        "agreed": agreed,
        "files": len(files),
    }
    (out / "summary.json").write_text(json.dumps(summary, sort_keys=True) + "\n", "utf-8")
    metrics = {"rows": float(rows), "positive_share": share}
    if labelled:
        metrics["agreement"] = agreed / labelled
    if tau is not None:
        tau.log_metrics(0, **metrics)
        tau.flush(timeout=10)
    print(
        f"predicted {rows} rows of {len(files)} files with the model at {model}: "
        f"{positive_rows} positive ({share:.1%}); the labels of {agreed} of {labelled} "
        "labelled rows agree"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
