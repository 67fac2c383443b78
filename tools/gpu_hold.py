#!/usr/bin/env python3
"""gpu_hold — hold all but FREE_GIB of a GPU's memory, as a desktop session or a notebook kernel does, so that
`memory.plan: auto` is seen planning under what is really free (no memory.gpu_limit_gib).

    python3 tools/gpu_hold.py FREE_GIB READY_FILE &    # CUDA_VISIBLE_DEVICES picks the GPU
    (wait for READY_FILE, run qtrain or train_bench, then kill the holder)

READY_FILE gets one line: the GiB held and the GiB left free. Needs torch with CUDA."""
import sys
import time

import torch


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    want = float(sys.argv[1]) * 2**30
    torch.empty(1, device="cuda")  # the context first: its memory counts as held
    free, total = torch.cuda.mem_get_info()
    if free <= want:
        sys.exit(f"gpu_hold: only {free / 2**30:.2f} GiB free, asked to leave {sys.argv[1]} GiB")
    held = torch.empty(int(free - want), dtype=torch.uint8, device="cuda")
    left, _ = torch.cuda.mem_get_info()
    with open(sys.argv[2], "w") as f:
        f.write(f"held {(free - left) / 2**30:.2f} GiB, free now {left / 2**30:.2f} GiB of {total / 2**30:.2f}\n")
    time.sleep(86400)  # held stays allocated until the process is killed
    del held


if __name__ == "__main__":
    main()
