"""`openclaw serve`: our engine behind an OpenAI-compatible API, alone (docs/serving.md). The
config's `[engine]` and `[serve]`, each setting changed by its flag; beyond loopback only with an
API key, refused before the model loads."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import tomllib
from typing import Any

from pydantic import ValidationError

from openclaw.config import Config, ConfigError, OpenAIEngineConfig, load_config
from openclaw.config.sections import ServeConfig
from openclaw.descriptors import quiet_accept_failures, raise_open_files_limit

log = logging.getLogger(__name__)

# Flags that change the [engine] table, by EngineConfig's (vLLM's) names.
ENGINE_FLAGS = ("model", "device", "dtype", "max_num_seqs", "max_model_len", "kv_cache_gib")
SERVE_FLAGS = ("host", "port", "api_key", "served_model_name", "max_connections")


def add_commands(sub, common_sub) -> None:
    p = sub.add_parser("serve", help="serve the engine over an OpenAI-compatible HTTP API "
                                     "(/v1/chat/completions, /v1/completions, /v1/models)")
    p.add_argument("--host", help="address to bind ([serve] host; default 127.0.0.1); beyond "
                                  "loopback only with an API key")
    p.add_argument("--port", type=int, help="TCP port ([serve] port; default 8000)")
    p.add_argument("--api-key", metavar="env:NAME|file:PATH",
                   help="the key clients must send as `Authorization: Bearer KEY` ([serve] api_key)")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the model's name in the API (default: its file or folder name)")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="connections at once ([serve] max_connections; default 512); each "
                        "streaming client holds one")
    p.add_argument("--model", help="a Hugging Face folder or a .gguf file ([engine] model; "
                                   "default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", help='"auto", "cpu", "cuda" or "cuda:N" ([engine] device)')
    p.add_argument("--dtype", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--max-num-seqs", type=int, metavar="N", help="sequences decoded together")
    p.add_argument("--max-model-len", type=int, metavar="N", help="longest sequence")
    p.add_argument("--kv-cache-gib", type=float, metavar="GIB", help="KV-cache pool on the CPU")
    p.add_argument("--max-waiting", type=int, metavar="N", default=None,
                   help="sequences that may wait beyond max_num_seqs before requests get 503 "
                        "(default 256)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.max_waiting is not None and args.max_waiting < 0:
        raise ConfigError(None, ["--max-waiting: must be >= 0"])
    config = load_config(args.config, tokens=False)  # the connectors' secrets are not needed
    serve = serve_settings(config, args)
    engine = engine_settings(config, args)
    return asyncio.run(run_server(config, engine, serve, args.max_waiting))


def serve_settings(config: Config, args: argparse.Namespace) -> ServeConfig:
    """[serve] with the flags over it, its api_key read (load_config left the file's secrets
    unread), checked as the file is: a host beyond loopback without a key is refused here."""
    table: dict[str, Any] = {}
    if config.source is not None:
        table = dict(tomllib.loads(config.source.read_text(encoding="utf-8")).get("serve", {}))
    table.pop("enabled", None)  # the daemon's switch; `openclaw serve` serves anyway
    flags = {name: getattr(args, name) for name in SERVE_FLAGS if getattr(args, name) is not None}
    key = flags.get("api_key")
    if key is not None and not key.startswith(("env:", "file:")):
        raise ConfigError(None, ["--api-key: give env:NAME or file:PATH; a key written on the "
                                 "command line is visible to every user of this machine (ps)"])
    table.update(flags)
    base = config.source.parent if config.source is not None else None
    try:
        return ServeConfig.model_validate(table, context={"base_dir": base})
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            key = ".".join(str(p) for p in err["loc"])
            flag = f" (--{key.replace('_', '-')})" if key in flags else ""
            problems.append(f"serve.{key}{flag}: {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError(config.source, problems) from None


def engine_settings(config: Config, args: argparse.Namespace):
    """[engine] with the flags over it; only the local engine can be served."""
    if isinstance(config.engine, OpenAIEngineConfig):
        raise ConfigError(config.source, [
            '[engine] backend = "openai": `openclaw serve` serves the local engine, and this '
            "config's model runs on another server (its url); use a config whose [engine] "
            'is local (backend = "local", the default), or point clients at that server'])
    changes = {name: getattr(args, name) for name in ENGINE_FLAGS if getattr(args, name) is not None}
    try:
        return dataclasses.replace(config.engine, **changes)
    except ValueError as exc:
        raise ConfigError(config.source, [f"[engine]: {exc}"]) from None


async def run_server(config: Config, engine, serve: ServeConfig, max_waiting: int | None) -> int:
    from engine import AsyncLLM
    from openclaw.serve import APIServer

    if raised := raise_open_files_limit():  # room for many clients, as the daemon makes it
        log.info("raised the open-files limit from %d to %d, the hard limit", *raised)
    quiet_accept_failures(asyncio.get_running_loop())  # a flood past the limit: a line a minute
    log.info("loading the model (%s)", engine.model or "embedded SmolLM2-135M-Instruct")
    try:
        llm = await asyncio.to_thread(AsyncLLM, engine)
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
            ValueError) as exc:  # a model, device or dtype this machine cannot use
        raise ConfigError(config.source, [f"[engine]: {exc}"]) from exc
    extra = {} if max_waiting is None else {"max_waiting": max_waiting}
    server = APIServer(llm, serve, **extra)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        await server.start()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # One line on stdout, for a script (or a test) that waits for the server to be up.
        print(f"serving {server.state.model_name} at {server.url}/v1 (OpenAI-compatible); "
              "Ctrl-C stops", flush=True)
        await stop.wait()
    finally:
        await server.stop()
        llm.shutdown()
    return 0
