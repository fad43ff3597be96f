"""LangGraph's Python SDK (PyPI `langgraph-sdk`) against `toolgraph serve`'s background runs,
run list, join and `multitask_strategy`.

Usage: langgraph_runs.py BASE_URL API_KEY. Prints, as one JSON object, what the client saw: a
run created in the background, joined, read and listed; a resume in the background with nothing
waiting refused; a
slow run that makes its thread busy, a second run refused (`reject`, an unknown strategy), then
one that interrupts it, one that rolls another back, and one enqueued behind another slow run. The Rust test
(tests/langgraph.rs) asserts on it.
"""

import json
import sys
import time

from langgraph_common import client_of, refused, waiting_in

base, key = sys.argv[1], sys.argv[2]
client = client_of(base, key, 1)
out = {}


def said(text):
    return {"messages": [{"role": "user", "content": text}]}


def wait_for(check, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


# A run in the background: answered at once, joined for the thread's values, then read and listed.
first = client.threads.create()["thread_id"]
created = []
run = client.runs.create(first, "assistant", input=said("hola"), on_run_created=lambda m: created.append(m["run_id"]))
out["on_run_created"] = created
out["created"] = run
out["joined"] = client.runs.join(first, run["run_id"])
out["got"] = client.runs.get(first, run["run_id"])
out["listed"] = client.runs.list(first)
out["listed_success"] = [r["run_id"] for r in client.runs.list(first, status="success")]
out["listed_error"] = client.runs.list(first, status="error")
out["listed_unknown"] = refused(lambda: client.runs.list(first, status="finished"))
out["resume_in_background"] = refused(lambda: client.runs.create(first, "assistant", command={"resume": True}))
out["join_unknown"] = refused(lambda: client.runs.join(first, "no-such-run"))

# Stateless in the background: a thread of its own, gone once the run ended, unless kept.
gone = client.runs.create(None, "assistant", input=said("hola sin hilo"))
out["stateless"] = gone
out["stateless_gone"] = wait_for(lambda: refused(lambda: client.threads.get(gone["thread_id"])) is not None)
kept = client.runs.create(None, "assistant", input=said("hola sin hilo"), on_completion="keep")
out["kept_joined"] = client.runs.join(kept["thread_id"], kept["run_id"])

# A slow run makes its thread busy; a second run is refused unless it says what to do.
busy = client.threads.create()["thread_id"]
slow = client.runs.create(busy, "assistant", input=said("cuéntame algo largo"))
out["busy_seen"] = wait_for(lambda: client.threads.get(busy)["status"] == "busy")
out["busy_search"] = [t["thread_id"] for t in client.threads.search(status="busy")]
out["reject"] = refused(lambda: client.runs.create(busy, "assistant", input=said("¿y ahora?")))
out["unknown_strategy"] = refused(
    lambda: client.runs.create(busy, "assistant", input=said("¿y ahora?"), multitask_strategy="later")
)
started = time.monotonic()
out["interrupting"] = client.runs.wait(busy, "assistant", input=said("¿sigues?"), multitask_strategy="interrupt")
out["interrupt_seconds"] = time.monotonic() - started
out["interrupted_status"] = client.runs.get(busy, slow["run_id"])["status"]
out["after_interrupt"] = [(r["run_id"], r["status"]) for r in client.runs.list(busy)]
out["strategies"] = [r["multitask_strategy"] for r in client.runs.list(busy)]
out["idle_after"] = client.threads.get(busy)["status"]

# `rollback`: the slow run is cancelled and what it wrote goes; the thread holds only this run's turn.
back = client.threads.create()["thread_id"]
doomed = client.runs.create(back, "assistant", input=said("cuéntame algo largo"))
wait_for(lambda: client.threads.get(back)["status"] == "busy")
out["rolled_back"] = client.runs.wait(back, "assistant", input=said("¿sigues?"), multitask_strategy="rollback")
out["rolled_back_run"] = refused(lambda: client.runs.get(back, doomed["run_id"]))
out["rolled_back_runs"] = [r["multitask_strategy"] for r in client.runs.list(back)]

# Enqueued behind another slow run: it starts once that one has ended, and both replies stay.
queue = client.threads.create()["thread_id"]
ahead = client.runs.create(queue, "assistant", input=said("despacio"))
wait_for(lambda: client.threads.get(queue)["status"] == "busy")
started = time.monotonic()
out["enqueued"] = client.runs.wait(queue, "assistant", input=said("y después"), multitask_strategy="enqueue")
out["enqueue_seconds"] = time.monotonic() - started
out["ahead_status"] = client.runs.get(queue, ahead["run_id"])["status"]
# Decisions in LangChain's human-in-the-loop format: an edit (refused when its arguments do not
# fit the tool), a rejection with a message the model reads, a response in the call's place.
hitl = client.threads.create()["thread_id"]
client.runs.wait(hitl, "assistant", input=said("apunta el examen"))
bad_edit = {"type": "edit", "edited_action": {"name": "note_write", "args": {"title": "Examen"}}}
out["edit_invalid"] = refused(lambda: client.runs.wait(hitl, "assistant", command={"resume": {"decisions": [bad_edit]}}))
out["still_waiting"] = client.threads.get(hitl)["status"]
edit = {"type": "edit", "edited_action": {"name": "note_write", "args": {"title": "Examen", "body": "El sábado."}}}
out["edited"] = client.runs.wait(hitl, "assistant", command={"resume": {"decisions": [edit]}})
client.runs.wait(hitl, "assistant", input=said("apunta el repaso"))
reject = {"type": "reject", "message": "No, mejor mañana."}
out["rejected_with_message"] = client.runs.wait(hitl, "assistant", command={"resume": {"decisions": [reject]}})
client.runs.wait(hitl, "assistant", input=said("apunta la tutoría"))
respond = {"type": "respond", "message": "Ya la apunté yo."}
out["responded"] = client.runs.wait(hitl, "assistant", command={"resume": {"decisions": [respond]}})
client.runs.wait(hitl, "assistant", input=said("apunta dos"))
waiting = [i["id"] for i in waiting_in(client.threads.get(hitl))]
uno = {"type": "edit", "edited_action": {"name": "note_write", "args": {"title": "Uno", "body": "uno, editado"}}}
out["partial_edit"] = client.runs.wait(hitl, "assistant", command={"resume": {waiting[0]: uno}})
out["after_partial"] = waiting_in(client.threads.get(hitl))
# The other in a later request: the first's edit was kept, and the run resumes with both.
dos = {"type": "reject", "message": "Dos no."}
out["both"] = client.runs.wait(hitl, "assistant", command={"resume": {"decisions": [dos]}})
# agent-chat-ui's way (agent-inbox's responses, a list): accept one write, edit another.
client.runs.wait(hitl, "assistant", input=said("apunta la cena"))
out["inbox_accepted"] = client.runs.wait(hitl, "assistant", command={"resume": [{"type": "accept", "args": None}]})
client.runs.wait(hitl, "assistant", input=said("apunta el desayuno"))
inbox_edit = {"type": "edit", "args": {"action": "note_write", "args": {"title": "Desayuno", "body": "A las ocho."}}}
out["inbox_edited"] = client.runs.wait(hitl, "assistant", command={"resume": [inbox_edit]})
print(json.dumps(out))
