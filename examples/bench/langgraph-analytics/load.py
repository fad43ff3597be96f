"""Streamed runs through LangGraph's Python SDK (`langgraph-sdk`), for `scripts/bench-agent-server`.

Usage: load.py BASE_URL ASSISTANT RUNS CONCURRENCY PID [HEADER=VALUE ...]

Each run makes a new thread and streams one turn on it in `messages-tuple` mode, as
agent-chat-ui does, with at most CONCURRENCY runs at once. Prints one JSON object: runs, errors,
wall seconds, runs per second, latency percentiles (ms), the tokens each run streamed, and the
CPU seconds the server's process PID (and its children) used meanwhile, per run.
"""

import asyncio
import json
import os
import sys
import time

import httpx
from langgraph_sdk.client import LangGraphClient

base, assistant, runs, concurrency, pid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
headers = dict(h.split("=", 1) for h in sys.argv[6:])
TICK = os.sysconf("SC_CLK_TCK")


def tree(root):
    """`root` and every process below it."""
    children = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(p))
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pids):
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / TICK


# Runs per SDK client: httpx's connection pool looks through its connections on every request,
# so one client holding 1,000 streams spends its event loop there (measured: 10 runs/s at 1,000
# concurrent against 63 at 64, the server idle); a client per 64 runs keeps each pool small.
PER_CLIENT = 64


async def main():
    def sdk_client(connections):
        http = httpx.AsyncClient(
            base_url=base,
            transport=httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=connections + 8, max_keepalive_connections=connections + 8)),
            timeout=httpx.Timeout(connect=30, read=300, write=300, pool=300),
            headers=headers,
        )
        return http, LangGraphClient(http)

    shards = [sdk_client(min(PER_CLIENT, concurrency)) for _ in range(-(-concurrency // PER_CLIENT))]
    gate = asyncio.Semaphore(concurrency)
    latencies, tokens, errors = [], [], []

    async def one(i):
        client = shards[i % len(shards)][1]
        async with gate:
            started = time.perf_counter()
            try:
                thread = await client.threads.create()
                n = 0
                async for part in client.runs.stream(
                    thread["thread_id"],
                    assistant,
                    input={"messages": [{"type": "human", "content": f"How many orders did we get yesterday? ({i})"}]},
                    stream_mode="messages-tuple",
                ):
                    if part.event == "error":
                        raise RuntimeError(json.dumps(part.data))
                    if part.event == "messages" and part.data and part.data[0].get("type") == "AIMessageChunk":
                        n += 1 if part.data[0].get("content") else 0
                tokens.append(n)
                latencies.append((time.perf_counter() - started) * 1000)
            except Exception as e:  # counted and shown, never hidden
                errors.append(f"{type(e).__name__}: {e}"[:300])

    pids = tree(pid)
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(runs)))
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(tree(pid)) - cpu0
    for http, _ in shards:
        await http.aclose()
    latencies.sort()
    pct = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1) if latencies else None
    done = len(latencies)
    print(json.dumps({
        "runs": runs, "concurrency": concurrency, "ok": done, "errors": len(errors), "first_errors": errors[:3],
        "wall_s": round(wall, 2), "runs_per_s": round(done / wall, 1),
        "p50_ms": pct(0.5), "p99_ms": pct(0.99),
        "tokens_per_run": sorted(set(tokens)),
        "server_cpu_ms_per_run": round(cpu * 1000 / max(done, 1), 2),
    }))


asyncio.run(main())
