#!/usr/bin/env python3
"""A token-cleanup consumer: takes dead-token events (410 Unregistered and the like) from apns-worker's dead-token
queue, writes each into a database of its own (SQLite here), and acknowledges the event only once the write is
committed, so that a crash between the two gets the event again rather than losing it (docs/contract.md: the
dead-token event).

    dead_token_consumer.py --db tokens.sqlite [--count N] [--timeout S]

Runs until N events are stored (or forever without --count); exits 1 if the wait for one lasts --timeout seconds.
"""
import argparse
import json
import sqlite3
import sys

from common import DEAD_TOKENS_QUEUE, connect

REQUIRED = ("token", "status", "topic", "environment", "timestamp")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True, help="the SQLite file the dead tokens are written to")
    parser.add_argument("--count", type=int, default=0, help="stop after this many events (0: never)")
    parser.add_argument("--timeout", type=float, default=None, help="give up after this long without an event")
    args = parser.parse_args()

    database = sqlite3.connect(args.db)
    database.execute("CREATE TABLE IF NOT EXISTS dead_tokens (token TEXT PRIMARY KEY, user TEXT, topic TEXT, "
                     "environment TEXT, status INTEGER, reason TEXT, died_at_ms INTEGER)")
    connection, channel = connect()
    channel.basic_qos(prefetch_count=100)
    stored = 0
    # The queue is the workers' (they declare it, durable): used as it is.
    for method, _, body in channel.consume(DEAD_TOKENS_QUEUE, inactivity_timeout=args.timeout):
        if method is None:
            print(f"no dead-token event within {args.timeout} s", file=sys.stderr)
            return 1
        event = json.loads(body)
        missing = [field for field in REQUIRED if field not in event]
        if missing:
            # Not an event this consumer understands: set aside (not requeued, or it would come back for ever).
            print(f"rejecting an event without {missing}: {event}", file=sys.stderr)
            channel.basic_reject(method.delivery_tag, requeue=False)
            continue
        with database:  # commits, or rolls back and raises: the event is acknowledged only after the commit
            database.execute("INSERT OR REPLACE INTO dead_tokens VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (event["token"], event.get("user"), event["topic"], event["environment"],
                              event["status"], event.get("reason"), event["timestamp"]))
        channel.basic_ack(method.delivery_tag)
        stored += 1
        print(f"stored dead token {event['token'][:8]}... of user {event.get('user')}", file=sys.stderr)
        if args.count and stored >= args.count:
            break
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
