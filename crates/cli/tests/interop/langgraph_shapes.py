"""The same LangGraph Python SDK calls against `toolgraph serve` and LangGraph's own server
(`langgraph dev`), and where the shapes of their answers differ.

Usage: langgraph_shapes.py TOOLGRAPH_URL LANGGRAPH_URL API_KEY. Each server runs the same agent
(a calculator, and a note written once the person approves it) over the same scripted model.
The calls: the assistants, a thread made and read, a calculator turn streamed in `values`,
`updates`, `messages-tuple`, `debug`, `tasks` and `checkpoints`, its state and history, a note's turn paused for approval, the
thread and state while it waits, the approval, a state update, a thread search, the runs and
one run; then a calculator turn through `front` (the agent run as a sub-graph) streamed with
`stream_subgraphs`. Prints, as one JSON object, `differences` — each a path and how it differs: `+` only
toolgraph sends it, `-` only LangGraph does, `~` both with other JSON types — and what each
server answered. The Rust test (tests/langgraph.rs) holds them against docs/langgraph.md.
"""

import json
import re
import sys

import langgraph_common

toolgraph, langgraph, key = sys.argv[1], sys.argv[2], sys.argv[3]


def said(message):
    return {"messages": [{"role": "user", "content": message}]}


def answers(base):
    """Every answer of the calls, by name; a stream's events grouped by event name."""
    client = langgraph_common.client_of(base, key, 1)
    out = {"assistants": client.assistants.search(limit=10)}
    thread = client.threads.create(metadata={"course": "iv"})
    tid = thread["thread_id"]
    out["thread_created"] = thread
    out["thread"] = client.threads.get(tid)
    stream = {}
    for part in client.runs.stream(
        tid,
        "assistant",
        input=said("¿Cuánto es 6 por 7?"),
        stream_mode=["values", "updates", "messages-tuple", "debug", "tasks", "checkpoints"],
    ):
        data = part.data
        if part.event == "messages":
            data = {"message": data[0], "metadata": data[1]}
        stream.setdefault(part.event, []).append(data)
    out["stream"] = stream
    out["state"] = client.threads.get_state(tid)
    out["history"] = client.threads.get_history(tid, limit=5)
    out["paused"] = client.runs.wait(tid, "assistant", input=said("Guarda una nota: examen el viernes"))
    out["thread_interrupted"] = client.threads.get(tid)
    out["state_interrupted"] = client.threads.get_state(tid)
    out["resumed"] = client.runs.wait(tid, "assistant", command={"resume": {"decisions": [{"type": "approve"}]}})
    out["updated"] = client.threads.update_state(
        tid, {"messages": [{"type": "ai", "content": "Y 6 por 8 son 48."}]}, as_node="agent"
    )
    out["search"] = client.threads.search(metadata={"course": "iv"})
    runs = client.runs.list(tid)
    out["runs"] = runs
    out["run"] = client.runs.get(tid, runs[0]["run_id"])
    # The same calculator turn through `front`, which runs the agent as a sub-graph, its
    # events asked for in the sub-graph's namespace.
    front = client.threads.create()["thread_id"]
    sub = {}
    for part in client.runs.stream(
        front,
        "front",
        input=said("¿Cuánto es 6 por 8?"),
        stream_mode=["values", "updates", "messages-tuple", "debug", "tasks"],
        stream_subgraphs=True,
    ):
        data = part.data
        if part.event.split("|")[0] == "messages":
            data = {"message": data[0], "metadata": data[1]}
        sub.setdefault(namespaced(part.event), []).append(data)
    out["subgraphs"] = sub
    return out


def namespaced(event):
    """An event's name with the task of each namespace part as `<task>` (ids differ)."""
    mode, _, namespace = event.partition("|")
    if not namespace:
        return mode
    return mode + "|" + "|".join(part.split(":")[0] + ":<task>" for part in namespace.split("|"))


def kind(value):
    if value is None:
        return "null"
    return {bool: "bool", int: "number", float: "number", str: "string"}.get(type(value), "other")


def merged(a, b):
    """One shape for two values at the same place (list items, or a type that varies)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merged(a.get(k), b.get(k)) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        return [merged(a[0] if a else None, b[0] if b else None)] if a or b else []
    if a == b:
        return a
    if isinstance(a, str) and isinstance(b, str):
        return "|".join(sorted(set(a.split("|")) | set(b.split("|"))))
    # A field that is an object in one place and a scalar in another: the object's shape.
    return a if isinstance(a, (dict, list)) else b


def named(key):
    """A key that is an id (of a task, a checkpoint): `<id>`, whatever the id."""
    return "<id>" if re.fullmatch(r"[0-9a-f]{8}-[0-9a-f-]{27,}(-[0-9]+)?", key) else key


def shape(value):
    """The value's shape: objects' keys, a list's items merged, scalars' JSON types."""
    if isinstance(value, dict):
        return {named(k): shape(v) for k, v in value.items()}
    if isinstance(value, list):
        items = None
        for v in value:
            items = merged(items, shape(v))
        return [] if items is None else [items]
    return kind(value)


def differences(ours, theirs, path):
    """Where shape `ours` (toolgraph's) differs from `theirs` (LangGraph's)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for k in sorted({**ours, **theirs}):
            at = f"{path}.{k}"
            if k not in theirs:
                yield f"+ {at}"
            elif k not in ours:
                yield f"- {at}"
            else:
                yield from differences(ours[k], theirs[k], at)
    elif isinstance(ours, list) and isinstance(theirs, list):
        if ours and theirs:
            yield from differences(ours[0], theirs[0], f"{path}[]")
    elif isinstance(ours, str) and isinstance(theirs, str):
        # A null where the other has a value is the same field, not set yet.
        a, b = set(ours.split("|")) - {"null"}, set(theirs.split("|")) - {"null"}
        if a and b and a != b:
            yield f"~ {path} {ours} {theirs}"
    else:
        as_text = lambda s: s if isinstance(s, str) else ("object" if isinstance(s, dict) else "list")
        if "null" not in (as_text(ours), as_text(theirs)):
            yield f"~ {path} {as_text(ours)} {as_text(theirs)}"


ours, theirs = answers(toolgraph), answers(langgraph)
found = sorted(set(differences(shape(ours), shape(theirs), "")))
print(json.dumps({"differences": found, "toolgraph": ours, "langgraph": theirs}))
