"""LangGraph's Python SDK (PyPI `langgraph-sdk`) against `toolgraph serve`'s threads and runs.

Usage: langgraph_threads.py BASE_URL API_KEY. Prints, as one JSON object, what the client saw:
a thread made, read, made again with the same id, streamed a calculator turn in three modes, paused on a write, resumed
(approved) in a stream of its own nodes, tool result and tokens, paused again and refused an
`edit`, then rejected by a run in the background; searched, counted, updated,
its history, another user's view, and deleted. The Rust test (tests/langgraph.rs) asserts on it.
"""

import json
import sys
import threading
import time

import langgraph_common
from langgraph_common import refused

base, key = sys.argv[1], sys.argv[2]


def client_of(user):
    return langgraph_common.client_of(base, key, user)


client = client_of(1)
out = {}
thread = client.threads.create(metadata={"course": "iv"})
tid = thread["thread_id"]
out["created"] = thread
out["got"] = client.threads.get(tid)
# The same id again: refused, or the thread as it is with `if_exists: "do_nothing"`.
out["again"] = refused(lambda: client.threads.create(thread_id=tid))
out["again_do_nothing"] = client.threads.create(thread_id=tid, metadata={"course": "other"}, if_exists="do_nothing")

parts = client.runs.stream(
    tid,
    "assistant",
    input={"messages": [{"role": "user", "content": "¿Cuánto es 6 por 7?"}]},
    stream_mode=["values", "updates", "messages-tuple"],
)
out["first_run"] = [{"event": p.event, "data": p.data, "id": p.id} for p in parts]
out["state"] = client.threads.get_state(tid)

# The run again: whole, and after one of its events (what the SDK sends after a drop).
run_id = out["first_run"][0]["data"]["run_id"]
out["run"] = client.runs.get(tid, run_id)
out["joined"] = [{"event": p.event, "data": p.data, "id": p.id} for p in client.runs.join_stream(tid, run_id)]
first_chunk = next(p for p in out["first_run"] if p["event"] == "messages")
out["first_chunk_id"] = first_chunk["id"]
joined = client.runs.join_stream(tid, run_id, stream_mode="messages-tuple", last_event_id=first_chunk["id"])
out["joined_after"] = [{"event": p.event, "data": p.data, "id": p.id} for p in joined]
out["join_unknown"] = refused(lambda: list(client.runs.join_stream(tid, "no-such-run")))

# A copy: the same metadata and conversation, a thread of its own (deleted, so the count below
# holds the two threads made).
copied = client.threads.copy(tid)
out["copied"] = client.threads.get(copied["thread_id"])
client.threads.delete(copied["thread_id"])
out["original_after_copy"] = client.threads.get_state(tid)

out["paused"] = client.runs.wait(
    tid, "assistant", input={"messages": [{"role": "human", "content": "Guarda una nota: examen el viernes"}]}
)
out["interrupted"] = client.threads.get(tid)
out["copy_paused"] = refused(lambda: client.threads.copy(tid))
parts = client.runs.stream(
    tid,
    "assistant",
    command={"resume": {"decisions": [{"type": "approve"}]}},
    stream_mode=["values", "messages-tuple", "updates", "tasks"],
)
out["resumed"] = [{"event": p.event, "data": p.data} for p in parts]
out["runs_after_resume"] = [r["run_id"] for r in client.runs.list(tid)]
out["resume_again"] = refused(
    lambda: client.runs.wait(tid, "assistant", command={"resume": {"decisions": [{"type": "approve"}]}})
)

parts = client.runs.stream(
    tid, "assistant", input={"messages": [{"role": "user", "content": "Y otra: repaso el jueves"}]}, stream_mode="tasks"
)
out["paused_tasks"] = [{"event": p.event, "data": p.data} for p in parts]
edit = {"type": "edit", "edited_action": {"name": "note_write", "args": {"text": "repaso el miércoles"}}}
out["edit"] = refused(lambda: client.runs.wait(tid, "assistant", command={"resume": {"decisions": [edit]}}))
waiting = langgraph_common.waiting_in(client.threads.get(tid))[0]["id"]
out["edit_by_id"] = refused(lambda: client.runs.wait(tid, "assistant", command={"resume": {waiting: edit}}))
out["other_assistant"] = refused(
    lambda: client.runs.wait(tid, "helper", command={"resume": {"decisions": [{"type": "approve"}]}})
)
# Decided in the background: the resumed run is a run like any other, joined for the values.
rejecting = client.runs.create(tid, "assistant", command={"resume": {"decisions": [{"type": "reject"}]}})
out["rejecting"] = rejecting
out["rejected"] = client.runs.join(tid, rejecting["run_id"])
out["rejecting_got"] = client.runs.get(tid, rejecting["run_id"])

