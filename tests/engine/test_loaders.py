"""Loading: GGUF files (any supported architecture, q/k permutation undone), HF tokenizer folders,
and clear errors for what cannot be loaded."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from engine import LLM
from engine.config import EngineConfig
from engine.tokenizer import Tokenizer
from tests.helpers.gguf_writer import write_gguf
from tests.helpers.hf_reference import build_tiny_checkpoint, load_reference, prefill_logits


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_gguf_file_loads_to_the_same_logits_as_the_hf_folder(kind, tmp_path):
    folder = build_tiny_checkpoint(kind, tmp_path / "hf")
    path = tmp_path / "model.gguf"
    write_gguf(folder, path, kind)
    rng = random.Random(1)
    ids = [rng.randrange(384) for _ in range(40)]
    ours = LLM(str(path), kv_cache_gib=0.01).engine.runner.prefill_logits(ids)
    theirs = prefill_logits(load_reference(folder), ids)
    assert (ours - theirs).abs().max().item() < 2e-3


def test_gguf_tokenizer_comes_from_the_file(tmp_path):
    folder = build_tiny_checkpoint("llama", tmp_path / "hf")
    write_gguf(folder, tmp_path / "m.gguf", "llama")
    llm = LLM(str(tmp_path / "m.gguf"), kv_cache_gib=0.01)
    ids = llm.tokenizer.encode("héllo", allow_special=False)
    assert llm.tokenizer.decode(ids) == "héllo"
    assert len(ids) == len("héllo".encode())  # no merges: one token per byte
    assert llm.tokenizer.eos_token_ids == [0]


def test_a_whole_engine_config_is_taken_and_keywords_change_it(tmp_path):
    # The daemon hands over its [engine] table, an EngineConfig, instead of keyword arguments.
    folder = build_tiny_checkpoint("llama", tmp_path / "hf")
    write_gguf(folder, tmp_path / "m.gguf", "llama")
    config = EngineConfig(model=str(tmp_path / "m.gguf"), max_num_seqs=3, kv_cache_gib=1.0)
    llm = LLM(config, kv_cache_gib=0.01)
    assert llm.engine.config == replace(config, kv_cache_gib=0.01)
    assert config.kv_cache_gib == 1.0  # the caller's own is left as it was
    with pytest.raises(ValueError, match=r"max_num_seqs=0: must be >= 1"):
        LLM(config, max_num_seqs=0)


def test_hf_folder_tokenizer_reads_eos_bos_and_chat_template(smollm_tokenizer, tmp_path):
    smollm_tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "add_bos_token": False,
        "chat_template": smollm_tokenizer.chat_template}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = Tokenizer.from_hf_folder(tmp_path)
    assert tok.eos_token_ids == [2, 0]
    assert tok.bos_token_id == 1 and not tok.add_bos
    assert tok.chat_template == smollm_tokenizer.chat_template
    text = "Hello <|im_start|> world"
    assert tok.encode(text, allow_special=True) == smollm_tokenizer.encode(text, allow_special=True)
    assert 1 not in tok.encode(text, allow_special=False)


def test_a_folder_without_config_is_refused_with_a_reason(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM(str(tmp_path))


def test_an_unsupported_architecture_is_named(tmp_path):
    folder = build_tiny_checkpoint("llama", tmp_path / "hf")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        LLM(str(folder))


def test_a_checkpoint_missing_a_tensor_is_refused(tmp_path):
    folder = build_tiny_checkpoint("llama", tmp_path / "hf")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    from safetensors.torch import save_file

    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing 1 tensors"):
        LLM(str(folder), kv_cache_gib=0.01)


def test_a_path_that_is_neither_folder_nor_gguf_is_refused(tmp_path):
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match="gguf"):
        LLM(str(bogus))


def test_a_file_that_is_no_gguf_or_is_cut_short_is_said_so(tmp_path):
    from engine.loader import embedded_model_path, model_problem, open_checkpoint

    page = tmp_path / "model.gguf"  # what a download of an error page saves
    page.write_bytes(b"<!DOCTYPE html><html>404</html>")
    assert "not a GGUF file" in model_problem(page)  # seen without loading, as a reload looks
    with pytest.raises(ValueError, match="model.gguf: not a GGUF file"):
        open_checkpoint(page)
    whole = embedded_model_path().read_bytes()
    for size in (100, 3_000_000, len(whole) - 1000):  # in the header, the tensor table, the weights
        cut = tmp_path / f"cut{size}.gguf"
        cut.write_bytes(whole[:size])
        assert model_problem(cut) is None  # it begins as one: only reading it tells
        with pytest.raises(ValueError, match=rf"cut{size}.gguf: the GGUF file is cut short or "
                                             rf"damaged \({size:,} bytes\)"):
            open_checkpoint(cut)


def test_prompt_ids_outside_the_vocabulary_are_refused(tmp_path):
    folder = build_tiny_checkpoint("llama", tmp_path / "hf")
    llm = LLM(str(folder), kv_cache_gib=0.01)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, 384]])
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("text needs a tokenizer")
    shutil.rmtree(folder)
    assert torch.is_tensor(llm.engine.runner.prefill_logits([1, 2, 3]))  # weights are in memory


def test_a_gguf_says_how_many_bits_its_layer_matrices_keep():
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType as T

    from engine.loader.gguf import quantized_bits

    def tensors(*types, name="blk.0.attn_q.weight"):
        return [SimpleNamespace(name=name, shape=(64, 64), tensor_type=t) for t in types]

    assert quantized_bits(tensors(T.Q4_1)) == 4
    assert quantized_bits(tensors(T.Q4_K, T.Q4_K, T.Q6_K)) == 4  # Q4_K_M: a few matrices at 6 bits
    assert quantized_bits(tensors(T.Q4_K, T.Q6_K, T.Q6_K)) == 8
    assert quantized_bits(tensors(T.Q8_0)) == 8
    assert quantized_bits(tensors(T.Q2_K)) == 4
    assert quantized_bits(tensors(T.F16)) is None
    assert quantized_bits(tensors(T.Q8_0, name="token_embd.weight")) is None  # not a layer matrix
