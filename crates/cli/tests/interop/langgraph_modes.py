"""LangGraph's Python SDK (PyPI `langgraph-sdk`) streaming a grounded tutor's runs in the modes
written from its nodes: `debug`, `tasks`, `checkpoints` and `custom` (with the others).

Usage: langgraph_modes.py BASE_URL API_KEY. Prints, as one JSON object, what the client saw: a
question about the course streamed in every mode (sub-graphs asked for), a follow-up in `debug`
alone, a question the documents do not hold in `custom` alone, a run joined in `checkpoints`
after it ended, the thread's history, and the first run's events on the academy contract's route. The Rust test (tests/langgraph.rs) asserts on it.
"""

import json
import sys

import httpx

import langgraph_common

base, key = sys.argv[1], sys.argv[2]
client = langgraph_common.client_of(base, key, 1)
out = {}


def said(message):
    return {"messages": [{"role": "user", "content": message}]}


def parts_of(stream):
    return [{"event": p.event, "data": p.data} for p in stream]


tid = client.threads.create()["thread_id"]
every = ["values", "updates", "messages-tuple", "custom", "debug", "tasks", "checkpoints"]
out["every"] = parts_of(
    client.runs.stream(
        tid,
        "tutor",
        input=said("¿Cuándo es el examen final de Infraestructura Virtual y cuánto vale en la nota?"),
        stream_mode=every,
        stream_subgraphs=True,
    )
)
out["every_state"] = client.threads.get_state(tid)
out["every_head"] = client.threads.get_history(tid, limit=1)[0]
# The same run read on the academy contract's route: its frames there are the contract's only.
every_run = out["every"][0]["data"]["run_id"]
academy = httpx.get(
    f"{base}/api/chatbot/runs/{every_run}/events",
    params={"tenantSlug": "demo", "tenantId": 7, "userId": 1},
    headers={"Authorization": f"Bearer {key}", "X-Tenant-Slug": "demo"},
    timeout=30,
)
out["academy_status"] = [academy.status_code, academy.text[:300]]
out["academy_events"] = [line[len("event:"):].strip() for line in academy.text.splitlines() if line.startswith("event:")]
out["debug"] = parts_of(client.runs.stream(tid, "tutor", input=said("¿y la extraordinaria?"), stream_mode="debug"))
out["custom"] = parts_of(
    client.runs.stream(tid, "tutor", input=said("¿Quién es el rector de la universidad?"), stream_mode="custom")
)
run_id = out["custom"][0]["data"]["run_id"]
out["joined"] = parts_of(client.runs.join_stream(tid, run_id, stream_mode="checkpoints"))
out["history"] = client.threads.get_history(tid, limit=100)
print(json.dumps(out))
