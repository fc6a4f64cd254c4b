"""Engine-test fixtures: tiny random models with independent HF references, and SmolLM2's reference."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from tests.workers._helpers import VOCAB, Reference, TinyModel
from workers.engine.model.loader import resolve_model_dir, wrap_model

# 2 layers, 2 kv heads of 16 dims: 512 bytes per token in fp32, 8 KiB per 16-token block.
_DIMS = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    # Large weights give well-separated logits, so float noise between paged attention and HF's
    # attention cannot flip an argmax: a mismatch means the cache is wrong, not the rounding.
    "initializer_range": 0.5,
}
_ARCHS: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel], dict[str, object]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),  # q/k/v projections carry a bias
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"attention_bias": True}),  # plus q/k RMS norms
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
}


def _build_tiny(arch: str, tokenizer: object, seed: int = 0) -> TinyModel:
    config_cls, model_cls, extra = _ARCHS[arch]
    config = config_cls(**_DIMS, **extra)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("bias"):  # HF initialises biases to zero, which would test nothing
                    param.normal_(0.0, _DIMS["initializer_range"])  # type: ignore[arg-type]
    # The engine switches its model's config to paged attention: the reference gets its own config.
    reference = model_cls(copy.deepcopy(config)).eval()
    reference.load_state_dict(model.state_dict())
    model.generation_config.eos_token_id = None
    reference.generation_config.eos_token_id = None
    loaded = wrap_model(model, tokenizer, model_id=f"tiny-{arch}", fingerprint=f"tiny-{arch}-{seed}")
    return TinyModel(loaded, Reference(reference))


@pytest.fixture(scope="session")
def tiny_model(tokenizer: object) -> Callable[[str], TinyModel]:
    """Factory: tiny_model("llama" | "qwen2" | "qwen3" | "mistral"), built once per session.

    Engines may share the wrapped model (each owns its KV pool); references are memoised.
    """
    built: dict[str, TinyModel] = {}

    def get(arch: str = "llama") -> TinyModel:
        if arch not in built:
            built[arch] = _build_tiny(arch, tokenizer)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def tiny(tiny_model: Callable[[str], TinyModel]) -> TinyModel:
    """The tiny Llama most tests use."""
    return tiny_model("llama")


@pytest.fixture(scope="session")
def smollm2_reference(kvferry_cache_dir: Path) -> Reference:
    """A second, independent SmolLM2 instance, loaded from the same converted directory."""
    directory = resolve_model_dir("smollm2", kvferry_cache_dir)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return Reference(model)
