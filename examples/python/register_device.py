#!/usr/bin/env python3
"""What an app's backend sends on every app launch: a registration event with the device token, so that the token
cache stays fresh (`apns-worker cleanup` applies it; docs/contract.md: the registration event). Published with
publisher confirms.

    register_device.py --user alice --token 740f...78ad [--environment sandbox] [--topic com.example.app.voip]
                       [--timezone Europe/Paris] [--unregister]
"""
import argparse
import sys
import time

import pika

from common import REGISTRATIONS_QUEUE, connect, publish_json


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--user", required=True)
    parser.add_argument("--token", required=True, help="the device token, hex")
    parser.add_argument("--environment", default="production", choices=("production", "sandbox"))
    parser.add_argument("--topic", help="the full topic the token was issued for (default: the app's device token)")
    parser.add_argument("--timezone", help="the user's IANA time zone, for jobs with a local_window")
    parser.add_argument("--unregister", action="store_true", help="the user logged out on this device")
    args = parser.parse_args()

    event = {"user": args.user, "token": args.token, "environment": args.environment,
             "timestamp": int(time.time() * 1000), "action": "unregister" if args.unregister else "register",
             "device": {"model": "example"}}
    if args.topic:
        event["topic"] = args.topic
    if args.timezone:
        event["timezone"] = args.timezone
    connection, channel = connect()
    try:
        publish_json(channel, REGISTRATIONS_QUEUE, event)
    except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as refused:
        print(f"the broker did not take the event (is {REGISTRATIONS_QUEUE} declared?): {refused}", file=sys.stderr)
        return 1
    connection.close()
    print(f"registered {args.token[:8]}... for {args.user}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
