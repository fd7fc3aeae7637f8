"""What loading the embedded model costs a fresh process: `import torch`, `open_checkpoint(None)`
(GGUF metadata and tokenizer) and `LLM()` (weights, model, packing), in CPU and wall seconds.

Run it once per tree to compare (each run is a fresh process; alternate them, the machine's load
moves wall times a lot, CPU seconds much less):

    PYTHONPATH=. .venv/bin/python bench/startup.py
"""

from __future__ import annotations

import time


def main() -> None:
    marks = [(time.perf_counter(), time.process_time())]
    import torch  # noqa: F401

    marks.append((time.perf_counter(), time.process_time()))
    from engine.loader import open_checkpoint

    open_checkpoint(None)
    marks.append((time.perf_counter(), time.process_time()))
    from engine import LLM

    LLM()
    marks.append((time.perf_counter(), time.process_time()))
    for name, (w0, c0), (w1, c1) in zip(("import torch", "open_checkpoint(None)", "LLM()"),
                                        marks, marks[1:], strict=False):
        print(f"{name:>22}: {c1 - c0:6.2f} s CPU {w1 - w0:7.2f} s wall")


if __name__ == "__main__":
    main()
