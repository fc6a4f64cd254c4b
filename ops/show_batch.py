"""Print a finished batch as a readable table: question, answer, cached tokens; then its figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(input_path: str, output_path: str, stats_path: str) -> None:
    questions = {}
    for line in Path(input_path).read_text().splitlines():
        record = json.loads(line)
        body = record["body"]
        messages = body.get("messages")
        questions[record["custom_id"]] = messages[-1]["content"] if messages else body.get("prompt", "")
    for line in Path(output_path).read_text().splitlines():
        record = json.loads(line)
        cid = record["custom_id"]
        print(f"\n[{cid}] {questions.get(cid, '')}")
        if record["error"]:
            print(f"  error {record['error']['code']}: {record['error']['message']}")
            continue
        body = record["response"]["body"]
        choice = body["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        usage = body["usage"]
        print(f"  -> {text.strip()}")
        print(
            f"     {usage['prompt_tokens']} prompt tokens ({usage['prompt_tokens_details']['cached_tokens']} "
            f"cached), {usage['completion_tokens']} generated, finish: {choice['finish_reason']}"
        )
    stats = json.loads(Path(stats_path).read_text())
    hits, queries = stats["prefix_cache_hits_tokens"], stats["prefix_cache_queries_tokens"]
    print(
        f"\nprefix hits {hits}/{queries} prompt tokens, "
        f"peak pool {stats['pool_blocks_peak_used']}/{stats['pool_blocks_total']} blocks of "
        f"{stats['bytes_per_block']} B, {stats['num_steps']} steps in {stats['wall_seconds']:.1f}s"
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
