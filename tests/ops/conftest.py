"""A tiny random Llama saved as a local HF model directory, with SmolLM2's tokenizer and chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: object) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        initializer_range=0.5,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(7)
        model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)  # type: ignore[attr-defined]
    return directory
