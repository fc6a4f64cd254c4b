"""`kvferry run-batch` as users run it: a real process, an OpenAI Batch file in, JSONL out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.engine.requests.request import GenerationRequest

SYSTEM = "You are a careful assistant. " * 12  # long enough to span several 16-token blocks


def _line(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ops.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_batch_outputs_errors_and_stats(tiny_model_dir: Path, tmp_path: Path) -> None:
    chat = "/v1/chat/completions"
    lines = [
        _line(
            "chat-a",
            chat,
            {
                "model": "tiny",
                "temperature": 0,
                "max_tokens": 12,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "first question"},
                ],
            },
        ),
        _line(
            "chat-b",
            chat,
            {
                "model": "tiny",
                "temperature": 0,
                "max_tokens": 12,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "a different question"},
                ],
            },
        ),
        _line(
            "cmpl",
            "/v1/completions",
            {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 9, "temperature": 0},
        ),
        "{this is not json",
        _line("unknown-model", chat, {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}),
        _line("negative", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": -3}),
        _line("no-messages", chat, {"model": "tiny"}),
        _line("empty-prompt", "/v1/completions", {"model": "tiny", "prompt": ""}),
        _line("too-long", "/v1/completions", {"model": "tiny", "prompt": "word " * 1100, "max_tokens": 4}),
        _line("bad-url", "/v1/embeddings", {"model": "tiny", "input": "x"}),
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    root = Path(__file__).resolve().parents[2]
    proc = _run(
        [
            "run-batch",
            str(src),
            "-o",
            str(out),
            "--stats",
            str(stats),
            "--model",
            str(tiny_model_dir),
            "--served-model-name",
            "tiny",
            "--cache-size",
            "2M",
        ],
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr

    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in records] == [
        "chat-a",
        "chat-b",
        "cmpl",
        None,
        "unknown-model",
        "negative",
        "no-messages",
        "empty-prompt",
        "too-long",
        "bad-url",
    ]
    codes = {r["custom_id"]: (r["error"] or {}).get("code") for r in records}
    assert codes["unknown-model"] == "model_not_found"
    assert codes["too-long"] == "context_length_exceeded"
    assert records[3]["error"]["code"] == "invalid_json" and "line 4" in records[3]["error"]["message"]
    for cid in ("negative", "no-messages", "empty-prompt", "bad-url"):
        assert codes[cid] == "invalid_request", cid
    assert "max_tokens" in next(r for r in records if r["custom_id"] == "negative")["error"]["message"]

    # Token-exact against HF generate for the good lines.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for q in ("first question", "a different question")
    ] + [tokenizer("Once upon a time")["input_ids"]]
    for record, prompt, n in zip(records[:3], prompts, (12, 12, 9), strict=True):
        body = record["response"]["body"]
        assert record["response"]["status_code"] == 200 and record["error"] is None
        ids = torch.tensor([prompt])
        expected = reference.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )[0, len(prompt) :]
        text = body["choices"][0].get("message", {}).get("content") or body["choices"][0].get("text")
        assert text == tokenizer.decode(expected, skip_special_tokens=True), record["custom_id"]
        assert body["usage"]["prompt_tokens"] == len(prompt)
        assert body["usage"]["completion_tokens"] == n
        assert body["choices"][0]["finish_reason"] == "length"
    # chat-b shares the system prompt with chat-a, submitted at the same time: it waits one step and
    # reuses the blocks chat-a computed, and the part of chat-a's partial block they share (a copy).
    cached = records[1]["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16

    figures = json.loads(stats.read_text())
    for key in (
        "block_size",
        "bytes_per_block",
        "pool_blocks_total",
        "pool_blocks_peak_used",
        "prefix_cache_queries_tokens",
        "prefix_cache_hits_tokens",
        "fragmentation",
        "memory_breakdown",
    ):
        assert key in figures, key
    assert figures["block_size"] == 16
    assert (
        figures["bytes_per_block"] == 2 * 2 * 2 * 16 * 4 * 16
    )  # k+v, layers, kv heads, head dim, fp32, block
    assert figures["prefix_cache_hits_tokens"] >= cached
    assert 0.0 <= figures["fragmentation"] < 1.0
    assert figures["memory_breakdown"]["used_bytes"] == 0  # nothing held once the batch is done


def test_run_batch_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(_line("a", "/v1/completions", {"model": "x", "prompt": "hi"}) + "\n")
    proc = _run(
        ["run-batch", str(src), "-o", str(tmp_path / "out.jsonl"), "--model", "no-such-model"],
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode != 0
    assert "unknown model 'no-such-model'" in proc.stderr
    assert "Traceback" not in proc.stderr


class _RefusingEngine:
    """Just enough of LLMEngine for run_batch: add_request refuses each line as told."""

    @staticmethod
    def tokenizer(text: str) -> dict[str, list[int]]:
        return {"input_ids": [1, 2, 3]}

    def __init__(self, refusals: list[Exception]) -> None:
        self.refusals = refusals
        self.served = self  # the tokenizer above stands in for ServedModel's

    def add_request(self, request: GenerationRequest) -> None:
        raise self.refusals[int(request.request_id.split("-")[1])]  # batch-<line>-<prompt>-<choice>

    def has_unfinished(self) -> bool:
        return False


def test_refusals_are_classified_by_type_not_by_wording() -> None:
    """PromptTooLongError is context_length_exceeded whatever it says; any other
    InvalidRequestError is invalid_request even when its message mentions the context."""
    from broker.errors import InvalidRequestError, PromptTooLongError
    from ops.run_batch import parse_line, run_batch

    refusals: list[Exception] = [
        PromptTooLongError("4097 tokens will not fit", "prompt"),
        InvalidRequestError("the resumed output outgrew its context", "max_tokens"),
        InvalidRequestError("the KV pool says no", "prompt"),
    ]
    lines = [
        parse_line(i + 1, _line(f"r{i}", "/v1/completions", {"model": "tiny", "prompt": "x"}), "tiny")
        for i in range(len(refusals))
    ]
    assert all(line.request is not None for line in lines)
    records, _ = run_batch(_RefusingEngine(refusals), lines)  # type: ignore[arg-type]
    codes = [r["error"]["code"] for r in records]
    assert codes == ["context_length_exceeded", "invalid_request", "invalid_request"]
    assert [r["error"]["message"] for r in records] == [str(e) for e in refusals]


def test_an_unsupported_parameter_is_named_by_its_code() -> None:
    from ops.run_batch import parse_line

    body = {"model": "tiny", "prompt": "x", "suffix": "y"}
    line = parse_line(1, _line("c", "/v1/completions", body), "tiny")
    assert line.request is None and line.error_code == "unsupported_parameter"
    assert line.error_message is not None and "suffix" in line.error_message
