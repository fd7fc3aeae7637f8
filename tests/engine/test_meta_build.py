"""The engine builds its model without random init: values the checkpoint overwrites, whose meta
path alone imported torch._dynamo (seconds of every `openclaw chat` start)."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

from engine.models.meta_build import build_on_meta
from tests.helpers.hf_reference import build_tiny_checkpoint

LOAD_AND_LOOK = """
import sys
from engine import LLM
llm = LLM(sys.argv[1], kv_cache_gib=0.01, device="cpu")  # what a CPU start pays
assert llm.generate([[1, 2, 3]])  # weights in, a step run
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""


def test_loading_a_model_imports_no_torch_dynamo(tmp_path):
    folder = build_tiny_checkpoint("llama", tmp_path / "hf")
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_LOOK, str(folder)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "dynamo imported: False" in proc.stdout


def test_built_on_meta_without_init_and_init_works_again_after():
    model = build_on_meta(lambda: nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3)))
    assert all(p.is_meta for p in model.parameters())
    assert model[1].weight.shape == (3, 4)
    weight = nn.init.normal_(torch.zeros(1000))  # the mode is gone: init does its work again
    assert weight.std() > 0.5
    assert nn.Linear(4, 3).weight.device.type == "cpu"
