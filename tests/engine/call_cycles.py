#!/usr/bin/env python3
"""
call_cycles.py -- the engine's files call one way: negotiation returns its responses and the
set's loop runs them, nothing calls back into a file that calls it (engine/engine.h draws
the order). This reads the call graph from the objects themselves, with nm: file a calls
file b when one of a's undefined symbols is defined in b. It fails on any cycle, printing it.

usage: call_cycles.py OBJECT... (or one argument of ;-separated objects, as CMake passes it)
"""
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRCG":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
    return defined, undefined


def main(argv):
    objs = [o for a in argv for o in a.split(";") if o]
    if not objs:
        print("call_cycles.py: no objects given", file=sys.stderr)
        return 2
    syms = {os.path.basename(o).replace(".o", ""): symbols(o) for o in objs}
    calls = {a: sorted(b for b in syms if b != a and syms[a][1] & syms[b][0]) for a in syms}
    for a in sorted(calls):
        print("%s -> %s" % (a, " ".join(calls[a]) or "-"))
    state, path, cycles = {}, [], []

    def visit(v):
        state[v] = 1
        path.append(v)
        for w in calls[v]:
            if state.get(w) == 1:
                cycles.append(path[path.index(w):] + [w])
            elif w not in state:
                visit(w)
        path.pop()
        state[v] = 2

    for v in sorted(calls):
        if v not in state:
            visit(v)
    for c in cycles:
        print("cycle: " + " -> ".join(c), file=sys.stderr)
    print("%d files, %d cycles" % (len(calls), len(cycles)))
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
