"""An MCP server on the official Python SDK (PyPI `mcp`) whose tool list changes while it runs:
`add_tool` registers a new tool and says so (`notifications/tools/list_changed`), `remove_tool`
takes one away. Serves stdio.
"""
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("changing")


@server.tool()
def ping() -> str:
    """Answers pong."""
    return "pong"


@server.tool()
async def add_tool(name: str, factor: int, ctx: Context) -> str:
    """Adds a tool `name` that multiplies x by `factor`."""

    def multiply(x: int) -> int:
        return x * factor

    server.add_tool(multiply, name=name, description=f"Multiplies x by {factor}.")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def remove_tool(name: str, ctx: Context) -> str:
    """Removes tool `name`."""
    server.remove_tool(name)
    await ctx.session.send_tool_list_changed()
    return f"removed {name}"


if __name__ == "__main__":
    server.run("stdio")
