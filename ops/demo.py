"""A demo conversation through the queue: multi-turn chat with a shared system prompt, streaming,
and a burst of concurrent questions, via the official OpenAI client against our API."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click
from openai import OpenAI

SYSTEM = (
    "You are the demo assistant of kvferry, an inference service that runs language-model jobs through a "
    "durable queue. Be friendly, plain and accurate, and answer in one or two short sentences."
)


def _ask(client: OpenAI, model: str, messages: list[Any]) -> tuple[str, Any, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        max_tokens=48,
        temperature=0,
    )
    completion = raw.parse()
    return (
        completion.choices[0].message.content or "",
        completion.usage,
        raw.headers.get("x-kvferry-worker", "?"),
    )


def _show(question: str, answer: str, usage: Any, worker: str, seconds: float) -> None:
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    click.echo(f"\nuser> {question}\nassistant> {answer.strip()}")
    click.echo(
        f"  [{usage.prompt_tokens} prompt tokens, {cached} from the KV cache; "
        f"{usage.completion_tokens} generated; worker {worker}; {seconds:.2f}s]"
    )


def run_demo(api_url: str, model: str, flower_url: str, api_key: str | None = None) -> None:
    client = OpenAI(base_url=f"{api_url}/v1", api_key=api_key or "demo", max_retries=0, timeout=300)
    click.echo("\n=== a conversation: each turn resends the history, the pool serves it ===")
    messages = [{"role": "system", "content": SYSTEM}]
    for question in ("What is the capital of France?", "And what river flows through it?"):
        messages.append({"role": "user", "content": question})
        started = time.perf_counter()
        answer, usage, worker = _ask(client, model, messages)
        _show(question, answer, usage, worker, time.perf_counter() - started)
        messages.append({"role": "assistant", "content": answer})

    click.echo("\n=== streaming ===")
    question = "Name three planets of the solar system."
    click.echo(f"user> {question}\nassistant> ", nl=False)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=48,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            click.echo(chunk.choices[0].delta.content, nl=False)
        if chunk.usage is not None:
            cached = (
                chunk.usage.prompt_tokens_details.cached_tokens if chunk.usage.prompt_tokens_details else 0
            )
            click.echo(f"\n  [{chunk.usage.prompt_tokens} prompt tokens, {cached} from the KV cache]")

    click.echo("\n=== eight questions at once: batched by the workers ===")
    questions = [
        "What is 2 + 2?",
        "Name a fruit.",
        "What color is grass?",
        "Say hello in French.",
        "What is H2O?",
        "Name an ocean.",
        "What is the opposite of hot?",
        "How many legs has a cat?",
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(len(questions)) as pool:
        answers = list(
            pool.map(
                lambda q: _ask(
                    client, model, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
                ),
                questions,
            )
        )
    for q, (answer, usage, worker) in zip(questions, answers, strict=True):
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        click.echo(f"  {q} -> {answer.strip()[:70]!r} ({cached} cached, {worker})")
    click.echo(f"  all eight in {time.perf_counter() - started:.1f}s")
    click.echo(
        f"\nFlower (workers, queues, tasks, KV figures): {flower_url} (login in stack.json)\n"
        f"metrics: {api_url}/metrics"
    )
