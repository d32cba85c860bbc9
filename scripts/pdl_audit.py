#!/usr/bin/env python3
"""Which kernels touch global memory before they wait for the previous kernel.

Under programmatic dependent launch (crates/cuda/src/launcher.rs) a kernel may start while the
previous one still runs; everything it reads that an earlier kernel writes must be read after
`griddepcontrol.wait` (SASS: ACQBULK). The compiler may hoist loads from `const __restrict__`
pointers (read-only, `ld.global.nc`) above that wait, because it takes their memory to be
unchanging for the kernel's lifetime: session 13's W8A8 GEMV read its just-quantized activations
that way and `serve` gave wrong text. This script compiles the NVRTC PTX to SASS for sm_90 and
lists, per kernel, the global accesses placed before the first ACQBULK, leaving out the streaming
weight loads (`load_streaming`: LDG.E.NA, the one early read the kernels intend). What remains
must be data no kernel writes (weight scales, host-uploaded tables); anything else is a race.

    DELTASERVE_PTX_DUMP=/tmp/ptx DELTASERVE_NVRTC_VENV=VENV \\
        cargo test --release -p deltaserve-cuda --test nvrtc_compile
    PATH=...:$PATH python3 scripts/pdl_audit.py /tmp/ptx [--allowed scripts/pdl_audit_allowed.txt]

With --allowed (as .ci/run calls it) it fails when a kernel has more early accesses than that file
grants it, each grant with its reason: a new early read must be looked at and written down.
ptxas, cuobjdump and nvdisasm come as pip wheels (scripts/requirements-sass.txt); put their bin
folder on PATH. No GPU needed.
"""

import pathlib
import re
import subprocess
import sys
import tempfile

GLOBAL_ACCESS = re.compile(r"\b(LDG|LD\.E|ST\.E|STG|ATOMG|ATOM|RED)\b")
STREAMING_WEIGHTS = "LDG.E.NA"


def sass_of(ptx: pathlib.Path, work: pathlib.Path) -> str:
    cubin = work / (ptx.stem + ".cubin")
    subprocess.run(["ptxas", "-arch=sm_90", str(ptx), "-o", str(cubin)], check=True)
    return subprocess.run(
        ["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True, text=True
    ).stdout


def early_accesses(sass: str):
    """(kernel, [instruction]) for each kernel with accesses before its first ACQBULK."""
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name, _, body = function.partition("\n")
        lines = body.split("\n")
        waits = [i for i, line in enumerate(lines) if "ACQBULK" in line]
        if not waits:
            continue
        early = [
            re.sub(r"\s+", " ", line.split(";")[0]).strip()
            for line in lines[: waits[0]]
            if GLOBAL_ACCESS.search(line) and STREAMING_WEIGHTS not in line
        ]
        if early:
            yield name.strip(), early


def read_allowed(path: pathlib.Path) -> dict:
    """`kernel count  # reason` lines: the early accesses each kernel may have."""
    allowed = {}
    for line in path.read_text().splitlines():
        entry = line.split("#", 1)[0].split()
        if entry:
            allowed[entry[0]] = int(entry[1])
    return allowed


def main() -> int:
    args = sys.argv[1:]
    allowed = None
    if len(args) == 3 and args[1] == "--allowed":
        allowed = read_allowed(pathlib.Path(args[2]))
    elif len(args) != 1:
        print(__doc__)
        return 2
    ptx_dir = pathlib.Path(args[0])
    found, over = 0, []
    with tempfile.TemporaryDirectory() as work:
        for ptx in sorted(ptx_dir.glob("*.ptx")):
            for kernel, accesses in early_accesses(sass_of(ptx, pathlib.Path(work))):
                found += 1
                print(f"{ptx.stem}: {kernel}: {len(accesses)} before the wait")
                for access in accesses:
                    print(f"    {access}")
                if allowed is not None and len(accesses) > allowed.get(kernel, 0):
                    over.append(f"{kernel}: {len(accesses)}, allowed {allowed.get(kernel, 0)}")
    print(f"{found} kernel(s) access global memory before waiting (streaming weight loads left out)")
    for line in over:
        print(f"not allowed: {line}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
