"""What the three examples share: the broker's URL and queue names (the same settings apns-worker reads), and a
channel that publishes with confirms."""
import json
import os

import pika

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
JOBS_QUEUE = os.environ.get("PUSH_JOBS_QUEUE", "push.jobs")
DEAD_TOKENS_QUEUE = os.environ.get("PUSH_DEAD_TOKENS_QUEUE", "push.dead-tokens")
REGISTRATIONS_QUEUE = os.environ.get("PUSH_REGISTRATIONS_QUEUE", "push.registrations")


def connect():
    """A connection and a channel in confirm mode: basic_publish returns once the broker has the message, and raises
    if it refused it (NackError) or had no queue for it (UnroutableError, with mandatory=True)."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.confirm_delivery()
    return connection, channel


def publish_json(channel, queue, document, **properties):
    """Publishes `document` as JSON straight to `queue` (the default exchange), persistent and mandatory."""
    channel.basic_publish(
        exchange="",
        routing_key=queue,
        body=json.dumps(document).encode(),
        mandatory=True,
        properties=pika.BasicProperties(content_type="application/json", delivery_mode=2, **properties),
    )
