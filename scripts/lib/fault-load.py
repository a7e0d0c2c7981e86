"""The fault suite's load and arithmetic (scripts/faults), standard library only.

    fault-load.py users PREFIX COUNT           registration events of COUNT users (one live token each, every 20th
                                               also a dead one), one JSON object per line (apns-worker tokens import)
    fault-load.py dead PREFIX COUNT            the dead tokens among them, one per line (apns-sim --unregistered)
    fault-load.py live PREFIX COUNT            "user token" per line, the live ones
    fault-load.py jobs PREFIX COUNT RATE       one-user jobs with ids, paced at RATE a second (apns-worker enqueue -)
    fault-load.py resume SAMPLES FAULT_AT END  the longest time without a new delivery between FAULT_AT and the end
                                               of deliveries (SAMPLES: "seconds accepted" lines), in seconds
"""
import hashlib
import json
import sys
import time


def token(*parts):
    return hashlib.sha256("-".join(str(part) for part in parts).encode()).hexdigest()


def user(prefix, index):
    return f"{prefix}-u{index}"


def is_dead_holder(index):
    return index % 20 == 0


def main():
    mode, arguments = sys.argv[1], sys.argv[2:]
    if mode in ("users", "dead", "live"):
        prefix, count = arguments[0], int(arguments[1])
        for index in range(count):
            name = user(prefix, index)
            if mode == "live":
                print(name, token(prefix, index))
                continue
            if mode == "dead":
                if is_dead_holder(index):
                    print(token(prefix, index, "dead"))
                continue
            # Registered an hour ago: a 410 stamped when apns-sim started is newer, so the dead token goes.
            registered = int(time.time() * 1000) - 3_600_000
            print(json.dumps({"user": name, "token": token(prefix, index), "environment": "production",
                              "timestamp": registered}))
            if is_dead_holder(index):
                print(json.dumps({"user": name, "token": token(prefix, index, "dead"), "environment": "production",
                                  "timestamp": registered}))
    elif mode == "jobs":
        prefix, count, rate = arguments[0], int(arguments[1]), float(arguments[2])
        start = time.monotonic()
        for index in range(count):
            due = start + index / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            sys.stdout.write(json.dumps({"id": f"{prefix}-job{index}", "users": [user(prefix, index)],
                                         "payload": {"aps": {"alert": "fault suite"}}}) + "\n")
            sys.stdout.flush()
    elif mode == "resume":
        samples_path, fault_at, end = arguments[0], float(arguments[1]), float(arguments[2])
        samples = []
        with open(samples_path) as samples_file:
            for line in samples_file:
                fields = line.split()
                if len(fields) == 2:
                    samples.append((float(fields[0]), int(fields[1])))
        last_change, last_count, longest = fault_at, None, 0.0
        for at, count in samples:
            if at < fault_at:
                last_count = count
                continue
            if at > end:
                break
            if last_count is None or count > last_count:
                longest = max(longest, at - last_change)
                last_change, last_count = at, count
        print(f"{longest:.1f}")
    else:
        sys.exit(f"unknown mode {mode}")


main()
