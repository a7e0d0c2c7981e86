#!/usr/bin/env python3
"""Publishes one push job to apns-worker with publisher confirms, then waits for the job's summary on a reply queue
of its own and prints it (docs/contract.md: the job, its summary).

    publish_job.py --user alice --user bob --token 740f...78ad --alert "Your order shipped" [--id order-7]

Exits 0 with the summary on stdout; 1 if the broker refused the job or no summary came within --timeout seconds.
"""
import argparse
import json
import sys
import uuid

import pika

from common import JOBS_QUEUE, connect, publish_json

SUMMARY_FIELDS = ("job_id", "attempt", "notifications", "delivered", "dead", "failed", "retrying", "held_back",
                  "expired", "cancelled", "failed_by_reason")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--user", action="append", default=[], help="a user whose cached tokens the job reaches")
    parser.add_argument("--token", action="append", default=[], help="a device token (hex) the job reaches")
    parser.add_argument("--alert", required=True, help="the alert's text")
    parser.add_argument("--topic", help="the app's bundle ID (default: the workers' APNS_TOPIC)")
    parser.add_argument("--id", default=None, help="the job's id (default: a fresh one)")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for the summary")
    args = parser.parse_args()

    job = {"id": args.id or f"example-{uuid.uuid4()}", "users": args.user, "tokens": args.token,
           "payload": {"aps": {"alert": args.alert}}}
    if args.topic:
        job["topic"] = args.topic
    connection, channel = connect()
    replies = channel.queue_declare(queue="", exclusive=True).method.queue
    try:
        publish_json(channel, JOBS_QUEUE, job, reply_to=replies, correlation_id=job["id"], message_id=job["id"])
    except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as refused:
        print(f"the broker did not take the job (is a worker running, is {JOBS_QUEUE} declared?): {refused}",
              file=sys.stderr)
        return 1
    print(f"published {job['id']} to {JOBS_QUEUE}; waiting for its summary", file=sys.stderr)
    for method, properties, body in channel.consume(replies, auto_ack=True, inactivity_timeout=args.timeout):
        if method is None:
            print(f"no summary within {args.timeout} s", file=sys.stderr)
            return 1
        summary = json.loads(body)
        if properties.correlation_id != job["id"] or summary.get("job_id") != job["id"]:
            continue
        missing = [field for field in SUMMARY_FIELDS if field not in summary]
        if missing:
            print(f"the summary lacks {missing}: {summary}", file=sys.stderr)
            return 1
        print(json.dumps(summary))
        connection.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
