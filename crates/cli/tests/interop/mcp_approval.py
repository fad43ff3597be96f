"""The official Python MCP SDK's `Client` (PyPI `mcp`) calling toolgraph's exported write tool
`note_write`, answering its approval questions as a person at the client would.

Usage (prints one JSON object of what it saw):
  mcp_approval.py MODE stdio TOOLGRAPH CONFIG DATA_DIR
  mcp_approval.py MODE http URL [HEADER=VALUE...]
MODE: `legacy` (the initialize handshake; the server asks by a request) or `auto` (the newest
version both speak; on 2026-07-28 the server answers `input_required` and the client calls again).
"""
import asyncio
import json
import sys

import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def text(result):
    return result.content[0].text if result.content else ""


async def run(server, mode):
    asked = []
    answer = {"action": "accept", "approve": True}

    async def person(_context, params):
        asked.append(params.message)
        if answer["action"] != "accept":
            return types.ElicitResult(action=answer["action"])
        return types.ElicitResult(action="accept", content={"approve": answer["approve"]})

    out = {}
    async with Client(server, mode=mode, elicitation_callback=person) as client:
        out["protocol"] = client.protocol_version
        tools = await client.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        write = next(t for t in tools.tools if t.name == "note_write")
        out["write_read_only_hint"] = bool(write.annotations and write.annotations.read_only_hint)
        r = await client.call_tool("note_write", {"title": "approved", "body": "written after a yes"})
        out["approved"] = {"is_error": r.is_error, "text": text(r)}
        answer.update(action="accept", approve=False)
        r = await client.call_tool("note_write", {"title": "unticked", "body": "must not be written"})
        out["unticked"] = {"is_error": r.is_error, "text": text(r)}
        answer.update(action="decline")
        r = await client.call_tool("note_write", {"title": "declined", "body": "must not be written"})
        out["declined"] = {"is_error": r.is_error, "text": text(r)}
        r = await client.call_tool("note_write", {"title": ""})
        out["invalid"] = {"is_error": r.is_error, "text": text(r)}
        r = await client.call_tool("note_list", {})
        out["notes"] = r.structured_content
    out["asked"] = asked
    return out


async def main():
    mode, transport = sys.argv[1], sys.argv[2]
    if transport == "stdio":
        toolgraph, config, data_dir = sys.argv[3:6]
        server = StdioServerParameters(command=toolgraph, args=["--config", config, "--data-dir", data_dir, "mcp"])
        out = await run(server, mode)
    else:
        url, headers = sys.argv[3], dict(h.split("=", 1) for h in sys.argv[4:])
        async with create_mcp_http_client(headers=headers) as http:
            out = await run(streamable_http_client(url, http_client=http), mode)
    print(json.dumps(out, ensure_ascii=False))


asyncio.run(main())
