"""The agent `tests/langgraph.rs` runs on `toolgraph serve` (`assistant`: a calculator and a
`note_write` that waits for the person's approval), as a LangGraph graph for LangGraph's own
server (`langgraph dev`), over the same scripted model (SCRIPTED_MODEL_URL): the ReAct loop
LangGraph's users write, the write's approval asked with `interrupt` in LangChain's
human-in-the-loop shape; and `front`, a graph that runs it as its one node (a sub-graph). The
shape comparison (`langgraph_shapes.py`) drives both.
"""

import json
import os

from langchain_core.messages import SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import interrupt


@tool
def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression."""
    allowed = set("0123456789+-*/(). ")
    if not set(expression) <= allowed:
        return json.dumps({"error": "not arithmetic"})
    return json.dumps({"result": eval(expression)})  # noqa: S307 - digits and operators only


@tool
def note_write(title: str, body: str) -> str:
    """Saves a note for the person (a write: it waits for their approval)."""
    return json.dumps({"saved": True, "title": title})


TOOLS = {t.name: t for t in [calculator, note_write]}
LLM = ChatOpenAI(
    model="scripted",
    base_url=os.environ["SCRIPTED_MODEL_URL"],
    api_key="sk-scripted",
    streaming=True,
    max_retries=0,
    temperature=0,
).bind_tools(list(TOOLS.values()))


async def agent(state: MessagesState):
    return {"messages": [await LLM.ainvoke([SystemMessage("You are the assistant."), *state["messages"]])]}


def tools(state: MessagesState):
    out = []
    for call in state["messages"][-1].tool_calls:
        if call["name"] == "note_write":
            request = {"name": call["name"], "args": call["args"], "description": f"Save the note {call['args']}"}
            config = {"action_name": call["name"], "allowed_decisions": ["approve", "edit", "reject", "respond"]}
            answer = interrupt({"action_requests": [request], "review_configs": [config]})
            decision = (answer.get("decisions") or [{}])[0] if isinstance(answer, dict) else {}
            if decision.get("type") != "approve":
                out.append(ToolMessage("rejected by the person", tool_call_id=call["id"], name=call["name"]))
                continue
        out.append(ToolMessage(TOOLS[call["name"]].invoke(call["args"]), tool_call_id=call["id"], name=call["name"]))
    return {"messages": out}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", tools)
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile()

# `front` on toolgraph: a declared graph whose one node hands the turn to `assistant` (an
# `agent` node); here, the same agent as a sub-graph node.
front_builder = StateGraph(MessagesState)
front_builder.add_node("assistant", graph)
front_builder.add_edge(START, "assistant")
front = front_builder.compile()
