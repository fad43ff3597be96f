"""The official Python MCP SDK's client (PyPI `mcp`) driving toolgraph's MCP server.

Usage (prints one JSON object of what it saw):
  mcp_client.py stdio TOOLGRAPH CONFIG DATA_DIR   — starts `toolgraph mcp`
  mcp_client.py http URL [HEADER=VALUE...]        — a running `toolgraph serve`'s /mcp
"""
import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def text(result):
    return result.content[0].text if result.content else ""


async def exercise(read, write):
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        out = {"server": init.server_info.name}
        tools = await session.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        out["read_only_hints"] = sorted({bool(t.annotations and t.annotations.read_only_hint) for t in tools.tools})
        calc = next(t for t in tools.tools if t.name == "calculator")
        out["calculator_schema"] = calc.input_schema
        r = await session.call_tool("calculator", {"expression": "6*7"})
        out["calc"] = {"is_error": r.is_error, "text": text(r), "structured": r.structured_content}
        r = await session.call_tool("bad_calculator", {"a": 1, "b": 2})
        out["plugin"] = {"is_error": r.is_error, "structured": r.structured_content}
        r = await session.call_tool("calculator", {"expression": "6*"})
        out["calc_error"] = {"is_error": r.is_error, "text": text(r)}
        r = await session.call_tool("note_write", {"title": "x", "text": "y"})
        out["write"] = {"is_error": r.is_error, "text": text(r)}
        r = await session.call_tool("rag_search", {"query": "examen final", "top_k": 1})
        out["search"] = {"is_error": r.is_error, "structured": r.structured_content}
        res = await session.list_resources()
        out["resources"] = [[str(x.uri), x.name] for x in res.resources]
        guide = next(x for x in res.resources if "guia" in str(x.uri))
        read = await session.read_resource(guide.uri)
        out["read"] = read.contents[0].text
        try:
            await session.read_resource("toolgraph://kb/docs/no/such.md")
            out["missing"] = "read"
        except Exception as e:  # the SDK raises the server's error
            out["missing"] = type(e).__name__ + ": " + str(e)
        prompts = await session.list_prompts()
        out["prompts"] = [p.name for p in prompts.prompts]
        prompt = await session.get_prompt(prompts.prompts[0].name)
        out["prompt"] = prompt.messages[0].content.text
    return out


async def main():
    transport = sys.argv[1]
    if transport == "stdio":
        toolgraph, config, data_dir = sys.argv[2:5]
        params = StdioServerParameters(command=toolgraph, args=["--config", config, "--data-dir", data_dir, "mcp"])
        async with stdio_client(params) as streams:
            out = await exercise(streams[0], streams[1])
    else:
        url, headers = sys.argv[2], dict(h.split("=", 1) for h in sys.argv[3:])
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                out = await exercise(streams[0], streams[1])
    print(json.dumps(out, ensure_ascii=False))


asyncio.run(main())
