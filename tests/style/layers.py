#!/usr/bin/env python3
"""The layering of a component's sources: its folders are layers, lowest first, and a file
may include headers of its own layer or lower ones only; files at the source root are the
component's top and may include any layer. A folder that is not a declared layer fails, so
a new room is placed in the order when it is made.
  layers.py SRC_ROOT LAYER [LAYER...]"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1])
layers = sys.argv[2:]
rank = {name: i for i, name in enumerate(layers)}
top = len(layers)
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
failures = []
checked = 0
for folder, dirs, files in os.walk(root):
    rel = os.path.relpath(folder, root)
    first = rel.split(os.sep)[0]
    if rel != '.' and first not in rank:
        failures.append(f'{rel}/: a folder that is not a declared layer ({", ".join(layers)})')
        dirs[:] = []
        continue
    own = rank[first] if rel != '.' else top
    for name in files:
        if not name.endswith(('.h', '.cc', '.c')):
            continue
        path = os.path.join(folder, name)
        checked += 1
        with open(path, encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                m = include.match(line)
                if not m:
                    continue
                target = m.group(1)
                if not os.path.exists(os.path.join(root, target)):
                    continue  # not this component's (core, a system header, a sibling file)
                parts = target.split('/')
                theirs = rank.get(parts[0], top) if len(parts) > 1 else top
                if theirs > own:
                    where = os.path.relpath(path, root)
                    failures.append(f'{where}:{number}: includes "{target}" from a higher layer')
for failure in failures:
    print('FAIL', failure)
print(f'{checked} files of {root} checked against layers {" < ".join(layers)} < top')
sys.exit(1 if failures else 0)
