#!/usr/bin/env python3
"""Fusion study over TREC run files (docs/retrieval.md, "Fusion study").

Reads the document rankings `toolgraph eval retrieval --run-file` writes for the bm25 and the
dense mode, fuses them at document level in several ways and prints nDCG@10 and recall@10 of
each (computed as toolgraph and BEIR compute them: graded gains, log2 discount).

    python3 scripts/fusion-study.py QRELS.tsv BM25.run DENSE.run [HYBRID.run]

Standard library only. It is a measuring aid, not part of the product: the service fuses with
RRF (crates/rag/src/fusion.rs).
"""
import math, sys
from urllib.parse import unquote
from collections import defaultdict

def qrels(path):
    q = defaultdict(dict)
    for i, line in enumerate(open(path)):
        p = line.split('\t')
        if i == 0 and not p[2].strip().isdigit():
            continue
        q[p[0]][p[1]] = int(p[2])
    return q

def run(path):
    r = defaultdict(list)
    for line in open(path):
        qid, _, doc, rank, score, _ = line.split()
        r[unquote(qid)].append((unquote(doc), float(score)))
    return r

def ndcg(ranked, rel, k=10):
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted([g for g in rel.values() if g > 0], reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0

def recall(ranked, rel, k):
    tot = sum(1 for g in rel.values() if g > 0)
    return sum(1 for d in ranked[:k] if rel.get(d, 0) > 0) / tot if tot else 0.0

def rrf(b, d, k=60, wb=1.0, wd=1.0):
    s = defaultdict(float)
    for w, lst in ((wb, b), (wd, d)):
        for i, (doc, _) in enumerate(lst):
            s[doc] += w / (k + i + 1)
    return sorted(s, key=lambda x: -s[x])

def minmax(lst):
    if not lst: return {}
    hi, lo = lst[0][1], min(x[1] for x in lst)
    return {doc: (sc - lo) / (hi - lo) if hi > lo else 1.0 for doc, sc in lst}

def convex(b, d, alpha=0.5):
    nb, nd = minmax(b), minmax(d)
    s = defaultdict(float)
    for doc, v in nb.items(): s[doc] += (1 - alpha) * v
    for doc, v in nd.items(): s[doc] += alpha * v
    return sorted(s, key=lambda x: -s[x])

def zscore(lst):
    if len(lst) < 2: return {doc: 0.0 for doc, _ in lst}
    xs = [x[1] for x in lst]; m = sum(xs) / len(xs); sd = (sum((x - m) ** 2 for x in xs) / len(xs)) ** .5 or 1
    return {doc: (sc - m) / sd for doc, sc in lst}

def zfuse(b, d, alpha=0.5):
    nb, nd = zscore(b), zscore(d)
    lo_b = min(nb.values(), default=0); lo_d = min(nd.values(), default=0)
    docs = set(nb) | set(nd)
    s = {x: (1 - alpha) * nb.get(x, lo_b) + alpha * nd.get(x, lo_d) for x in docs}
    return sorted(s, key=lambda x: -s[x])

def evaluate(qr, qids, fn):
    n = [ndcg(fn(q), qr[q]) for q in qids]
    r10 = [recall(fn(q), qr[q], 10) for q in qids]
    return sum(n) / len(n), sum(r10) / len(r10)

if __name__ == '__main__':
    qr = qrels(sys.argv[1]); B = run(sys.argv[2]); D = run(sys.argv[3])
    qids = [q for q in qr if q in B or q in D]
    print(f"queries {len(qids)}")
    rows = [
        ("bm25", lambda q: [x for x, _ in B[q]]),
        ("dense", lambda q: [x for x, _ in D[q]]),
    ]
    if len(sys.argv) > 4:
        H = run(sys.argv[4]); rows.append(("hybrid (toolgraph, chunk-level rrf60)", lambda q: [x for x, _ in H[q]]))
    for k in (60, 30, 20, 10, 5):
        rows.append((f"doc-level rrf k={k}", lambda q, k=k: rrf(B[q], D[q], k)))
    for a in (0.3, 0.4, 0.5, 0.6, 0.7):
        rows.append((f"minmax convex a={a}", lambda q, a=a: convex(B[q], D[q], a)))
    for a in (0.5,):
        rows.append((f"zscore a={a}", lambda q, a=a: zfuse(B[q], D[q], a)))
    for name, fn in rows:
        nd, r = evaluate(qr, qids, fn)
        print(f"{name:45s} ndcg@10 {nd:.4f} recall@10 {r:.4f}")
