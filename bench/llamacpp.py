"""llama.cpp beside our engine: find its `llama-batched-bench`, run it on a GGUF, read its table.

The binary comes from PATH or from bench/build_llamacpp.sh's build dir (bench/.llamacpp/build/bin,
or $LLAMACPP_DIR/build/bin). `llama-batched-bench` prints a markdown table whose columns are
named (PP, TG, B, S_PP t/s, S_TG t/s, ...): we read them by name, not by position, so a release
that adds a column still parses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


@dataclass
class LlamaCppRow:
    prompt_tokens: int
    gen_tokens: int
    prefill_tps: float  # S_PP t/s
    decode_tps: float  # S_TG t/s


def find_binary(name: str = "llama-batched-bench") -> str | None:
    """PATH first, then the build dir of bench/build_llamacpp.sh."""
    found = shutil.which(name)
    if found:
        return found
    root = Path(os.environ.get("LLAMACPP_DIR") or BENCH_DIR / ".llamacpp")
    candidate = root / "build" / "bin" / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def parse_table(text: str) -> list[LlamaCppRow]:
    """The rows of llama-batched-bench's markdown table (its log lines around it are skipped)."""
    header: list[str] | None = None
    rows: list[LlamaCppRow] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if "S_PP t/s" in cells and "S_TG t/s" in cells:
            header = cells
            continue
        if header is None or len(cells) != len(header) or set(line) <= set("|-: "):
            continue
        col = dict(zip(header, cells, strict=True))
        try:
            rows.append(LlamaCppRow(int(col["PP"]), int(col["TG"]), float(col["S_PP t/s"]),
                                    float(col["S_TG t/s"])))
        except (KeyError, ValueError):
            continue
    return rows


def batched_bench(binary: str, gguf: str, prompt_tokens: int, gen_tokens: int, threads: int,
                  timeout_s: float = 900) -> LlamaCppRow:
    """One single-stream run: `-npp P -ntg G -npl 1 -t T -fa on` (flash attention, as NOTES.md
    measured it). Raises RuntimeError with the tail of its output when no row comes back."""
    cmd = [binary, "-m", gguf, "-c", str(prompt_tokens + gen_tokens + 64),
           "-b", "2048", "-ub", "512", "-npp", str(prompt_tokens), "-ntg", str(gen_tokens),
           "-npl", "1", "-t", str(threads), "-fa", "on"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    rows = parse_table(proc.stdout + "\n" + proc.stderr)
    if proc.returncode != 0 or not rows:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} without a result:\n{tail}")
    return rows[0]
