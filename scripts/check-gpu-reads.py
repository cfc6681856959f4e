#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checks, in the PTX that nvcc makes of the kernel benchmark, that the streaming kernels keep
several reads in flight per GPU thread.

A GPU thread issues its instructions in order. When a kernel uses each entry it reads before it
reads the next, and the use writes memory the compiler cannot tell from the input (an atomic on
a shared-memory histogram), or a branch sits between the reads, the thread waits out each read
in turn: on an H200 such kernels ran at a quarter of copy bandwidth or less, and took as long on
bfloat16 as on float32 (docs/benchmarks.md, GPU selection kernels). The kernels below read a
round of entries with no branch, store or atomic between the reads (read_in_rounds, and
OrderedCompaction's whole rows). This compiles apps/oktopk-kernel-bench/main.cpp to PTX with the
flags of a CUDA build's compile of it and requires, in each of these kernels and for each of
float, double, bfloat16 and float16, a stretch of at least a round's global loads that no
label, branch, store or atomic interrupts (8 reads, 16 of 2-byte values, 32 in the
compaction's rows). Exit status 1 when a kernel falls short or is missing.

  scripts/check-gpu-reads.py BUILD_DIR    a CUDA build of OkTopk with the apps (build-cuda)
  scripts/check-gpu-reads.py --ptx FILE   check a PTX file made already
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Global loads expected in a row, by the value type of the kernel's input.
WIDE = {"float": 8, "double": 8, "oktopk::bfloat16": 16, "oktopk::float16": 16}
ROWS = {"float": 32, "double": 32, "oktopk::bfloat16": 32, "oktopk::float16": 32}
# (a short name, what the demangled kernel name holds, loads expected by value type)
RULES = [
    ("radix histogram", "oktopk::impl::RadixHistogramDevice<", WIDE),
    ("count_above", "oktopk::impl::CountAboveStrided<", WIDE),
    ("compaction's Mark", "oktopk::impl::OrderedCompaction<oktopk::impl::KeepAbove<", ROWS),
]
LABEL = re.compile(r"^\$L\w+:")
BRANCH = re.compile(r"^(@!?%p\d+ )?bra")
ENTRY = re.compile(r"^(?:\.visible |\.weak )?\.entry (\S+)\(")
# Where a kernel's body ends: the next kernel or function.
FUNCTION_START = re.compile(r"^(?:\.visible |\.weak )?\.(?:entry|func) ")
# The first View of a kernel's arguments: the input x, 'Kokkos::View<float*, ...'.
VALUE_TYPE = re.compile(r"Kokkos::View<((?:oktopk::)?\w+)\*")


def ptx_of(build_dir):
    """PTX of the kernel benchmark with its compile's include paths, definitions and arch."""
    commands = subprocess.run(
        ["ninja", "-C", build_dir, "-t", "commands", "apps/oktopk-kernel-bench/oktopk-kernel-bench"],
        check=True, capture_output=True, text=True).stdout
    line = next((l for l in commands.splitlines() if "oktopk-kernel-bench/main.cpp" in l
                 and " -c " in l), None)
    if line is None:
        sys.exit("check-gpu-reads: no compile of apps/oktopk-kernel-bench/main.cpp in " + build_dir)
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
    source = words[-1]
    fd, out = tempfile.mkstemp(suffix=".ptx")
    os.close(fd)
    try:
        subprocess.run(["nvcc", "-x", "cu", "-ptx", "--extended-lambda", *flags, "-o", out,
                        source], check=True, cwd=build_dir)
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


def check(ptx_file):
    lines = open(ptx_file).read().splitlines()
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
    if len(argv) == 3 and argv[1] == "--ptx":
        ptx = argv[2]
    elif len(argv) == 2:
        ptx = ptx_of(argv[1])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        failures = check(ptx)
    finally:
        if len(argv) == 2:
            os.unlink(ptx)
    if failures:
        print(f"check-gpu-reads: {failures} kernel(s) wait out their reads one at a time",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
