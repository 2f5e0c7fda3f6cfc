#!/usr/bin/env python3
"""Registers per thread and code size of each kernel, read from the CUDA
driver's JIT cache (no ptxas needed): the cache keeps each JIT-compiled
module as an ELF cubin, whose `.nv.info` section holds every function's
register count (EIATTR_REGCOUNT) and whose `.text.<kernel>` sections
hold the code.

    python3 benches/gpu/cubin_regs.py JITCACHE_DIR [NAME_SUBSTRING ...]

JITCACHE_DIR is `$CUDA_CACHE_PATH` on the GPU machine, or a carried
`jitcache.tar.xz` unpacked (`save_jitcache` in common.sh). A kernel whose
count exceeds 65536 / (threads per CTA) cannot run a CTA of that many
threads (one CTA per SM: 128 registers for 512 threads).
"""
import os
import struct
import sys

EIATTR_REGCOUNT = 0x2F


def sections(elf):
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = secs[shstrndx][4]

    def name(off):
        return elf[names + off : elf.index(b"\0", names + off)].decode()

    return secs, name


def kernels(elf):
    secs, name = sections(elf)
    symtab = next(s for s in secs if s[1] == 2)
    strtab = secs[symtab[6]][4]

    def sym(i):
        n = struct.unpack_from("<I", elf, symtab[4] + i * 24)[0]
        return elf[strtab + n : elf.index(b"\0", strtab + n)].decode()

    size = {name(s[0])[len(".text.") :]: s[5] for s in secs if name(s[0]).startswith(".text.")}
    regs = {}
    for s in secs:
        if name(s[0]) != ".nv.info":
            continue
        p, end = s[4], s[4] + s[5]
        while p < end:
            fmt, attr = elf[p], elf[p + 1]
            if fmt == 4:  # EIFMT_SVAL: u16 size, then the value
                n = struct.unpack_from("<H", elf, p + 2)[0]
                if attr == EIATTR_REGCOUNT:
                    f, v = struct.unpack_from("<II", elf, p + 4)
                    regs[sym(f)] = v
                p += 4 + n
            else:  # EIFMT_NVAL / BVAL / HVAL: 2 or 4 bytes
                p += 2 if fmt == 1 else 4
    return {k: (regs[k], size.get(k, 0)) for k in regs}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    want = sys.argv[2:]
    for root, _, files in os.walk(sys.argv[1]):
        for f in files:
            data = open(os.path.join(root, f), "rb").read()
            at = data.find(b"\x7fELF")
            if at < 0:
                continue
            try:
                found = kernels(data[at:])
            except (StopIteration, struct.error, ValueError):
                continue
            for k, (r, n) in sorted(found.items()):
                if not want or any(w in k for w in want):
                    print(f"{k:40} {r:4} registers {n:8} bytes of code")


if __name__ == "__main__":
    main()
