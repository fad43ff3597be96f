"""The official Python MCP SDK's client (PyPI `mcp`) reading a person's memory from a running
`toolgraph serve`'s /mcp, as resources.

Usage (prints one JSON object of what it saw):
  mcp_memory.py URL [HEADER=VALUE...]
"""
import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def main():
    url, headers = sys.argv[1], dict(h.split("=", 1) for h in sys.argv[2:])
    out = {}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_resources()
                memories = [x for x in listed.resources if str(x.uri).startswith("toolgraph://memory/")]
                out["memories"] = [
                    {"uri": str(x.uri), "name": x.name, "mime": x.mime_type, "description": x.description}
                    for x in memories
                ]
                out["read"] = []
                for x in memories:
                    got = await session.read_resource(x.uri)
                    out["read"].append({"mime": got.contents[0].mime_type, "text": got.contents[0].text})
    print(json.dumps(out, ensure_ascii=False))


asyncio.run(main())
