"""A Celery task message exactly as kombu's Redis transport queues it, built without a broker
connection: (list key, payload) for an LPUSH the caller sends in a transaction of its own.

The api records a job and queues it in one Redis transaction (api/jobs/client.py): the metadata
and the message appear together or not at all, in one round trip, from the event loop. Celery's
own send_task is synchronous (a thread hop each way) and takes a round trip of its own.

Celery builds the message (headers and body: `app.amqp.create_task_message`, task protocol 2)
and kombu serialises it; what is left is the transport's envelope, as kombu's virtual channel
and Redis `_put` write it for a direct queue: the anonymous exchange, the queue's name as the
routing key, the priority band's list as the key (broker/priority.py), a base64 body and a fresh
delivery tag. A test compares the payload with what `send_task` itself pushes
(tests/broker/test_task_message.py), so a Celery or kombu upgrade that changes the envelope fails
there, not in production.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu.serialization import dumps as serialize
from kombu.utils.json import dumps as json_dumps

from broker.priority import PRIORITY_STEPS, queue_key

PERSISTENT = 2  # kombu's delivery_mode for 'persistent', Celery's default


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    key: str  # the Redis list kombu's consumers BRPOP: the queue's list for the message's band
    payload: str
    tag: str = ""  # its delivery tag: kombu's key for it among the unacked (broker/jobs/delivery.py)


def check_supported(app: Celery) -> None:
    """The envelope below is the anonymous exchange's, under the queue's own name, in the band's
    list with the bands broker/priority.py knows: a configuration that would route, prioritise
    or prefix otherwise is refused, not mis-sent."""
    conf = app.conf
    options = conf.broker_transport_options or {}
    steps = options.get("priority_steps")
    unsupported = {
        "task_default_priority": conf.task_default_priority,
        "task_routes": conf.task_routes,
        "global_keyprefix": options.get("global_keyprefix"),
        "priority_steps": steps if steps is None or tuple(steps) != PRIORITY_STEPS else None,
        "sep": options.get("sep"),
    }
    configured = {k: v for k, v in unsupported.items() if v}
    if configured:
        raise ValueError(f"broker/task_message.py does not build messages for {configured}: use send_task")


def task_message(
    app: Celery, name: str, task_id: str, args: list[Any], queue: str, priority: int = 0
) -> QueuedMessage:
    """The message `app.send_task(name, args=args, task_id=task_id, queue=queue, priority=priority)`
    would push (for an app check_supported accepts); priority is the band, 0..9."""
    if priority not in PRIORITY_STEPS:
        raise ValueError(f"priority band {priority!r} is not one of {PRIORITY_STEPS}")
    message = app.amqp.create_task_message(
        task_id,
        name,
        args,
        {},
        reply_to=app.thread_oid,
        create_sent_event=app.conf.task_send_sent_event,
        ignore_result=None,  # send_task's own default: the task's setting decides
    )
    content_type, content_encoding, body = serialize(message.body, serializer=app.conf.task_serializer)
    raw = body.encode(content_encoding) if isinstance(body, str) else body
    properties = dict(message.properties)
    tag = str(uuid.uuid4())
    properties.update(
        delivery_mode=PERSISTENT,
        delivery_info={"exchange": "", "routing_key": queue},
        priority=priority,
        body_encoding="base64",
        delivery_tag=tag,
    )
    envelope = {
        "body": base64.b64encode(raw).decode("ascii"),
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": message.headers,
        "properties": properties,
    }
    return QueuedMessage(queue_key(queue, priority), json_dumps(envelope), tag)
