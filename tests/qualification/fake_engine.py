"""A stand-in for build/microgpt_cuda in the qualification's checks (test_qualification.py).

It speaks the engine's side of a check: parses the flags, reads TRAIN frames
on stdin, and at the --dump-grads-step-th step writes a gradient file and
prints `ready` (with the `paths` it runs) and `grads` events, as the CUDA
engine does. Its "gradients" are a fixed function of the step's tokens; a
fast path adds a small deterministic perturbation (the kind of difference a
real fast path makes), and the environment makes paths misbehave:

  FAKE_AVAILABLE   the fast paths this "build" has: cudnn,flash,fused,graph (default all)
  FAKE_BREAK       path:how[,path:how]: how is grads (one tensor rotated away: a low cosine), loss (off by
                   0.1), crash (SIGSEGV), exit (exit 5 with a CUDA error line), hang (sleeps), nondet (noise
                   that differs run to run); path is cudnn, flash, fused, graph or together (a fast
                   attention and the fused kernels at once)
  FAKE_LOG         a file that gets one line per invocation (its path flags)
"""
import os
import signal
import sys
import time

import numpy as np

from proxy.formats.frames import HEADER
from proxy.formats.parameters import n_params, param_layout


def main(argv):
    args = dict(zip(argv[::2], argv[1::2]))  # every flag the checks pass takes a value
    V, T, C, L = (int(args[f"--{k}"]) for k in ("vocab", "ctx", "dim", "layers"))
    attention, fused, graph = args.get("--attention", "naive"), args.get("--fused") == "on", args.get("--cuda-graph") == "on"
    fused = fused or graph
    available = set(os.environ.get("FAKE_AVAILABLE", "cudnn,flash,fused,graph").split(","))
    breaks = dict(b.split(":") for b in os.environ.get("FAKE_BREAK", "").split(",") if b)
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(f"{attention} fused={fused} graph={graph}\n")
    if attention != "naive" and attention not in available:
        print(f"microgpt: warning: --attention {attention}: not in this build; using the naive attention kernels",
              file=sys.stderr)
        attention = "naive"
    if graph and "graph" not in available:
        graph = False
    if fused and "fused" not in available:
        fused = graph = False
    active = [p for p, on in (("cudnn", attention == "cudnn"), ("flash", attention == "flash"), ("fused", fused),
                              ("graph", graph)) if on]
    if attention != "naive" and fused:
        active.append("together")
    print('{"event":"ready","step":0,"device":"Fake GPU (sm_90, 132 SMs, 79.6 GiB), attention %s","precision":"bf16",'
          '"paths":{"attention":"%s","fused":%s,"cuda_graph":%s}}'
          % (attention, attention, "true" if fused else "false", "true" if graph else "false"), flush=True)
    dump_step, n = int(args["--dump-grads-step"]), n_params(V, T, C, L)
    stdin = sys.stdin.buffer
    for step in range(1, dump_step + 1):
        header = stdin.read(HEADER.size)
        if len(header) < HEADER.size:
            return 0
        _magic, _kind, _flags, _id, _rows, _row_len, payload, _ = HEADER.unpack(header)
        tokens = np.frombuffer(stdin.read(payload), dtype=np.uint16)
    rng = np.random.default_rng(int(tokens.astype(np.int64).sum()))
    grads, loss = rng.normal(size=n).astype(np.float32), 5.0
    for p in active:
        how = breaks.get(p)
        grads *= np.float32(1.0 + 1e-4 * (1 + active.index(p)))  # a fast path's small, fixed difference
        if how == "grads":  # the first tensor replaced by unrelated values
            size = int(np.prod(param_layout(V, T, C, L)[0][1]))
            grads[:size] = np.random.default_rng(99).normal(size=size)
        elif how == "loss":
            loss += 0.1
        elif how == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif how == "exit":
            print("microgpt: error: CUDA error at microgpt_cuda.cu:1: an illegal memory access was encountered",
                  file=sys.stderr)
            return 5
        elif how == "hang":
            time.sleep(3600)
        elif how == "nondet":
            grads += np.random.default_rng().normal(scale=1e-6, size=n).astype(np.float32)
    grads.astype("<f4").tofile(args["--dump-grads"])
    print('{"event":"grads","step":%d,"loss":%r,"path":"%s"}' % (dump_step, loss, args["--dump-grads"]), flush=True)
    print('{"event":"exit","step":%d,"reason":"grads"}' % (dump_step - 1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
