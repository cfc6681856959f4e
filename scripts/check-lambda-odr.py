#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Finds, in programs built with nvcc, kernels whose lambdas can call through a null pointer.

nvcc wraps each extended __host__ __device__ lambda (KOKKOS_LAMBDA) on the host in a
__nv_hdl_wrapper_t whose copy, call and delete go through function pointers kept in
__nv_hdl_helper, a class template in an anonymous namespace: every translation unit has its own
copy of those pointers, and the wrapper's constructor sets the copy of the unit it was compiled
in. The wrapper and the Kokkos code that copies it (ParallelFor, ParallelReduceAdaptor, ...) are
ordinary templates, which the linker keeps once. So when two units instantiate the same kernel
template with the same arguments, a function may set its own unit's pointers and then call a
Kokkos function kept from the other unit, which reads that unit's pointers: null until the other
unit's copy of the kernel has run, and the program jumps to address 0. On a CPU the lambdas are
plain lambdas and nothing of this exists, so only a program linked for CUDA shows it.

This reads the disassembly (objdump) of each program: for each function, which helper pointers
it writes, which it reads, and which functions it calls directly. When a function writes one
copy of a helper and reaches, through direct calls a few deep, a function that reads another
copy of the same helper, the check reports the kernel template the lambda belongs to. Exit
status 1 when one is found. Calls through the PLT (between shared objects, or from a module
into itself when it exports the callee) are not followed, so a module can hide a case.
Files that are not ELF are skipped.

  scripts/check-lambda-odr.py PROGRAM...
"""
import collections
import re
import subprocess
import sys

FUNCTION = re.compile(r"^([0-9a-f]+) <(.+)>:$")
# An instruction that names a helper's pointer through RIP-relative addressing; objdump puts
# the target after '#'.
HELPER_REF = re.compile(r"^\s*[0-9a-f]+:\s+(\S+)\s+(\S+).*# ([0-9a-f]+) <(_ZN12_GLOBAL__N_1"
                        r"15__nv_hdl_helper.*E(?:9fp_copier|10fp_deleter|9fp_caller|"
                        r"18fp_noobject_caller)E)>")
DIRECT_CALL = re.compile(r"^\s*[0-9a-f]+:\s+(?:call|jmp)\s+([0-9a-f]+) <")
# In a demangled helper: the function the lambda is in, '&(long ns::f<...>(...))' -> 'ns::f<...>'.
ENCLOSING = re.compile(r"&\((?:[\w:]+ )?((?:\w+::)*\w+<.*?>)\(")
# How many direct calls deep a write may be from the read it mismatches.
MAX_DEPTH = 4


def read_program(path):
    """Per function address: (name, writes, reads, callees); writes and reads map a helper
    pointer's symbol to the addresses the function touches."""
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], check=True,
                          capture_output=True, text=True).stdout
    functions = {}
    current = None
    for line in dump.splitlines():
        match = FUNCTION.match(line)
        if match:
            current = int(match.group(1), 16)
            functions[current] = (match.group(2), collections.defaultdict(set),
                                  collections.defaultdict(set), set())
            continue
        if current is None:
            continue
        _, writes, reads, callees = functions[current]
        match = HELPER_REF.match(line)
        if match:
            mnemonic, operands, address, symbol = match.groups()
            # A store is 'mov %reg,disp(%rip)': the RIP operand comes last.
            is_store = mnemonic.startswith("mov") and operands.endswith("(%rip)")
            (writes if is_store else reads)[symbol].add(int(address, 16))
            continue
        match = DIRECT_CALL.match(line)
        if match:
            callees.add(int(match.group(1), 16))
    return functions


def reachable(functions, start, symbol):
    """Functions reached from start by direct calls, at most MAX_DEPTH deep, without passing
    through another function that sets `symbol` (such a function sets its own unit's copy
    before it uses it, so what it calls is that copy's business)."""
    seen = {start}
    frontier = [start]
    for _ in range(MAX_DEPTH):
        following = []
        for f in frontier:
            for callee in functions.get(f, (None, {}, None, ()))[3]:
                if callee in seen:
                    continue
                seen.add(callee)
                if symbol not in functions.get(callee, (None, {}, None, ()))[1]:
                    following.append(callee)
        frontier = following
    return seen


def demangle(names):
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                            check=True).stdout.splitlines()
    return result if len(result) == len(names) else names


def check(path):
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return True
    functions = read_program(path)
    copies = collections.defaultdict(set)
    for _, writes, reads, _ in functions.values():
        for table in (writes, reads):
            for symbol, addresses in table.items():
                copies[symbol] |= addresses
    duplicated = {symbol for symbol, addresses in copies.items() if len(addresses) > 1}
    findings = []
    for address, (name, writes, _, _) in functions.items():
        wanted = {s: a for s, a in writes.items() if s in duplicated}
        if not wanted:
            continue
        for symbol, written in wanted.items():
            for other in reachable(functions, address, symbol):
                other_name, other_writes, other_reads, _ = functions.get(
                    other, (None, {}, {}, None))
                stray = other_reads.get(symbol, set()) - written
                if stray and symbol not in other_writes:
                    findings.append((name, other_name, symbol))
    if findings:
        # One line per kernel template whose lambda is at risk: the function the lambda is in.
        helpers = demangle(sorted({symbol for _, _, symbol in findings}))
        kernels = collections.Counter()
        for helper in helpers:
            match = ENCLOSING.search(helper)
            kernels[match.group(1) if match else helper[:200]] += 1
        print(f"{path}: lambdas that can call through a null pointer (a function sets its unit's "
              f"__nv_hdl_helper and calls code that reads another unit's), by the function "
              f"they are in:")
        for kernel, count in sorted(kernels.items()):
            print(f"  {kernel} ({count} helper pointer(s))")
    else:
        print(f"{path}: no function sets one unit's lambda pointers and reaches another's "
              f"({len(duplicated)} helper pointer(s) used in more than one unit's copy)")
    return not findings


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    ok = True
    for path in argv[1:]:
        ok = check(path) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
