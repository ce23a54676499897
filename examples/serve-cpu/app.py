"""The reviews classifier as a Ray Serve application: ``POST /`` with ``{"text": "..."}``
answers ``{"positive": 0.93, "label": 1, "words": 4}``.

The model is the folder examples/train-on-data wrote (``model.json``: logistic-regression
weights over a bag of words; ``vocab.txt``: the words, one per line, in weight order), staged
read-only at ``$TAU_MODEL_DIR``. Text is cleaned exactly as examples/data-prep cleaned the
training data (lower case, letters only), so a word means what it meant in training.

Standard library and Ray Serve only. Try it without TauGrid, from a folder holding a model:
``TAU_MODEL_DIR=/tmp/model serve run app:app``.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from ray import serve

NOT_LETTERS = re.compile(r"[^a-z]+")
#: The longest text read (characters): a request cannot make a replica work without end.
MAX_TEXT = 100_000


def clean(text: str) -> str:
    return NOT_LETTERS.sub(" ", text.lower()).strip()


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class Classifier:
    """The trained model: a weight per vocabulary word and a bias."""

    def __init__(self, folder: Path) -> None:
        model = json.loads((folder / "model.json").read_text(encoding="utf-8"))
        words = (folder / "vocab.txt").read_text(encoding="utf-8").split()
        self.weights = [float(w) for w in model["weights"]]
        self.bias = float(model["bias"])
        if len(words) != len(self.weights):
            raise ValueError(f"{len(words)} words in vocab.txt, {len(self.weights)} weights")
        self.ids = {word: index for index, word in enumerate(words)}

    def predict(self, text: str) -> dict[str, Any]:
        found = {self.ids[word] for word in clean(text[:MAX_TEXT]).split() if word in self.ids}
        positive = sigmoid(self.bias + sum(self.weights[index] for index in found))
        return {"positive": round(positive, 6), "label": int(positive >= 0.5), "words": len(found)}


@serve.deployment
class ReviewsClassifier:
    def __init__(self) -> None:
        self.model = Classifier(Path(os.environ.get("TAU_MODEL_DIR", "model")))

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": 'send JSON: {"text": "..."}'}, status_code=400)
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str):
            return JSONResponse({"error": 'send JSON: {"text": "..."}'}, status_code=400)
        return JSONResponse(self.model.predict(text))


app = ReviewsClassifier.bind()
