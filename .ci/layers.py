#!/usr/bin/env python3
"""Checks the architecture docs/DESIGN.md draws, on the source and on the built objects:

1. includes point down: a file in one layer includes headers of layers below it (or of its
   own folder) only;
2. no call cycles: no two files of the libraries and khorrun use each other's symbols,
   directly or around a loop (read from the objects with nm; static functions do not count).

Usage: .ci/layers.py BUILD_DIR | OBJECT...   (exit 1 and a line per violation). CTest runs it
on the objects CMake names (tests/CMakeLists.txt: test `layers`), so stale objects of moved
files in an old build tree never count."""
import collections
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), '..'))
# Lowest first; a layer may include from any layer of a lower number. cuda/ is the memory
# seam's device backend: it implements collectives/mem.h, so it sits just above collectives.
LEVEL = {'include': 0, 'base': 1, 'transport': 2, 'rendezvous': 2, 'collectives': 3,
         'cuda': 4, 'runtime': 5, 'engine': 6, 'bindings': 7, 'launcher': 8, 'bench': 8,
         'examples': 8, 'tests': 9}
LIBS = ['khor_base', 'khor_transport', 'khor_collectives', 'khor_rendezvous', 'khor_runtime',
        'khor_engine', 'khor', 'khorrun']


def layer_of(path):
    return path.split('/')[0]


def check_includes():
    bad = []
    files = subprocess.check_output(['git', '-C', ROOT, 'ls-files', '*.c', '*.h', '*.cu'],
                                    text=True).split()
    inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    for f in files:
        me = layer_of(f)
        if me not in LEVEL:
            continue
        for target in inc.findall(open(os.path.join(ROOT, f)).read()):
            if '/' not in target:
                continue  # same folder, or include/khor.h
            them = layer_of(target)
            if them == me or them not in LEVEL:
                continue
            if LEVEL[them] >= LEVEL[me]:
                bad.append('%s includes %s: %s/ is not below %s/' % (f, target, them, me))
    return bad


def check_cycles(args):
    if len(args) == 1 and os.path.isdir(args[0]):
        objs = [o for o in glob.glob(args[0] + '/**/*.o', recursive=True)
                if any('/CMakeFiles/%s.dir/' % lib in o for lib in LIBS)]
    else:
        # CMake's $<TARGET_OBJECTS:...> comes as one ';'-separated argument per target.
        objs = [o for a in args for o in a.split(';') if o.endswith('.o')]
    if not objs:
        return ['no object files in %s: build first' % ' '.join(args)]
    defs, uses = {}, collections.defaultdict(set)

    def name(o):
        return o.split('.dir/', 1)[1][:-2]

    for o in objs:
        for line in subprocess.check_output(['nm', o], text=True).splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in 'TDBR':
                defs[parts[2]] = name(o)
            elif len(parts) == 2 and parts[0] == 'U':
                uses[name(o)].add(parts[1])
    graph = collections.defaultdict(set)
    for f, syms in uses.items():
        for s in syms:
            if s in defs and defs[s] != f:
                graph[f].add(defs[s])
    # Tarjan's strongly connected components: a component of more than one file is a cycle.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    bad = []
    for comp in comps:
        edges = []
        for a in comp:
            for b in sorted(graph[a] & set(comp)):
                syms = sorted(s for s in uses[a] if defs.get(s) == b)
                edges.append('%s -> %s (%s)' % (a, b, ', '.join(syms[:4])))
        bad.append('call cycle among %s: %s' % (', '.join(comp), '; '.join(edges)))
    return bad


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    bad = check_includes() + check_cycles(sys.argv[1:])
    for b in bad:
        print('layers: ' + b)
    if bad:
        sys.exit(1)
    print('layers: includes point down and no files call each other in a cycle')


main()
