"""`kvferry batch submit|status|wait`: a JSONL of requests through a running api's Batch API, over
HTTP with the official openai client (what any other client of the api would do): upload the file,
create the batch, poll its request_counts behind a progress bar, download its output and errors."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from broker.defaults import DEFAULTS

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types import Batch

# A batch in one of these states changes no more (OpenAI's Batch statuses).
FINAL = frozenset({"completed", "failed", "expired", "cancelled"})
Endpoint = Literal["/v1/chat/completions", "/v1/completions"]


def _client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--api-key", help="the api's key (default: KVFERRY_API_KEY; none needed when auth is off)"
    )(fn)
    return click.option(
        "--url",
        default=f"http://{DEFAULTS.api_host}:{DEFAULTS.api_port}",
        show_default=True,
        help="the api to talk to",
    )(fn)


def _client(url: str, api_key: str | None) -> OpenAI:
    from openai import OpenAI

    from ops.settings import Settings

    key = api_key or Settings.from_env().api_key or "none"  # the client insists on some key
    return OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key=key, max_retries=3, timeout=120)


def _metadata(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--metadata")
        out[key] = value
    return out


def submit(client: OpenAI, path: Path, endpoint: Endpoint, metadata: dict[str, str]) -> Batch:
    with path.open("rb") as f:
        uploaded = client.files.create(file=(path.name, f), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,
        completion_window="24h",
        metadata=metadata or None,
    )


def wait(client: OpenAI, batch_id: str, poll_s: float, show: bool = True) -> Batch:
    """Poll until the batch is final, a rich progress bar (on stderr) over its request_counts."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not show) as bar:
        task = bar.add_task(batch_id, total=None)
        while True:
            batch = client.batches.retrieve(batch_id)
            counts = batch.request_counts
            if counts is not None:
                done = counts.completed + counts.failed
                bar.update(task, total=counts.total or None, completed=done)
            bar.update(task, description=f"{batch_id} {batch.status}")
            if batch.status in FINAL:
                return batch
            time.sleep(poll_s)


def download(client: OpenAI, file_id: str | None, out: Path) -> int:
    """The file's contents into `out` (empty when there is none); its bytes."""
    if file_id is None:
        out.write_bytes(b"")
        return 0
    with client.files.with_streaming_response.content(file_id) as response:
        response.stream_to_file(out)
    return out.stat().st_size


def _summary(batch: Batch) -> str:
    counts = batch.request_counts
    done = (
        f"{counts.completed} completed, {counts.failed} failed of {counts.total}" if counts else "no counts"
    )
    return f"{batch.id}: {batch.status} ({done})"


@click.group("batch")
def batch_cmd() -> None:
    """OpenAI Batch API jobs on a running api: submit a JSONL, follow it, fetch its output."""


@batch_cmd.command("submit")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--endpoint",
    type=click.Choice(["/v1/chat/completions", "/v1/completions"]),
    default="/v1/chat/completions",
    show_default=True,
    help="the endpoint every line's url names",
)
@click.option("--metadata", multiple=True, help="key=value, repeatable (at most 16 pairs)")
@_client_options
def submit_cmd(
    path: Path, endpoint: Endpoint, metadata: tuple[str, ...], url: str, api_key: str | None
) -> None:
    """Upload PATH (one request per line, OpenAI's batch format) and create a batch; prints its id."""
    batch = submit(_client(url, api_key), path, endpoint, _metadata(metadata))
    click.echo(batch.id)


@batch_cmd.command("status")
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True, help="the whole Batch object, as the api returns it")
@_client_options
def status_cmd(batch_id: str, as_json: bool, url: str, api_key: str | None) -> None:
    """A batch's status and request counts."""
    batch = _client(url, api_key).batches.retrieve(batch_id)
    click.echo(json.dumps(batch.model_dump(), indent=2) if as_json else _summary(batch))


@batch_cmd.command("wait")
@click.argument("batch_id")
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="output JSONL",
)
@click.option("--errors", type=click.Path(dir_okay=False, path_type=Path), help="the error file's JSONL")
@click.option("--poll", "poll_s", type=float, default=1.0, show_default=True, help="seconds between polls")
@_client_options
def wait_cmd(
    batch_id: str, out: Path, errors: Path | None, poll_s: float, url: str, api_key: str | None
) -> None:
    """Follow a batch to its end (a progress bar), then download its output (and errors). Exits 1
    unless it completed; an expired or cancelled batch's finished lines are downloaded all the same."""
    client = _client(url, api_key)
    batch = wait(client, batch_id, poll_s)
    size = download(client, batch.output_file_id, out)
    click.echo(f"{_summary(batch)}; output: {out} ({size} bytes)", err=True)
    if errors is not None:
        size = download(client, batch.error_file_id, errors)
        click.echo(f"errors: {errors} ({size} bytes)", err=True)
    if batch.status != "completed":
        raise SystemExit(1)
