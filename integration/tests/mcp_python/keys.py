"""The MCP example driven by the official MCP Python SDK: a key sent each way a client may
send it, printed as one JSON object on stdout for integration/tests/mcp.rs to check.

    python3 keys.py MCP_SERVER_BINARY STORE_URL

- `_meta.idempotency_key` and `_meta.idempotencyKey` through the SDK's `call_tool(meta=...)`;
- a key reused with other arguments;
- `params.idempotencyKey` (MCP's idempotency proposal, SEP-3182, beside `arguments`), sent as
  raw JSON-RPC to a server process of its own, since the SDK's models have no such field;
- the server's experimental capabilities, as the SDK reads them.
"""

import asyncio
import json
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ARGS = {"charge": "ch_1", "amount_cents": 500}


def outcome(result):
    return {"is_error": bool(result.is_error), "content": result.structured_content}


async def through_the_sdk(binary, store):
    params = StdioServerParameters(command=binary, args=["--store", store])
    out = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            capabilities = session.server_capabilities
            out["experimental"] = capabilities.experimental if capabilities else None

            async def refund(meta, arguments=ARGS):
                return outcome(await session.call_tool("refund", arguments, meta=meta))

            out["snake"] = [await refund({"idempotency_key": "r-1"}) for _ in range(2)]
            out["camel"] = [await refund({"idempotencyKey": "r-2"}) for _ in range(2)]
            out["reused"] = await refund(
                {"idempotencyKey": "r-2"}, {"charge": "ch_1", "amount_cents": 900}
            )
            out["keyless"] = await refund(None)
    return out


def raw_params_key(binary, store):
    """`tools/call` with `idempotencyKey` beside `arguments`, over raw JSON-RPC lines."""
    server = subprocess.Popen(
        [binary, "--store", store],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )

    def send(message):
        server.stdin.write((json.dumps(message) + "\n").encode())
        server.stdin.flush()

    def answer(request_id):
        while True:
            line = server.stdout.readline()
            if not line:
                raise RuntimeError("the server closed its output")
            message = json.loads(line)
            if message.get("id") == request_id:
                return message

    send({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    })
    answer(1)
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    calls = []
    for request_id in (2, 3):
        send({
            "jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "refund", "arguments": ARGS, "idempotencyKey": "r-3"},
        })
        calls.append(answer(request_id)["result"])
    server.stdin.close()
    server.wait(timeout=10)
    return [{"is_error": bool(c.get("isError")), "content": c.get("structuredContent")} for c in calls]


def main():
    binary, store = sys.argv[1], sys.argv[2]
    out = asyncio.run(through_the_sdk(binary, store))
    out["params"] = raw_params_key(binary, store)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
