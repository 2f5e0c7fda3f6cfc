#!/usr/bin/env python3
"""Lists the kernels of a PTX file that copy their parameters to local
memory at entry, and how many bytes a thread stores there.

A kernel parameter whose address escapes (a reference to it handed to a
function compiled out of line) is copied to local memory in the kernel's
first block, by every thread, whatever path the kernel then takes: the
host collectives' 552-byte arguments cost an 8-byte all-reduce about
2.5 us of 5.5 on an H200 (docs/gpu.md, lessons of session 14).

    python3 benches/gpu/entry_copy.py host/ptx/devcomm_kernels.sm_90.ptx [REGEX] [--stack]

With --stack, generic stores into the kernel's own stack frame
(`st.b64 [%SP+48]`: fields of a struct whose address a callee compiled out
of line needs, e.g. a barrier session's `&DevComm`) count too: they are
not `st.local`, but every thread still writes them at entry (the pushed
one-shot all-reduce: 72 bytes; docs/design.md, session 19).
"""
import re
import sys

WIDTH = {"b8": 1, "b16": 2, "b32": 4, "b64": 8, "u32": 4, "u64": 8, "s32": 4, "s64": 8, "f32": 4, "f64": 8}


def entry_copies(ptx, stack=False):
    """(kernel, bytes stored to local memory in its first block) for each
    kernel; with `stack`, generic stores to `[%SP...]` too."""
    for m in re.finditer(r"\.visible \.entry (\w+)\(", ptx):
        body = ptx[m.start():]
        body = body[: body.index("\n}\n")]
        stored = 0
        for line in body.split("\n")[3:]:
            if re.match(r"^\$L__BB", line) or re.search(r"\bbra(\.uni)?\b|\bbrx\b|^\s*@%p", line):
                break
            st = re.search(r"st\.local(?:\.v(\d))?\.(\w+)", line)
            if not st and stack:
                st = re.search(r"\bst(?:\.v(\d))?\.(\w+)\s+\[%SP\b", line)
            if st:
                stored += int(st.group(1) or 1) * WIDTH.get(st.group(2), 8)
        yield m.group(1), stored


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    args = [a for a in sys.argv[1:] if a != "--stack"]
    stack = len(args) < len(sys.argv) - 1
    pattern = re.compile(args[1] if len(args) > 1 else "")
    rows = [(k, b) for k, b in entry_copies(open(args[0]).read(), stack) if b >= 64 and pattern.search(k)]
    for kernel, stored in rows:
        print(f"{kernel:32s} {stored:5d} bytes a thread at entry")
    print(f"{len(rows)} kernels copy 64 bytes or more at entry")


if __name__ == "__main__":
    main()
