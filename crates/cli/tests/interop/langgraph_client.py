"""LangGraph's Python SDK (PyPI `langgraph-sdk`) against `toolgraph serve`'s assistants.

Usage: langgraph_client.py BASE_URL API_KEY. Prints, as one JSON object, what the client saw:
the assistants found, counted, paged, filtered and read, one's graph and schemas, and an
unknown one. The Rust test (tests/langgraph.rs) asserts on it.
"""

import json
import sys

import httpx
from langgraph_sdk import get_sync_client

base, key = sys.argv[1], sys.argv[2]
client = get_sync_client(url=base, headers={"Authorization": f"Bearer {key}", "X-Tenant-Slug": "demo"})

out = {}
found = client.assistants.search()
out["search"] = [a["assistant_id"] for a in found]
out["first"] = found[0]
out["count"] = client.assistants.count()
page = client.assistants.search(limit=1, response_format="object")
out["page"] = {"ids": [a["assistant_id"] for a in page["assistants"]], "next": page["next"]}
out["second_page"] = [a["assistant_id"] for a in client.assistants.search(limit=1, offset=1)]
out["by_name"] = [a["assistant_id"] for a in client.assistants.search(name="HELP")]
out["get"] = client.assistants.get("assistant")
out["graph"] = client.assistants.get_graph("assistant")
out["schemas"] = client.assistants.get_schemas("assistant")
try:
    client.assistants.get("nope")
    out["unknown"] = None
except httpx.HTTPStatusError as e:
    out["unknown"] = {"status": e.response.status_code, "body": e.response.json()}
print(json.dumps(out))
