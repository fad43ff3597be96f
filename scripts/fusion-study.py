#!/usr/bin/env python3
"""Fusion study over TREC run files (docs/retrieval.md, "Fusion study").

Reads the document rankings `toolgraph eval retrieval --run-file` writes for the bm25 and the
dense mode, fuses them at document level in several ways and prints nDCG@10 and recall@10 of
each (computed as toolgraph and BEIR compute them: graded gains, log2 discount).

    python3 scripts/fusion-study.py QRELS.tsv BM25.run DENSE.run [HYBRID.run] [--extra RUN]...

`--extra` adds further ranked lists (scripts/minilm-run.py writes one from the other offline
embedding model); with any, the study also fuses all the lists together.

Standard library only. It is a measuring aid, not part of the product: the service fuses with
RRF or DBSF (`rag.fusion`, crates/rag/src/fusion.rs).
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

def rrf(lists, k=60, weights=None):
    s = defaultdict(float)
    for j, lst in enumerate(lists):
        for i, (doc, _) in enumerate(lst):
            s[doc] += (weights[j] if weights else 1.0) / (k + i + 1)
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

def mean_sd(lst):
    """Mean and population standard deviation of a ranked list's scores."""
    xs = [x[1] for x in lst]; m = sum(xs) / len(xs)
    return m, (sum((x - m) ** 2 for x in xs) / len(xs)) ** .5

def zscore(lst):
    if len(lst) < 2: return {doc: 0.0 for doc, _ in lst}
    m, sd = mean_sd(lst); sd = sd or 1
    return {doc: (sc - m) / sd for doc, sc in lst}

def zfuse(lists, weights=None):
    """z-scores of each list summed; a document missing from a list gets that list's lowest."""
    s = defaultdict(float)
    zs = [zscore(lst) for lst in lists]
    docs = set().union(*zs)
    for j, z in enumerate(zs):
        lo = min(z.values(), default=0)
        for doc in docs:
            s[doc] += (weights[j] if weights else 1.0) * z.get(doc, lo)
    return sorted(s, key=lambda x: -s[x])

def dbsf(lists):
    """Distribution-based score fusion (Qdrant's DBSF): each list's scores mapped from
    mean ± 3 standard deviations onto [0, 1], clipped, and summed; missing counts 0."""
    s = defaultdict(float)
    for lst in lists:
        if not lst:
            continue
        m, sd = mean_sd(lst)
        lo, hi = m - 3 * sd, m + 3 * sd
        for doc, sc in lst:
            s[doc] += min(max((sc - lo) / (hi - lo), 0.0), 1.0) if hi > lo else 0.5
    return sorted(s, key=lambda x: -s[x])

def evaluate(qr, qids, fn):
    n = [ndcg(fn(q), qr[q]) for q in qids]
    r10 = [recall(fn(q), qr[q], 10) for q in qids]
    return sum(n) / len(n), sum(r10) / len(r10)

if __name__ == '__main__':
    import argparse
    ap = argparse.ArgumentParser(description='Fusion study over TREC run files.')
    ap.add_argument('qrels'); ap.add_argument('bm25'); ap.add_argument('dense'); ap.add_argument('hybrid', nargs='?')
    ap.add_argument('--extra', action='append', default=[], help='a further ranked list (repeatable)')
    args = ap.parse_args()
    qr = qrels(args.qrels); B = run(args.bm25); D = run(args.dense)
    X = [(path.rsplit('/', 1)[-1], run(path)) for path in args.extra]
    qids = [q for q in qr if q in B or q in D]
    print(f"queries {len(qids)}")
    rows = [
        ("bm25", lambda q: [x for x, _ in B[q]]),
        ("dense", lambda q: [x for x, _ in D[q]]),
    ]
    rows += [(name, lambda q, R=R: [x for x, _ in R[q]]) for name, R in X]
    if args.hybrid:
        H = run(args.hybrid); rows.append(("hybrid (toolgraph, chunk-level rrf60)", lambda q: [x for x, _ in H[q]]))
    for k in (60, 30, 20, 10, 5):
        rows.append((f"doc-level rrf k={k}", lambda q, k=k: rrf([B[q], D[q]], k)))
    for a in (0.3, 0.4, 0.5, 0.6, 0.7):
        rows.append((f"minmax convex a={a}", lambda q, a=a: convex(B[q], D[q], a)))
    rows.append(("zscore, equal weights", lambda q: zfuse([B[q], D[q]])))
    rows.append(("dbsf", lambda q: dbsf([B[q], D[q]])))
    for name, R in X:
        rows.append((f"bm25 + {name}: rrf k=60", lambda q, R=R: rrf([B[q], R[q]], 60)))
        rows.append((f"bm25 + {name}: zscore", lambda q, R=R: zfuse([B[q], R[q]])))
    if X:
        every = lambda q: [B[q], D[q]] + [R[q] for _, R in X]
        rows.append(("all lists: rrf k=60", lambda q: rrf(every(q), 60)))
        rows.append(("all lists: rrf k=20", lambda q: rrf(every(q), 20)))
        rows.append(("all lists: zscore, equal weights", lambda q: zfuse(every(q))))
        rows.append(("all lists: dbsf", lambda q: dbsf(every(q))))
    for name, fn in rows:
        nd, r = evaluate(qr, qids, fn)
        print(f"{name:45s} ndcg@10 {nd:.4f} recall@10 {r:.4f}")
