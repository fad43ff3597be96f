"""The analytics agent of examples/bench/toolgraph-sqlite.toml as a LangGraph graph, for
LangGraph's own server (`langgraph dev`) in `scripts/bench-agent-server`: one `general_query`
tool, a model at MOCK_LLM_BASE_URL (the shared harness's mock, which calls the tool once and then
streams a 40-token answer), the same system prompt, the prebuilt ReAct loop (agent -> tools ->
agent) LangGraph's users write.
"""

import json
import os

from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

SYSTEM_PROMPT = (
    "You are a helpful analytics assistant. Use the general_query tool to run SQL when the user asks about data."
)


@tool
def general_query(sql: str) -> str:
    """Run a read-only SQL query against the tenant's database and return rows as JSON."""
    return json.dumps({"columns": ["?column?"], "rows": [[1]], "rowCount": 1, "sql": sql})


TOOLS = [general_query]
LLM = ChatOpenAI(
    model="mock",
    base_url=os.environ.get("MOCK_LLM_BASE_URL", "http://127.0.0.1:8090/v1"),
    api_key="sk-mock",
    streaming=True,
    max_retries=0,
    temperature=0,
).bind_tools(TOOLS)


async def agent(state: MessagesState):
    return {"messages": [await LLM.ainvoke([SystemMessage(SYSTEM_PROMPT), *state["messages"]])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", ToolNode(TOOLS))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile()
