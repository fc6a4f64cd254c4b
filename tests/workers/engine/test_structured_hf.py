"""Greedy + grammar is token-exact with HF `generate` given the same mask: an HF LogitsProcessor
wraps its own llguidance matcher over the same grammar (its mask read as llguidance's per-token
bias, not through the engine's bit unpacking). And JSON mode on the real SmolLM2."""

from __future__ import annotations

import json
from collections.abc import Collection

import jsonschema
import llguidance
import llguidance.hf
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel

from broker.sampling import SamplingParams
from broker.structured import StructuredOutputs
from ops.bench.grammar.schemas import CHOICES, REGEX, SCHEMAS
from tests.workers._helpers import Reference, TinyModel, assert_tokens, chat_prompt, make_engine, run_checked
from workers.engine.model.loader import LoadedModel

SPECS = {
    "person": StructuredOutputs(json=json.dumps(SCHEMAS[0][1])),
    "nested": StructuredOutputs(json=json.dumps(SCHEMAS[4][1])),
    "any_of": StructuredOutputs(json=json.dumps(SCHEMAS[5][1])),
    "regex": StructuredOutputs(regex=REGEX),
    "choice": StructuredOutputs(choice=tuple(CHOICES)),
}


class GrammarLogits(LogitsProcessor):
    """-inf wherever the grammar forbids the next token; the matcher advances by the token HF
    appended since the last call."""

    def __init__(
        self, tokenizer: object, eos: Collection[int], spec: StructuredOutputs, prompt_len: int
    ) -> None:
        ll = llguidance.hf.from_tokenizer(tokenizer, eos_token=sorted(eos))  # type: ignore[arg-type]
        self.matcher = llguidance.LLMatcher(ll, spec.grammar_text())
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] > self.prompt_len:
            assert self.matcher.consume_token(int(input_ids[0, -1])), self.matcher.get_error()
        bias = torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8)
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
        n = min(len(bias), scores.shape[-1])
        allowed[:n] = bias[:n] > 0
        return scores.masked_fill(~allowed, float("-inf"))  # type: ignore[return-value]


@torch.inference_mode()
def hf_constrained(
    model: PreTrainedModel,
    tokenizer: object,
    eos: Collection[int],
    prompt: list[int],
    spec: StructuredOutputs,
    n: int,
) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        pad_token_id=0,
        logits_processor=LogitsProcessorList([GrammarLogits(tokenizer, eos, spec, len(prompt))]),
    )
    return list(out[0, len(prompt) :].tolist())


@pytest.mark.parametrize("name", list(SPECS))
def test_greedy_with_grammar_matches_hf_with_the_same_mask(tiny: TinyModel, name: str) -> None:
    spec = SPECS[name]
    prompt = [17, 4242, 99, 1234, 5, 808]
    engine = make_engine(tiny.loaded, num_blocks=64)
    out = run_checked(engine, {"g": (prompt, SamplingParams(max_tokens=300, structured_outputs=spec))})["g"]
    assert out.finish_reason == "stop", out

    loaded = tiny.loaded
    expected = hf_constrained(
        tiny.reference.model, loaded.tokenizer, loaded.eos_token_ids, prompt, spec, len(out.token_ids)
    )
    assert_tokens(out.token_ids, expected, f"greedy under {name}")


@pytest.mark.smollm2
def test_smollm2_json_mode_and_schema(smollm2: LoadedModel, smollm2_reference: Reference) -> None:
    """JSON mode gives a JSON object; a schema's output validates and is HF-exact."""
    engine = make_engine(smollm2, num_blocks=64)
    prompt = chat_prompt(smollm2.tokenizer, "Describe a cat as JSON, with its name and age.")
    any_object = SamplingParams(max_tokens=200, structured_outputs=StructuredOutputs(json_object=True))
    person = SamplingParams(max_tokens=200, structured_outputs=SPECS["person"])
    outs = run_checked(engine, {"object": (prompt, any_object), "person": (prompt, person)})

    assert outs["object"].finish_reason == "stop"
    assert isinstance(json.loads(outs["object"].text), dict), outs["object"].text
    assert outs["person"].finish_reason == "stop"
    jsonschema.validate(json.loads(outs["person"].text), SCHEMAS[0][1])
    expected = hf_constrained(
        smollm2_reference.model,
        smollm2.tokenizer,
        smollm2.eos_token_ids,
        prompt,
        SPECS["person"],
        len(outs["person"].token_ids),
    )
    assert_tokens(outs["person"].token_ids, expected, "SmolLM2 under the person schema")
