"""A/B of the Hopper attention forward between copies of kernel_src, in one process: each copy's
instance of head dims 256 and 128 (bf16) is built alone with torch's extension loader (about two
minutes, copies in parallel), then every case runs on each copy, outputs compared bit for bit,
and six interleaved rounds of CUDA-event timings give each copy's median. Sweeps on different
machines (or hours) move by several percent; this puts the copies side by side.

    git archive <commit> attention/kernel_src | tar -x -C /tmp/before --strip-components=2
    PROBE_BUILD=/tmp/before:256 python attention/benchmarks/probe/sm90_fwd_ab.py   (one build)
    python attention/benchmarks/probe/sm90_fwd_ab.py /tmp/before attention/kernel_src

(on an sm_90 GPU with CUDA torch and the nvidia-cutlass package). A copy from before 2933ab8
(whose FwdArgs has no window, modifier or varlen fields) needs PROBE_OLD_ARGS=<its path>; a copy
whose kernel has a plain / general template flag, PROBE_PLAIN_KERNEL=<its path> (only the plain
kernel is built and timed). Several paths: separated by the OS path separator.
Writes $OUT/sm90_fwd_ab.txt (or /tmp).
"""

import hashlib
import importlib.util
import os
import statistics
import sys

import torch
from probe_common import bench
from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))
CUTLASS = os.path.join(
    list(importlib.util.find_spec("cutlass_library").submodule_search_locations)[0],
    "source",
    "include",
)
HEAD_DIMS = (256, 128)
CASES = [  # B, S, D, causal (H = 32 query and key heads)
    (32, 512, 256, False),
    (32, 512, 256, True),
    (8, 2048, 256, False),
    (2, 8192, 256, False),
    (32, 512, 128, False),
    (8, 2048, 128, False),
    (8, 2048, 128, True),
]
ROUNDS = 6


def build(src: str, head_dim: int):
    src = os.path.abspath(src)
    tag = hashlib.sha1(src.encode()).hexdigest()[:8]

    def listed(var):
        return src in os.environ.get(var, "").split(os.pathsep)

    flags = [] if listed("PROBE_OLD_ARGS") else ["-DPROBE_PLAIN_ARGS"]
    flags += ["-DPROBE_PLAIN_KERNEL"] if listed("PROBE_PLAIN_KERNEL") else []
    return load(
        f"sm90_fwd_ab_{tag}_{head_dim}",
        [os.path.join(HERE, "sm90_fwd_ab_binding.cu")],
        extra_include_paths=[src, CUTLASS],
        extra_cuda_cflags=["-O3", "-std=c++17", "-DNDEBUG", "--expt-relaxed-constexpr",
                           f"-DPROBE_HEAD_DIM={head_dim}"] + flags,
        verbose=False,
    )  # fmt: skip


def main():
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    if os.environ.get("PROBE_BUILD"):
        src, head_dim = os.environ["PROBE_BUILD"].rsplit(":", 1)
        build(src, int(head_dim))
        return
    copies = sys.argv[1:]
    assert copies, "usage: sm90_fwd_ab.py <kernel_src copy> [<copy> ...]"
    mods = {(c, d): build(c, d) for c in copies for d in HEAD_DIMS}
    log = open(os.path.join(os.environ.get("OUT", "/tmp"), "sm90_fwd_ab.txt"), "w")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    for b, s, d, causal in CASES:
        gen = torch.Generator(device="cuda").manual_seed(s + d)
        q, k, v = (
            torch.randn(b, s, 32, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(3)
        )
        outs = {}
        for c in copies:
            out = torch.empty_like(q)
            lse = torch.empty(b, 32, s, device="cuda", dtype=torch.float32)
            mods[(c, d)].fwd(q, k, v, out, lse, causal, counter)
            outs[c] = (out, lse)
        same = all(torch.equal(outs[c][0], outs[copies[0]][0]) for c in copies)
        iters = max(5, 20 * 512 * 512 * 32 // (b * s * s))
        times = {c: [] for c in copies}
        for r in range(ROUNDS):
            for c in copies if r % 2 == 0 else copies[::-1]:
                out, lse = outs[c]
                call = lambda: mods[(c, d)].fwd(q, k, v, out, lse, causal, counter)  # noqa: E731
                times[c].append(1000 * bench(call, iters))
        line = f"B{b} S{s} D{d} {'causal' if causal else 'full'}: same bits {same}; " + ", ".join(
            f"{c} {statistics.median(t):.1f} us (min {min(t):.1f}, max {max(t):.1f})"
            for c, t in times.items()
        )
        print(line, flush=True)
        print(line, file=log, flush=True)


if __name__ == "__main__":
    main()
