"""The admin's commands start without the engine: `openclaw users`, `pairing`, `skills list`,
`audit`, `jobs`, `mcp list` touch the store and the config only, and loading torch (2-4 s here)
for each would make every one of them slow for nothing. Commands that load a model (chat, run,
serve, doctor) import it when they get there."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Runs the real CLI entry point in a fresh interpreter, then says which heavy modules it loaded.
PROBE = """
import sys
from openclaw.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(sorted(m for m in ("torch", "numpy", "triton", "transformers", "discord", "telegram")
             if m in sys.modules))
"""


@pytest.mark.parametrize("argv", [["users"], ["pairing", "list"], ["skills", "list"], ["audit"],
                                  ["jobs"], ["mcp", "list"], ["prompts", "list"],
                                  ["traces", "export", "--since", "2026-12-01"]])
def test_admin_commands_load_no_engine_and_no_connector(tmp_path, argv):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[access]\nadmins = ["telegram:1"]\n')
    done = subprocess.run([sys.executable, "-c", PROBE, "--config", str(config), *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", (argv, done.stdout, done.stderr)
