"""OpenAI's official Python SDK (PyPI `openai`) against `toolgraph serve`'s chat completions.

Usage: openai_client.py BASE_URL API_KEY. Prints, as one JSON object, what the client saw:
the models, a whole answer, a streamed one continuing its conversation, a turn that waits for
an approval, a model that fails mid-stream, and the errors of a wrong model, key, tenant and a
missing user. The Rust test (tests/openai.rs) asserts on it.
"""

import json
import sys

import openai

base, key = sys.argv[1], sys.argv[2]
headers = {"X-Tenant-Slug": "demo", "X-User-Id": "1"}


def client(key=key, headers=headers):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, default_headers=headers, max_retries=0, timeout=30)


def refused(call):
    try:
        call()
    except openai.APIStatusError as e:
        return {"status": e.status_code, "class": type(e).__name__, "body": e.body}
    return None


c = client()
out = {"models": sorted(m.id for m in c.models.list())}

r = c.chat.completions.create(
    model="assistant",
    messages=[{"role": "system", "content": "the agent's own prompt decides"}, {"role": "user", "content": "hola"}],
)
out["whole"] = {
    "id": r.id,
    "object": r.object,
    "model": r.model,
    "content": r.choices[0].message.content,
    "role": r.choices[0].message.role,
    "finish": r.choices[0].finish_reason,
    "extra": r.model_extra,
    "usage": r.usage.model_dump() if r.usage else None,
}

chunks = list(
    c.chat.completions.create(
        model="assistant",
        messages=[{"role": "user", "content": [{"type": "text", "text": "¿y ahora?"}]}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"conversation_id": r.model_extra["conversation_id"]},
    )
)
with_choices = [ch for ch in chunks if ch.choices]
out["stream"] = {
    "chunks": len(chunks),
    "object": chunks[0].object,
    "first_role": with_choices[0].choices[0].delta.role,
    "text": "".join(ch.choices[0].delta.content or "" for ch in with_choices),
    "finish": [ch.choices[0].finish_reason for ch in with_choices],
    "last_extra": chunks[-1].model_extra,
    "usage": [ch.usage.model_dump() for ch in chunks if ch.usage],
    "usage_last": chunks[-1].usage is not None and not chunks[-1].choices,
}

r = c.chat.completions.create(model="assistant", messages=[{"role": "user", "content": "Guarda una nota sobre Docker"}])
out["pending"] = {"content": r.choices[0].message.content, "extra": r.model_extra}
# Another message while the write waits: refused, naming what waits.
out["busy"] = refused(
    lambda: c.chat.completions.create(
        model="assistant",
        messages=[{"role": "user", "content": "otra cosa"}],
        extra_body={"conversation_id": r.model_extra["conversation_id"]},
    )
)

try:
    text = ""
    for ch in c.chat.completions.create(model="assistant", messages=[{"role": "user", "content": "hola"}], stream=True):
        text += (ch.choices[0].delta.content or "") if ch.choices else ""
    out["stream_error"] = {"raised": False, "text": text}
except openai.APIError as e:
    out["stream_error"] = {"raised": True, "class": type(e).__name__, "message": e.message}

out["unknown_model"] = refused(lambda: c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hola"}]))
out["wrong_key"] = refused(lambda: client(key="sk-wrong").models.list())
out["other_tenant"] = refused(
    lambda: client(headers={**headers, "X-Tenant-Id": "8"}).chat.completions.create(
        model="assistant", messages=[{"role": "user", "content": "hola"}]
    )
)
out["no_user"] = refused(
    lambda: client(headers={"X-Tenant-Slug": "demo"}).chat.completions.create(
        model="assistant", messages=[{"role": "user", "content": "hola"}]
    )
)
out["assistant_last"] = refused(
    lambda: c.chat.completions.create(model="assistant", messages=[{"role": "assistant", "content": "hola"}])
)
# A client that sends the whole conversation each time and no id, as OpenAI's API expects.
first = c.chat.completions.create(model="assistant", messages=[{"role": "user", "content": "¿Cuánto es 6 por 7?"}])
history = [
    {"role": "system", "content": "a client's own prompt"},
    {"role": "user", "content": "¿Cuánto es 6 por 7?"},
    {"role": "assistant", "content": first.choices[0].message.content},
    {"role": "user", "content": "¿Y por 8?"},
]
again = c.chat.completions.create(model="assistant", messages=history)
out["stateless"] = {
    "first": first.model_extra["conversation_id"],
    "again": again.model_extra["conversation_id"],
    "reply": again.choices[0].message.content,
}
print(json.dumps(out))
