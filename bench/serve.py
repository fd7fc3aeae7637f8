"""The engine's agent workload through `openclaw serve` over HTTP, against the same workload on the
engine in-process: throughput ratio (target >= 0.9) and time to first token, 16 and 64 clients.

Workload (bench/engine_cpu.py's): conversations sharing one system prompt with three tools, each
with its own short history and reply length, greedy with ignore_eos so both sides make exactly
the same tokens. C clients each send their share of the conversations one after another, streamed
(the next once the previous ended), so at most C run at once:
- HTTP: `openclaw serve` in a child process (the user's setup: its own interpreter), clients on
  aiohttp in this one, POST /v1/chat/completions with stream and include_usage;
- in-process: AsyncLLM in this process, the same C clients as coroutines over `generate`.
Both engines have the same settings; each run gets a fresh cache_salt, so it starts with a cold
prefix cache. Throughput: the tokens generated over the run's wall time. TTFT: a request's send to
its first event (HTTP: the server sends it once the first token is out; its content may come
later, held back while it could open a tool call) or first output (in-process). Each setting runs
`--repeats` times, in-process and HTTP alternating; the best throughput of each is kept, with its
TTFTs.

    .venv/bin/python bench/serve.py [--clients 16 64] [--repeats 2] [--quick] [--profile]

`--profile` runs the server under cProfile (its event loop's thread: what the HTTP side costs,
not the engine's step loop) and prints where that time went.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402

from bench.engine_cpu import TOOLS, conversation, machine_info  # noqa: E402
from engine import AsyncLLM, SamplingParams  # noqa: E402

TARGET = 0.9  # HTTP throughput / in-process throughput
ENGINE = {"kv_cache_gib": 1.0, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
MODEL = "smol"


@dataclass
class Request:
    messages: list[dict]
    max_tokens: int


@dataclass
class Run:
    seconds: float
    tokens: int
    ttfts: list[float]
    cpu_s: float  # CPU seconds our processes took: this one, and the server for HTTP
    other_cpu: float  # share of the machine's CPU that processes other than ours took meanwhile

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s

    def ttft(self, q: float) -> float:
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Result:
    clients: int
    requests: int
    inproc: list[Run] = field(default_factory=list)
    http: list[Run] = field(default_factory=list)


def workload(n: int, lengths: tuple[int, int], seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(conversation(rng), rng.randint(*lengths)) for _ in range(n)]


def shares(requests: list[Request], clients: int) -> list[list[Request]]:
    return [requests[i::clients] for i in range(clients)]


# ---- CPU that others took: the machine may be shared ------------------------------------------


def machine_busy_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(clients: list, ours: list[int]) -> tuple[float, float, float, list]:
    """Run the client coroutines; (seconds, CPU seconds the processes `ours` took, share of the
    CPU processes outside them took, their results)."""
    busy, own = machine_busy_s(), sum(process_cpu_s(p) for p in ours)
    start = time.perf_counter()
    results = await asyncio.gather(*clients)
    seconds = time.perf_counter() - start
    cpu = sum(process_cpu_s(p) for p in ours) - own
    others = (machine_busy_s() - busy) - cpu
    return seconds, cpu, max(0.0, others) / (seconds * (os.cpu_count() or 1)), results


# ---- the two sides ---------------------------------------------------------------------------


async def http_client(session: aiohttp.ClientSession, url: str, requests: list[Request],
                      salt: str) -> list[tuple[float, int]]:
    """One client's requests in turn: (TTFT, tokens) each."""
    out = []
    for req in requests:
        body = {"model": MODEL, "messages": req.messages, "tools": TOOLS, "temperature": 0,
                "max_tokens": req.max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, "cache_salt": salt}
        sent = time.perf_counter()
        ttft, tokens = None, 0
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                if ttft is None:
                    ttft = time.perf_counter() - sent
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        if tokens != req.max_tokens:
            raise RuntimeError(f"HTTP: {tokens} tokens where {req.max_tokens} were asked")
        out.append((ttft, tokens))
    return out


async def run_http(url: str, server_pid: int, requests: list[Request], clients: int) -> Run:
    salt = uuid.uuid4().hex
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        seconds, cpu, other, results = await timed(
            [http_client(session, url, share, salt) for share in shares(requests, clients)],
            [os.getpid(), server_pid])
    done = [r for client in results for r in client]
    return Run(seconds, sum(t for _, t in done), [ttft for ttft, _ in done], cpu, other)


async def inproc_client(llm: AsyncLLM, requests: list[Request], salt: str) -> list[tuple[float, int]]:
    out = []
    for req in requests:
        params = SamplingParams(temperature=0, max_tokens=req.max_tokens, ignore_eos=True)
        sent = time.perf_counter()
        ttft, final = None, None
        async for output in llm.generate(req.messages, params, tools=TOOLS, cache_salt=salt):
            if ttft is None:
                ttft = time.perf_counter() - sent
            final = output
        if len(final.token_ids) != req.max_tokens:
            raise RuntimeError(f"in-process: {len(final.token_ids)} tokens where "
                               f"{req.max_tokens} were asked")
        out.append((ttft, len(final.token_ids)))
    return out


