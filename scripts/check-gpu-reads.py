#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checks, in the PTX that nvcc makes of OkTopk's GPU kernels, that the kernels whose threads
loop over a gradient keep several reads in flight per thread.

A GPU thread issues its instructions in order. When a kernel uses each entry it reads before it
reads the next, and the use writes memory the compiler cannot tell from the input (an atomic on
a shared-memory histogram, the accumulate pass's output) or a branch sits between the reads (a
loop's own test), the thread waits out each read in turn: on an H200 `count_above` so read
float32 at a quarter of copy bandwidth, and bfloat16 in the same time (docs/benchmarks.md, GPU
selection kernels). The kernels below read a round of entries with no branch, store or atomic
between the reads (read_in_rounds, and OrderedCompaction's whole rows). This compiles the
translation units that instantiate them (the kernel benchmark, the library's base classes and
Ok-Topk) to PTX with the flags of a CUDA build's compile of each, and requires, in each kernel
and for each value type listed below, a stretch of at least a round's global loads that no
label, branch, store or atomic interrupts. Exit status 1 when a kernel falls short or is
missing.

  scripts/check-gpu-reads.py BUILD_DIR          a CUDA build of OkTopk with the apps (build-cuda)
  scripts/check-gpu-reads.py --ptx FILE...      check PTX files made already
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Global loads expected in a row, by the value type of the kernel's first View: a round of 8
# entries, 16 of 2-byte values, 32 in the compaction's rows; the accumulate pass reads two
# Views per entry.
WIDE = {"float": 8, "double": 8, "oktopk::bfloat16": 16, "oktopk::float16": 16}
ROWS = {"float": 32, "double": 32, "oktopk::bfloat16": 32, "oktopk::float16": 32}
# (a short name, what the demangled kernel name holds, loads expected by value type)
RULES = [
    ("radix histogram", "oktopk::impl::RadixHistogramDevice<", WIDE),
    ("gathering radix histogram", "oktopk::impl::RadixHistogramGathering<",
     {"float": 8, "double": 8}),
    ("count_above", "oktopk::impl::CountAboveStrided<", WIDE),
    ("compaction's Mark", "oktopk::impl::OrderedCompaction<oktopk::impl::KeepAbove<", ROWS),
    ("Gaussian moments", "oktopk::impl::MomentStrided<", WIDE),
    ("accumulate pass", "oktopk::impl::AccumulateCountingLevels<", {"float": 16, "double": 16}),
    ("count_above_levels", "oktopk::impl::CountAboveLevels<", {"float": 8, "double": 8}),
]
# The translation units that instantiate them: (ninja target, source).
SOURCES = [
    ("apps/oktopk-kernel-bench/oktopk-kernel-bench", "apps/oktopk-kernel-bench/main.cpp"),
    ("oktopk", "src/instantiate/sparse_allreduce.cpp"),
    ("oktopk", "src/instantiate/oktopk.cpp"),
]
LABEL = re.compile(r"^\$L\w+:")
BRANCH = re.compile(r"^(@!?%p\d+ )?bra")
ENTRY = re.compile(r"^(?:\.visible |\.weak )?\.entry (\S+)\(")
# Where a kernel's body ends: the next kernel or function.
FUNCTION_START = re.compile(r"^(?:\.visible |\.weak )?\.(?:entry|func) ")
# The first View of a kernel's arguments: the input x, 'Kokkos::View<float*, ...'.
VALUE_TYPE = re.compile(r"Kokkos::View<((?:oktopk::)?\w+)\*")


def ptx_of(build_dir, target, source):
    """PTX of `source` with the include paths, definitions and arch of its compile for `target`."""
    commands = subprocess.run(["ninja", "-C", build_dir, "-t", "commands", target], check=True,
                              capture_output=True, text=True).stdout
    line = next((l for l in commands.splitlines() if l.endswith(source) and " -c " in l), None)
    if line is None:
        sys.exit(f"check-gpu-reads: no compile of {source} for {target} in {build_dir}")
    words = shlex.split(line)
    flags, i = [], 0
    while i < len(words):
        w = words[i]
        if w == "-isystem" and i + 1 < len(words):
            flags += [w, words[i + 1]]
            i += 2
            continue
        if w.startswith(("-I", "-D", "-arch=", "-std=", "-O")):
            flags.append(w)
        i += 1
    fd, out = tempfile.mkstemp(suffix=".ptx")
    os.close(fd)
    try:
        subprocess.run(["nvcc", "-x", "cu", "-ptx", "--extended-lambda", *flags, "-o", out,
                        words[-1]], check=True, cwd=build_dir)
    except BaseException:
        os.unlink(out)
        raise
    return out


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True,
                         text=True).stdout.splitlines()
    return dict(zip(names, out))


def loads_per_run(body):
    """Global loads in each stretch of a kernel's PTX lines that no label, branch, store or
    atomic interrupts."""
    counts, current = [], 0
    for line in body:
        s = line.strip()
        if (LABEL.match(s) or BRANCH.match(s) or s.startswith(("st.", "atom.", "red."))):
            counts.append(current)
            current = 0
        elif s.startswith("ld.global"):
            current += 1
    counts.append(current)
    return counts


def check(ptx_files):
    lines = []
    for f in ptx_files:
        lines += open(f).read().splitlines()
    entries = [(i, m.group(1)) for i, l in enumerate(lines) if (m := ENTRY.match(l))]
    names = demangle([name for _, name in entries])
    starts = [i for i, l in enumerate(lines) if FUNCTION_START.match(l)] + [len(lines)]

    def body_end(start):
        return next(i for i in starts if i > start)

    failures = 0
    for short, pattern, expected in RULES:
        seen = set()
        for start, mangled in entries:
            name = names[mangled]
            if pattern not in name:
                continue
            if "OrderedCompaction" in pattern and "::Mark>" not in name:
                continue  # the compaction's Write kernel reads the bits, one word per thread
            value = VALUE_TYPE.search(name[name.index(pattern):])
            if value is None or value.group(1) not in expected:
                continue
            want = expected[value.group(1)]
            most = max(loads_per_run(lines[start:body_end(start)]))
            seen.add(value.group(1))
            verdict = "ok" if most >= want else "TOO FEW"
            print(f"{short} on {value.group(1)}: {most} loads in a row, at least {want}: "
                  f"{verdict}")
            failures += most < want
        for missing in sorted(set(expected) - seen):
            print(f"{short}: no kernel on {missing} in the PTX")
            failures += 1
    return failures


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    made = []
    if len(argv) >= 3 and argv[1] == "--ptx":
        ptx = argv[2:]
    elif len(argv) == 2:
        try:
            for target, source in SOURCES:
                made.append(ptx_of(argv[1], target, source))
        except BaseException:
            for f in made:
                os.unlink(f)
            raise
        ptx = made
    else:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        failures = check(ptx)
    finally:
        for f in made:
            os.unlink(f)
    if failures:
        print(f"check-gpu-reads: {failures} kernel(s) wait out their reads one at a time",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
