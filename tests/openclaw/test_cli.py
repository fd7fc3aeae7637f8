"""`openclaw chat` as a script sees it: piped lines in, one reply per line out, exit at EOF."""

from __future__ import annotations

import subprocess
import sys


def test_piped_chat_answers_each_line_and_exits_at_end_of_input():
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw.cli", "chat", "--max-tokens", "48"],
        input="What is the capital of France?\n\n/new\nWhat is the capital of France?\n",
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # two answers (the blank line is skipped), with the /new acknowledgement between them
    assert len(lines) == 3, proc.stdout
    assert "Paris" in lines[0]
    assert lines[1] == "(new conversation)"
    assert lines[2] == lines[0]  # greedy and a fresh history: the same answer again


def test_unknown_subcommand_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "openclaw.cli", "fly"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr
