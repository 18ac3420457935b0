#!/usr/bin/env python3
"""The include check of docs/design/layers.md.

Reads the layer table from the tessera_layer(...) and tessera_program(...) calls of
cmake/*.cmake (the same table CMake builds from), then checks every file under src/:

  * each file belongs to exactly one layer (its folder is listed, or the file itself);
  * a file of layer L includes only headers of L and of the layers L lists (PUBLIC or
    PRIVATE);
  * a header of L that another layer includes (part of L's interface) includes only
    headers of L and of its PUBLIC layers, since whoever includes it gets those too;
  * the layers form no cycle, and every layer named is defined.

Exit status 0 when all holds, 1 with one line per problem otherwise.
`--selftest` runs the checker on small bad trees and fails if it misses a problem.
"""
import argparse
import os
import re
import sys
import tempfile

KEYWORDS = ("DIRS", "FILES", "EXCLUDE", "PUBLIC", "PRIVATE", "LIBS")
SOURCE_EXTS = (".h", ".cpp", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
CALL_RE = re.compile(r"^\s*tessera_(layer|program)\s*\(", re.M)


class Unit:
    def __init__(self, name, kind):
        self.name, self.kind = name, kind
        self.dirs, self.files, self.exclude = set(), set(), set()
        self.public, self.private = set(), set()

    @property
    def deps(self):
        return self.public | self.private


def strip_comments(text):
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def parse_calls(text):
    """Yields (kind, [arguments]) for each tessera_layer/tessera_program call."""
    text = strip_comments(text)
    for m in CALL_RE.finditer(text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        yield m.group(1), text[m.end():i - 1].split()


def read_table(root):
    units = {}
    cmake_dir = os.path.join(root, "cmake")
    for fname in sorted(os.listdir(cmake_dir)):
        if not fname.endswith(".cmake"):
            continue
        with open(os.path.join(cmake_dir, fname)) as f:
            text = f.read()
        for kind, args in parse_calls(text):
            if not args or args[0].startswith("$") or args[0] in KEYWORDS:
                continue  # the function's own definition, not a call
            unit = units.setdefault(args[0], Unit(args[0], kind))
            key = None
            for arg in args[1:]:
                if arg in KEYWORDS:
                    key = arg
                elif key == "DIRS":
                    unit.dirs.add(arg.rstrip("/"))
                elif key == "FILES":
                    unit.files.add(arg)
                elif key == "EXCLUDE":
                    unit.exclude.add(arg)
                elif key == "PUBLIC":
                    unit.public.add(arg)
                elif key == "PRIVATE":
                    unit.private.add(arg)
    return units


def owner_of(path, units):
    """The unit a path (relative to the root, e.g. src/kv/kv_cache.h) belongs to, or None."""
    for unit in units.values():
        if path in unit.files:
            return unit
    folder = os.path.dirname(path)
    for unit in units.values():
        if folder in unit.dirs and path not in unit.exclude:
            return unit
    return None


def find_cycle(units):
    state = {}

    def visit(name, stack):
        state[name] = "open"
        for dep in sorted(units[name].deps):
            if dep not in units:
                continue
            if state.get(dep) == "open":
                return stack + [name, dep]
            if dep not in state:
                found = visit(dep, stack + [name])
                if found:
                    return found
        state[name] = "done"
        return None

    for name in sorted(units):
        if name not in state:
            found = visit(name, [])
            if found:
                return found[found.index(found[-1]):]
    return None


def check(root):
    problems = []
    units = read_table(root)
    if not units:
        return ["cmake/*.cmake: no tessera_layer(...) calls found"]
    for unit in units.values():
        for dep in sorted(unit.deps):
            if dep not in units or units[dep].kind != "layer":
                problems.append(f"cmake: '{unit.name}' lists '{dep}', which is no layer")
    cycle = find_cycle(units)
    if cycle:
        problems.append("cmake: the layers form a cycle: " + " -> ".join(cycle))

    # Pass 1: every project include, resolved to the file and unit it names.
    includes = []  # (path, lineno, text, unit, target path, target unit)
    src = os.path.join(root, "src")
    for dirpath, _, filenames in sorted(os.walk(src)):
        for fname in sorted(filenames):
            if not fname.endswith(SOURCE_EXTS):
                continue
            path = os.path.relpath(os.path.join(dirpath, fname), root)
            unit = owner_of(path, units)
            if unit is None:
                problems.append(f"{path}: belongs to no layer (add its folder to cmake/layers.cmake)")
                continue
            with open(os.path.join(root, path), errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE_RE.match(line)
                    if not m:
                        continue
                    included = m.group(1)
                    candidates = [os.path.join("src", included), os.path.join(os.path.dirname(path), included)]
                    target = next((c for c in candidates if os.path.isfile(os.path.join(root, c))), None)
                    if target is None:
                        continue  # not a project header (a generated or system one)
                    target = os.path.normpath(target)
                    target_unit = owner_of(target, units)
                    if target_unit is not None:
                        includes.append((path, lineno, included, unit, target, target_unit))
    # A header another unit includes is part of its layer's interface: what it includes,
    # its users get too, so that must be a PUBLIC dependency.
    public_headers = {target for path, _, _, unit, target, target_unit in includes if unit is not target_unit}
    # Pass 2: the rules.
    for path, lineno, included, unit, target, target_unit in includes:
        if target_unit is unit:
            continue
        if target_unit.name not in unit.deps:
            listed = ", ".join(sorted(unit.deps)) or "nothing"
            problems.append(
                f"{path}:{lineno}: includes \"{included}\" of layer '{target_unit.name}', which "
                f"'{unit.name}' does not depend on (it lists: {listed}); see docs/design/layers.md")
        elif path in public_headers and unit.kind == "layer" and target_unit.name not in unit.public:
            problems.append(
                f"{path}:{lineno}: {path} is included by other layers and includes \"{included}\" of layer "
                f"'{target_unit.name}', a PRIVATE dependency of '{unit.name}': make it PUBLIC in "
                "cmake/layers.cmake or move the include into the .cpp")
    return problems


# --- self test -----------------------------------------------------------------------

SELFTEST_TABLE = """
tessera_layer(core DIRS src/core)
tessera_layer(kv DIRS src/kv PUBLIC core)
tessera_layer(sched DIRS src/sched PUBLIC core PRIVATE kv)
tessera_program(app DIRS src/app PRIVATE sched core)
"""
SELFTEST_GOOD = {
    "src/core/a.h": "#pragma once\n",
    "src/core/a.cpp": '#include "core/a.h"\n',
    "src/kv/b.h": '#include "core/a.h"\n',
    "src/sched/c.h": '#include "core/a.h"\n#include <vector>\n',
    "src/sched/c.cpp": '#include "sched/c.h"\n#include "kv/b.h"\n',
    "src/sched/internal.h": '#include "kv/b.h"\n',  # PRIVATE is fine in a header only sched includes
    "src/sched/c2.cpp": '#include "sched/internal.h"\n',
    "src/app/main.cpp": '#include "sched/c.h"\n',
}
# Each bad case: files added to the good tree, and a piece of the message expected.
SELFTEST_BAD = [
    ({"src/core/up.cpp": '#include "kv/b.h"\n'}, "src/core/up.cpp:1: includes \"kv/b.h\" of layer 'kv'"),
    ({"src/app/x.cpp": '// skip\n#include "kv/b.h"\n'}, "src/app/x.cpp:2: includes \"kv/b.h\""),
    ({"src/sched/d.h": '#include "kv/b.h"\n', "src/app/y.cpp": '#include "sched/d.h"\n'},
     "a PRIVATE dependency of 'sched'"),
    ({"src/newdir/e.cpp": "int x;\n"}, "src/newdir/e.cpp: belongs to no layer"),
    ({"cmake/more.cmake": "tessera_layer(kv PRIVATE sched)\n"}, "the layers form a cycle"),
    ({"cmake/more.cmake": "tessera_layer(core PUBLIC nosuch)\n"}, "'core' lists 'nosuch', which is no layer"),
]


def write_tree(root, files):
    for rel, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)


def selftest():
    failures = 0
    base = {"cmake/layers.cmake": SELFTEST_TABLE, **SELFTEST_GOOD}
    with tempfile.TemporaryDirectory() as root:
        write_tree(root, base)
        problems = check(root)
        if problems:
            print("selftest: the good tree was rejected:\n  " + "\n  ".join(problems))
            failures += 1
    for extra, expected in SELFTEST_BAD:
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, {**base, **extra})
            problems = check(root)
            if not any(expected in p for p in problems):
                print(f"selftest: missed a problem (expected '{expected}'), got: {problems}")
                failures += 1
    print(f"check_layers selftest: {len(SELFTEST_BAD) + 1 - failures}/{len(SELFTEST_BAD) + 1} cases passed")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."),
                        help="the repository root (default: this script's repository)")
    parser.add_argument("--selftest", action="store_true", help="check the checker on small bad trees")
    args = parser.parse_args()
    if args.selftest:
        return selftest()
    problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} problem(s); the layers are in cmake/layers.cmake, "
              "the rules in docs/design/layers.md", file=sys.stderr)
        return 1
    print("check-layers: every include follows cmake/layers.cmake")
    return 0


if __name__ == "__main__":
    sys.exit(main())