async def run_inproc(llm: AsyncLLM, requests: list[Request], clients: int) -> Run:
    salt = uuid.uuid4().hex
    seconds, cpu, other, results = await timed(
        [inproc_client(llm, share, salt) for share in shares(requests, clients)], [os.getpid()])
    done = [r for client in results for r in client]
    return Run(seconds, sum(t for _, t in done), [ttft for ttft, _ in done], cpu, other)


# ---- the server ------------------------------------------------------------------------------


def start_server(folder: Path, profile: Path | None) -> tuple[subprocess.Popen, str]:
    config = folder / "openclaw.toml"
    engine = "\n".join(f"{k} = {v}" for k, v in ENGINE.items())
    config.write_text(f'[engine]\n{engine}\n[serve]\nserved_model_name = "{MODEL}"\n')
    profiler = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    command = [sys.executable, *profiler, "-m", "openclaw.cli", "serve", "--config", str(config),
               "--port", "0"]
    env = {**os.environ, "HOME": str(folder),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env,
                            stderr=(folder / "serve.log").open("w"))
    line = proc.stdout.readline()
    if " at http://" not in line:
        proc.kill()
        raise RuntimeError(f"openclaw serve did not start: {line!r}")
    return proc, line.split(" at ")[1].split()[0].removesuffix("/v1")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(2)  # SIGINT: a clean exit, so that cProfile writes its file
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- report ----------------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    """Throughput: the best run of each side, and their ratio (the target's); tokens per CPU
    second: the best of each, the ratio less moved by other processes on a shared machine (the
    HTTP side's counts the server's CPU and its clients')."""
    rows = ["| clients | requests | in-process tok/s | HTTP tok/s | ratio | tok per CPU-s in-process "
            "/ HTTP (ratio) | TTFT p50 / p99 in-process (ms) | TTFT p50 / p99 HTTP (ms) |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        ours, http = max(r.inproc, key=lambda x: x.tps), max(r.http, key=lambda x: x.tps)
        ratio = http.tps / ours.tps
        mark = "" if ratio >= TARGET else f" (target {TARGET})"
        cpu_ours = max(x.tokens_per_cpu_s for x in r.inproc)
        cpu_http = max(x.tokens_per_cpu_s for x in r.http)
        rows.append(f"| {r.clients} | {r.requests} | {ours.tps:.1f} | {http.tps:.1f} | "
                    f"{ratio:.2f}{mark} | {cpu_ours:.1f} / {cpu_http:.1f} ({cpu_http / cpu_ours:.2f}) | "
                    f"{ours.ttft(0.5) * 1e3:.0f} / {ours.ttft(0.99) * 1e3:.0f} | "
                    f"{http.ttft(0.5) * 1e3:.0f} / {http.ttft(0.99) * 1e3:.0f} |")
    return "\n".join(rows)


def runs(done: list[Run]) -> str:
    return ", ".join(f"{r.seconds:.2f}s ({r.cpu_s:.1f} CPU-s, others {r.other_cpu:.0%})"
                     for r in done)


def print_profile(path: Path, top: int = 30) -> None:
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


# ---- main ------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--per-client", type=int, default=None,
                    help="requests each client sends in turn (default: 2 up to 16 clients, "
                         "1 beyond)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each side; the best is kept")
    ap.add_argument("--quick", action="store_true", help="smoke size: short replies, one run")
    ap.add_argument("--profile", action="store_true", help="cProfile the server's event loop")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


async def main() -> None:
    args = parse_args()
    lengths = (8, 24) if args.quick else (24, 64)
    repeats = 1 if args.quick else args.repeats
    began = time.perf_counter()
    print(f"{machine_info()}; aiohttp {aiohttp.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "serve.prof" if args.profile else None
        proc, url = start_server(Path(tmp), profile)
        llm = await asyncio.to_thread(AsyncLLM, None, **ENGINE)
        try:
            warm = workload(4, (4, 4), seed=99)
            await run_inproc(llm, warm, 4)
            await run_http(url, proc.pid, warm, 4)
            results = []
            for clients in args.clients:
                per = args.per_client or (2 if clients <= 16 else 1)
                requests = workload(clients * per, lengths, args.seed + clients)
                result = Result(clients, len(requests))
                for _ in range(repeats):
                    result.inproc.append(await run_inproc(llm, requests, clients))
                    result.http.append(await run_http(url, proc.pid, requests, clients))
                tokens = sum(r.max_tokens for r in requests)
                print(f"{clients} clients, {len(requests)} requests, {tokens} tokens: in-process "
                      f"{runs(result.inproc)}; HTTP {runs(result.http)}", flush=True)
                results.append(result)
        finally:
            llm.shutdown()
            if proc.poll() is not None:
                log = (Path(tmp) / "serve.log").read_text()[-3000:]
                print(f"openclaw serve exited with status {proc.returncode}; its log:\n{log}")
            stop_server(proc)
        print(f"\nbest of {repeats}; reply lengths {lengths[0]}-{lengths[1]} tokens, greedy\n")
        print(table(results))
        busy = max(run.other_cpu for r in results for run in r.inproc + r.http)
        if busy > 0.1:
            print(f"\nWARNING: other processes took up to {busy:.0%} of the CPU during a run; "
                  "rerun when the machine is quiet")
        if profile is not None:
            print_profile(profile)
    print(f"\ntotal bench time {time.perf_counter() - began:.0f}s")


if __name__ == "__main__":
    asyncio.run(main())
