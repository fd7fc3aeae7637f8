"""The `openclaw` command. For now one subcommand, `chat`: talk to the local model in a terminal.

Interactive on a terminal (replies stream as they are generated). With piped input it reads one
message per line, prints each reply on its own line, and exits at end of input, so
`printf 'Hi\\n' | openclaw chat` works in scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Iterator

from openclaw import __version__

DEFAULT_SYSTEM = "You are OpenClaw, a helpful personal assistant."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="openclaw", description="Your personal agent daemon.")
    parser.add_argument("--version", action="version", version=f"openclaw {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    chat = sub.add_parser("chat", help="chat with the local model in this terminal")
    chat.add_argument("--model", default=None,
                      help="HF model folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    chat.add_argument("--device", default="auto")
    chat.add_argument("--system", default=DEFAULT_SYSTEM, help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=256)
    chat.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.command == "chat":
        try:
            return asyncio.run(_chat(args))
        except KeyboardInterrupt:
            return 130
    return 2


async def _chat(args: argparse.Namespace) -> int:
    from engine import AsyncLLM, SamplingParams

    interactive = sys.stdin.isatty()
    if interactive:
        print("loading the model...", file=sys.stderr, flush=True)
    llm = await asyncio.to_thread(AsyncLLM, args.model, device=args.device, kv_cache_gib=0.5)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    history: list[dict] = []
    if interactive:
        print("ready: type a message, /new to start over, Ctrl-D to quit", file=sys.stderr)
    try:
        async for line in _lines(interactive):
            text = line.strip()
            if not text:
                continue
            if text == "/new":
                history.clear()
                print("(new conversation)", flush=True)
                continue
            history.append({"role": "user", "content": text})
            messages = _fit([{"role": "system", "content": args.system}, *history], llm,
                            args.max_tokens)
            reply = ""
            async for out in llm.generate(messages, params):
                reply = out.text
                if interactive:
                    print(out.delta_text, end="", flush=True)
            print(reply.strip() if not interactive else "", flush=True)
            history.append({"role": "assistant", "content": reply.strip()})
    finally:
        llm.shutdown()
    return 0


def _fit(messages: list[dict], llm, reply_tokens: int) -> list[dict]:
    """Drop the oldest turns (never the system prompt or the newest message) until the prompt and
    the reply fit the model's context, counted with the engine's own tokenizer."""
    budget = llm.engine.max_model_len - reply_tokens
    while len(messages) > 2 and len(llm.encode_chat(messages)) > budget:
        del messages[1]
    return messages


async def _lines(interactive: bool) -> Iterator[str]:
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            if interactive:
                print(file=sys.stderr)
            return
        yield line


if __name__ == "__main__":
    sys.exit(main())
