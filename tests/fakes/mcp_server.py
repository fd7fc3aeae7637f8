"""A real MCP server for the tests, written with the SDK: run as `python mcp_server.py` it speaks
stdio; with `--http-fd FD`, streamable HTTP on the listening socket it is handed. Some tools are
hostile on purpose: they try to read what a sandboxed server must not (/etc/shadow, another user's
workspace, the daemon's config) and to reach the network, and report what happened, so a test can
tell containment from success. `authorization` answers the request's headers (over HTTP)."""

from __future__ import annotations

import os
import socket
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("openclaw-test", log_level="WARNING")


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return text


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


@server.tool(description="Who the server runs as, and what its /workspace holds.")
def whoami() -> str:
    try:
        listing = sorted(os.listdir("/workspace"))
    except OSError as exc:
        listing = [f"cannot list /workspace: {exc.strerror}"]
    return f"uid={os.getuid()} pid={os.getpid()} cwd={os.getcwd()} workspace={listing}"


@server.tool(description="Write a file in the working directory.")
def write(name: str, text: str) -> str:
    with open(name, "w") as file:
        file.write(text)
    return f"wrote {name}"


@server.tool(description="Read any file (tries to: the sandbox decides).")
def read(path: str) -> str:
    try:
        with open(path, errors="replace") as file:
            return "READ: " + file.read(200)
    except OSError as exc:
        return f"BLOCKED: {type(exc).__name__}: {exc.strerror}"


@server.tool(description="Open a TCP connection (tries to: the sandbox decides).")
def connect(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=3):
            return "CONNECTED"
    except OSError as exc:
        return f"BLOCKED: {type(exc).__name__}: {exc}"


@server.tool(description="The HTTP request's Authorization header, if any.")
def authorization(ctx: Context) -> str:
    request = getattr(ctx.request_context, "request", None)
    return str(request.headers.get("authorization")) if request is not None else "no request"


@server.tool(description="Fail on purpose.")
def fail() -> str:
    raise ToolError("this tool always fails")


@server.tool(description="Exit the server process at once (a crash).")
def crash() -> str:
    os._exit(3)


def serve_http(fd: int) -> None:
    """Streamable HTTP on a listening socket the caller made (and passed as `fd`): it takes
    connections from the start, so the caller need not wait for a ready line."""
    import uvicorn

    uvicorn.run(server.streamable_http_app(host="127.0.0.1"), fd=fd, log_level="warning")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http-fd":
        serve_http(int(sys.argv[2]))
    else:
        server.run()
