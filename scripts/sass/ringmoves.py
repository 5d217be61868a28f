#!/usr/bin/env python3
"""Lists loops whose last instructions move registers a load in the loop wrote.

A decode product keeps a ring of weight loads in flight: it copies the oldest
slot out, loads the next into it and multiplies the copy. Written plainly
(`cur = raw[k]; raw[k] = load(...)`), ptxas may load into new registers,
multiply the slot in place and move the new registers into the slot at the
loop's end, where the moves wait for the load just issued: the ring is a slot
shallower than written. kernels/common.cuh's `kept` avoids it (NOTES.md,
2026-11-30). This lists, for each kernel of the cubins, the backward branches
whose last fifth (at least 12 instructions) holds four or more moves out of
registers an LDG of the same loop wrote; each loop of a nest is listed on its own.

Cubins come from the dev machine's NVRTC (no GPU needed):

  mkdir -p /tmp/nv && LD_LIBRARY_PATH=... KILN_NVRTC_CHECK=sm_90a KILN_NVRTC_OUT=/tmp/nv \
    go test -count=1 -run 'TestNVRTCCompile/.*/quant.cu' ./backend/cuda
  CUOBJDUMP=/opt/cudatk/usr/bin/cuobjdump python3 scripts/sass/ringmoves.py /tmp/nv/sm_90a-quant.cubin
"""
import os
import re
import subprocess
import sys

CUOBJDUMP = os.environ.get("CUOBJDUMP", "cuobjdump")


def functions(cubin):
    out = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    fn, res = None, {}
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            fn = m.group(1)
            res[fn] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?);", line)
        if m and fn:
            res[fn].append((int(m.group(1), 16), m.group(2)))
    return res


def loaded_registers(body):
    regs = set()
    for _, ins in body:
        m = re.search(r"LDG\.E(\S*)\s+R(\d+),", ins)
        if m:
            width = 4 if ".128" in m.group(1) else 2 if ".64" in m.group(1) else 1
            regs.update(range(int(m.group(2)), int(m.group(2)) + width))
    return regs


def main():
    for cubin in sys.argv[1:]:
        for fn, ins in functions(cubin).items():
            for addr, text in ins:
                m = re.search(r"BRA (?:!?U?P\d, )?0x([0-9a-f]+)", text)
                if not m or int(m.group(1), 16) >= addr:
                    continue
                start = int(m.group(1), 16)
                body = [x for x in ins if start <= x[0] <= addr]
                loaded = loaded_registers(body)
                tail = body[-max(12, len(body) // 5):]
                moves = 0
                for _, t in tail:
                    mm = re.search(r"(?:IMAD\.MOV\.U32 R\d+, RZ, RZ, |MOV R\d+, )R(\d+)$", t.strip())
                    if mm and int(mm.group(1)) in loaded:
                        moves += 1
                if moves >= 4:
                    print(f"{os.path.basename(cubin)} {fn}: loop {start:x}-{addr:x} ({len(body)} instructions): "
                          f"{moves} moves out of loaded registers at its end")


if __name__ == "__main__":
    main()
