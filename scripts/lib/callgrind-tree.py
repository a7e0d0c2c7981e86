#!/usr/bin/env python3
"""Where a callgrind profile's instructions go, per unit of work, as a call tree (what `scripts/profile` keeps with
PROFILE_OUT).

    callgrind-tree.py FILE UNITS [--root TEXT]... [--callers TEXT] [--depth D] [--min M]

Every figure is instructions divided by UNITS (the notifications or jobs the profile counted), inclusive of what the
function calls; beside it, calls per unit. Names are demangled (`swift demangle`).
  --root TEXT     the callee tree of the heaviest function whose name contains TEXT, D levels deep (default 8), edges
                  of at least M a unit (default 50); repeatable. Default: the worker's two loops, SessionLoop.turns()
                  (jobs read, decoded, started, settled) and EventLoop.run() (HTTP/2 and TLS: requests and answers)
  --callers TEXT  instead, who calls each function whose name contains TEXT, and how much through each caller
A function that calls itself, directly or through others, is shown once on each path.
"""
import argparse
import collections
import re
import subprocess
import sys


def read_profile(path):
    """Self cost per function, and per call edge its inclusive cost and number of calls."""
    names = {}
    self_cost = collections.Counter()
    edge_cost = collections.defaultdict(collections.Counter)
    edge_calls = collections.defaultdict(collections.Counter)

    def name(text):
        # Callgrind compresses names: "(12) name" the first time, "(12)" after.
        match = re.match(r"\((\d+)\)(?: (.*))?", text)
        if not match:
            return text
        if match.group(2) is not None:
            names[match.group(1)] = match.group(2)
        return names.get(match.group(1), match.group(1))

    function = callee = None
    calls = None
    with open(path, errors="replace") as lines:
        for line in lines:
            if line.startswith("fn="):
                function = name(line[3:].rstrip("\n"))
            elif line.startswith("cfn="):
                callee = name(line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                calls = int(line[6:].split()[0])
            elif line[:1].isdigit() or line[:1] in "+-*":
                fields = line.split()
                if len(fields) < 2:
                    continue
                cost = int(fields[1])
                if calls is None:
                    self_cost[function] += cost
                else:
                    # The line after calls= is the call's inclusive cost.
                    edge_cost[function][callee] += cost
                    edge_calls[function][callee] += calls
                    calls = None
    return self_cost, edge_cost, edge_calls


def demangled(symbols):
    symbols = sorted(symbols)
    try:
        output = subprocess.run(
            ["swift", "demangle", "--simplified"], input="\n".join(symbols), capture_output=True, text=True,
            check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        output = symbols
    return dict(zip(symbols, output))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("units", type=int)
    parser.add_argument("--root", action="append")
    parser.add_argument("--callers")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--min", type=float, default=50)
    options = parser.parse_args()
    if options.units <= 0:
        sys.exit("callgrind-tree: UNITS is the number of notifications or jobs the profile counted, above 0")

    self_cost, edge_cost, edge_calls = read_profile(options.file)
    functions = set(self_cost) | set(edge_cost) | {c for edges in edge_cost.values() for c in edges}
    pretty = demangled(functions)
    units = options.units

    if options.callers:
        callers_of = collections.defaultdict(dict)
        for caller, edges in edge_cost.items():
            for callee, cost in edges.items():
                callers_of[callee][caller] = (cost, edge_calls[caller][callee])
        for function in sorted(functions, key=lambda f: pretty[f]):
            if options.callers not in pretty[function]:
                continue
            print("==", pretty[function][:150])
            for caller, (cost, calls) in sorted(callers_of[function].items(), key=lambda kv: -kv[1][0])[:25]:
                print("  %8.0f  %6.2f calls  %s" % (cost / units, calls / units, pretty[caller][:140]))
        return

    def inclusive(function):
        return self_cost[function] + sum(c for callee, c in edge_cost[function].items() if callee != function)

    def show(function, level, path):
        if level > options.depth:
            return
        for callee, cost in sorted(edge_cost[function].items(), key=lambda kv: -kv[1]):
            if cost / units < options.min or callee in path:
                continue
            calls = edge_calls[function][callee] / units
            print("%s%8.0f  %6.2f  %s" % ("  " * level, cost / units, calls, pretty[callee][:140]))
            show(callee, level + 1, path | {callee})

    roots = []
    for text in options.root or ["SessionLoop.turns()", "EventLoop.run()"]:
        matching = [f for f in functions if text in pretty[f]]
        if not matching:
            sys.exit(f"callgrind-tree: no function's name contains {text!r}")
        roots.append(max(matching, key=inclusive))
    print("instructions and calls per unit (%d units), inclusive" % units)
    for root in roots:
        print("%8.0f  self %.0f  %s" % (inclusive(root) / units, self_cost[root] / units, pretty[root][:150]))
        show(root, 1, {root})


if __name__ == "__main__":
    main()