# Stateless runs: a thread of their own, gone when the run ends (the count below shows it).
out["stateless_wait"] = client.runs.wait(None, "assistant", input={"messages": [{"role": "user", "content": "hola"}]})
parts = client.runs.stream(
    None, "assistant", input={"messages": [{"role": "user", "content": "adiós"}]}, stream_mode="messages-tuple"
)
out["stateless_stream"] = [{"event": p.event, "data": p.data} for p in parts]
# One kept when it ends (`on_completion: "keep"`): its thread holds the turn, then is deleted.
# Read to its end before the thread is: the run ends with its stream.
parts = list(client.runs.stream(
    None, "assistant", input={"messages": [{"role": "user", "content": "gracias"}]}, on_completion="keep"
))
kept = next(p.data["thread_id"] for p in parts if p.event == "metadata")
out["kept_state"] = client.threads.get_state(kept)
client.threads.delete(kept)
out["stateless_resume"] = refused(lambda: client.runs.wait(None, "assistant", command={"resume": True}))
# Refused stateless runs leave no thread behind (the count below): a mode not served, and a
# message over the limit (refused once its thread was made).
hola = {"messages": [{"role": "user", "content": "hola"}]}
out["stateless_bad_mode"] = refused(lambda: list(client.runs.stream(None, "assistant", input=hola, stream_mode="events")))
too_long = {"messages": [{"role": "user", "content": "x" * 5000}]}
out["stateless_too_long"] = refused(lambda: client.runs.wait(None, "assistant", input=too_long))

# A run cancelled while its model is slow: the stream ends with an error event, the run's status
# says so, and the thread takes the next run.
hold = client.threads.create()["thread_id"]
seen = []


def consume():
    slow = {"messages": [{"role": "user", "content": "cuéntame algo largo"}]}
    for p in client_of(1).runs.stream(hold, "assistant", input=slow, stream_mode="messages-tuple"):
        seen.append((p.event, p.data))


def slow_run():
    """Starts the slow run streaming on a thread of its own; it and its run id once it told."""
    seen.clear()
    reader = threading.Thread(target=consume)
    reader.start()
    for _ in range(200):
        if seen:
            break
        time.sleep(0.05)
    return reader, seen[0][1]["run_id"]


reader, held_run = slow_run()
out["cancel_unknown"] = refused(lambda: client.runs.cancel(hold, "no-such-run"))
started = time.monotonic()
client.runs.cancel(hold, held_run, wait=True)
out["cancel_seconds"] = time.monotonic() - started
# Read before the stream is joined: `wait` answered once the run had ended.
out["cancelled_status"] = client.runs.get(hold, held_run)["status"]
out["cancelled_state"] = client.threads.get_state(hold)
reader.join(20)
out["cancelled_events"] = [e for e, _ in seen]
out["cancelled_error"] = next((d for e, d in seen if e == "error"), None)
out["after_cancel"] = client.runs.wait(hold, "assistant", input={"messages": [{"role": "user", "content": "¿sigues ahí?"}]})
# Cancelled with `rollback`: another slow run is stopped and what it wrote goes — the thread is
# as it was before it, the run is gone; an earlier run cannot be rolled back.
out["before_rollback"] = client.threads.get_state(hold)["values"]
reader, rolled = slow_run()
client.runs.cancel(hold, rolled, wait=True, action="rollback")
reader.join(20)
out["rolled_back_state"] = client.threads.get_state(hold)["values"]
out["rolled_back_get"] = refused(lambda: client.runs.get(hold, rolled))
out["rollback_earlier"] = refused(lambda: client.runs.cancel(hold, held_run, action="rollback"))
client.threads.delete(hold)

other = client.threads.create(metadata={"course": "ssoo"})
out["search"] = [t["thread_id"] for t in client.threads.search(metadata={"course": "iv"})]
out["count"] = client.threads.count()
out["idle"] = [t["thread_id"] for t in client.threads.search(status="idle")]
out["untracked"] = refused(lambda: client.threads.search(status="error"))
out["too_much_metadata"] = refused(lambda: client.threads.update(tid, metadata={"notes": "x" * 20000}))
out["updated"] = client.threads.update(tid, metadata={"term": "2026"})
out["history"] = client.threads.get_history(tid, limit=3)
out["other_user"] = refused(lambda: client_of(2).threads.get(tid))
out["other_user_run"] = refused(
    lambda: client_of(2).runs.wait(tid, "assistant", input={"messages": [{"role": "user", "content": "hola"}]})
)
out["unknown_mode"] = refused(
    lambda: list(client.runs.stream(other["thread_id"], "assistant", input={"messages": [{"role": "user", "content": "hola"}]}, stream_mode="events"))
)
# A run whose model fails: an `error` event, the run's status `error`; `runs/wait` answers 502.
hi = {"messages": [{"role": "user", "content": "hola otra vez"}]}
parts = [(p.event, p.data) for p in client.runs.stream(other["thread_id"], "assistant", input=hi)]
out["failed_events"] = [e for e, _ in parts]
failed_run = next(d["run_id"] for e, d in parts if e == "metadata")
out["failed_status"] = client.runs.get(other["thread_id"], failed_run)["status"]
out["failed_wait"] = refused(lambda: client.runs.wait(other["thread_id"], "assistant", input=hi))
client.threads.delete(tid)
out["deleted"] = refused(lambda: client.threads.get(tid))
out["other_thread"] = other["thread_id"]
print(json.dumps(out))
