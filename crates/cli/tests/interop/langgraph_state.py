"""LangGraph's Python SDK (PyPI `langgraph-sdk`) updating a thread's state and forking it.

Usage: langgraph_state.py BASE_URL API_KEY. Prints, as one JSON object, what the client saw: a
turn run, a message written into the thread's state as the `agent` node (`update_state`), the
state and history after it, refused updates, the next turn, a run from the checkpoint before the
update (a fork), and an update from an earlier checkpoint. The Rust test (tests/langgraph.rs)
asserts on it.
"""

import json
import sys

import langgraph_common
from langgraph_common import refused

base, key = sys.argv[1], sys.argv[2]
client = langgraph_common.client_of(base, key, 1)
out = {}


def turn(tid, text, **kwargs):
    return client.runs.wait(tid, "assistant", input={"messages": [{"type": "human", "content": text}]}, **kwargs)


tid = client.threads.create()["thread_id"]
out["before_any_run"] = refused(lambda: client.threads.update_state(tid, {"messages": []}))
out["first"] = turn(tid, "¿Cuánto es 6 por 7?")
out["end_of_first"] = client.threads.get_history(tid, limit=1)[0]["checkpoint"]["checkpoint_id"]
out["updated"] = client.threads.update_state(
    tid, {"messages": [{"role": "assistant", "content": "Y 6 por 8 son 48."}]}, as_node="agent"
)
out["state"] = client.threads.get_state(tid)
out["thread"] = client.threads.get(tid)
out["history"] = client.threads.get_history(tid, limit=2)
out["unknown_node"] = refused(lambda: client.threads.update_state(tid, {"messages": []}, as_node="nope"))
out["unknown_long_node"] = refused(
    lambda: client.threads.update_state(tid, {"messages": []}, as_node="\x1b[2J" + "n" * 5000)
)
out["context"] = refused(lambda: client.threads.update_state(tid, {"context": {"userId": 2}}))
out["tool_call"] = refused(
    lambda: client.threads.update_state(
        tid, {"messages": [{"type": "ai", "content": "", "tool_calls": [{"id": "x1", "name": "calculator", "args": {}}]}]}
    )
)
out["second"] = turn(tid, "¿Y 6 por 9?")
out["forked"] = turn(tid, "¿Y 6 por 10?", checkpoint_id=out["end_of_first"])
out["forked_history"] = client.threads.get_history(tid, limit=100)
# An update from the checkpoint the fork started at: the thread forks again there.
out["updated_earlier"] = client.threads.update_state(
    tid,
    {"messages": [{"type": "human", "content": "Otra pregunta."}, {"type": "ai", "content": "Otra respuesta."}]},
    checkpoint_id=out["end_of_first"],
)
out["state_after_earlier"] = client.threads.get_state(tid)
out["no_such_checkpoint"] = refused(lambda: turn(tid, "¿Y?", checkpoint_id="999"))
print(json.dumps(out))
