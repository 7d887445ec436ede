"""A stand-in for build/microgpt_cuda in the qualification's checks (test_qualification.py).

It speaks the engine's side of a check: parses the flags, prints `ready`
(with the `paths` it runs), trains on TRAIN frames with AdamW at the
engine's schedule (microgpt/model.h) and prints `step` events, answers a
SAMPLE frame with a `sample` event, and writes real checkpoint files (on a
CHECKPOINT frame, every --ckpt-every steps, and at EOF). Its "gradient" is a
fixed function of the step's tokens and the weights; a training fast path
multiplies it by a factor within 1e-4 of 1 (the kind of difference a real
fast path makes), and the environment makes paths misbehave:

  FAKE_AVAILABLE   the fast paths this "build" has: cudnn,flash,fused,graph (default all)
  FAKE_BREAK       path:how[,path:how]; path is cudnn, flash, fused, graph, together (a fast attention
                   and the fused kernels at once), kv (the KV cache) or snapshot (the asynchronous one);
                   how is
                     scale    the gradients 1.5 times too large (AdamW's update does not change: a cosine passes)
                     update   the updates 1.5 times too large (a learning rate off by a constant factor)
                     stalelr  step 1's learning rate kept for every step (a stale graph parameter)
                     skip     step 5's update not applied (a stuck skip flag)
                     grads    the first tensor's gradient replaced by unrelated values
                     loss     every loss off by 0.1
                     nondet   noise that differs run to run
                     crash    SIGSEGV; exit: exit 5 with a CUDA error line; hang: sleeps
                     tokens   (kv) one sampled token different from the recompute path's
                     bytes    (snapshot) a checkpoint holding the state of the step after its own
  FAKE_LOG         a file that gets one line per invocation (its path flags)
  FAKE_FP8         --precision fp8: `gap:X` every loss times 1 + X (default gap:0.001, within the FP8 bound),
                   `missing` exit 2 with the CUDA engine's line for a build without FP8, `ignored` runs bf16
"""

import math
import os
import signal
import sys
import time
import zlib

import numpy as np

from proxy.formats.checkpoint import Trailer, checkpoint_path, encode_checkpoint
from proxy.formats.frames import CHECKPOINT, HEADER, SAMPLE, SAMPLE_PARAMS, SAMPLE_PROMPT, TRAIN
from proxy.formats.parameters import ModelShape, n_params, param_layout

BOOL_FLAGS = {"--sample-recompute", "--sync-snapshot"}


def parse(argv):
    args, i = {}, 0
    while i < len(argv):
        if argv[i] in BOOL_FLAGS:
            args[argv[i]] = True
            i += 1
        else:
            args[argv[i]] = argv[i + 1]
            i += 2
    return args


def lr_at(s, lr, min_lr, warmup, steps):  # microgpt/model.h, mg_lr_at
    if warmup > 0 and s <= warmup:
        return lr * s / warmup
    span = steps - warmup
    progress = min(1.0, (s - warmup) / span) if span > 0 else 1.0
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Fake:
    def __init__(self, args, active, breaks):
        self.args, self.active, self.breaks = args, active, breaks
        self.V, self.T, self.C, self.L, self.H = (
            int(args[f"--{k}"]) for k in ("vocab", "ctx", "dim", "layers", "heads")
        )
        self.n = n_params(self.V, self.T, self.C, self.L)
        self.opt = {k: float(args[f"--{k}"]) for k in ("lr", "min-lr", "beta1", "beta2", "eps", "weight-decay")}
        self.warmup, self.steps = int(args["--warmup"]), int(args["--steps"])
        self.w = (np.random.default_rng(int(args["--seed"])).normal(size=self.n) * 0.02).astype(np.float32)
        self.m = np.zeros(self.n, np.float32)
        self.v = np.zeros(self.n, np.float32)
        self.step, self.saved, self.pending = 0, -1, None
        self.fp8_gap = 0.0

    def broken(self, how):
        return [p for p in self.active if self.breaks.get(p) == how]

    def train(self, tokens):
        s = self.step + 1
        a = np.random.default_rng(int(tokens.astype(np.int64).sum())).normal(size=self.n).astype(np.float32)
        g = a + np.float32(0.5) * self.w
        loss = 4.0 + float(np.mean(a * self.w)) + (0.1 if self.broken("loss") else 0.0)
        loss *= 1.0 + self.fp8_gap
        for k, _p in enumerate(p for p in self.active if p in ("cudnn", "flash", "fused", "graph")):
            g *= np.float32(1.0 + 1e-4 * (1 + k))  # a fast path's small, fixed difference
        if self.broken("scale"):
            g *= np.float32(1.5)
        if self.broken("grads"):
            size = int(np.prod(param_layout(self.V, self.T, self.C, self.L)[0][1]))
            g[:size] = np.random.default_rng(99).normal(size=size)
        if self.broken("nondet"):
            g += np.random.default_rng().normal(scale=1e-6, size=self.n).astype(np.float32)
        lr = lr_at(1 if self.broken("stalelr") else s, self.opt["lr"], self.opt["min-lr"], self.warmup, self.steps)
        if not (self.broken("skip") and s == 5):
            b1, b2 = self.opt["beta1"], self.opt["beta2"]
            self.m = (b1 * self.m + (1 - b1) * g).astype(np.float32)
            self.v = (b2 * self.v + (1 - b2) * g * g).astype(np.float32)
            step_size = lr / (1 - b1**s) * (1.5 if self.broken("update") else 1.0)
            decay = 1 - lr * self.opt["weight-decay"]
            self.w = (
                self.w * decay - step_size * self.m / (np.sqrt(self.v) / math.sqrt(1 - b2**s) + self.opt["eps"])
            ).astype(np.float32)
        self.step = s
        if self.pending is not None:  # a snapshot that copied the state of the step after its own
            self.write(self.pending)
            self.pending = None
        print('{"event":"step","step":%d,"loss":%r,"lr":%r}' % (s, loss, lr), flush=True)
        every = int(self.args.get("--ckpt-every", "0"))
        if every and s % every == 0:
            self.checkpoint()

    def checkpoint(self):
        if "snapshot" in self.active and self.breaks.get("snapshot") == "bytes":
            self.pending = self.step
        else:
            self.write(self.step)

    def write(self, step):
        trailer = Trailer(
            ModelShape(self.V, self.T, self.C, self.L, self.H),
            int(self.args["--batch"]),
            int(self.args["--grad-accum"]),
            self.warmup,
            self.steps,
            self.opt["lr"],
            self.opt["min-lr"],
            self.opt["beta1"],
            self.opt["beta2"],
            self.opt["eps"],
            self.opt["weight-decay"],
            float(self.args["--grad-clip"]),
            int(self.args["--seed"]),
            0,
            '{"engine":"fake","meta":null}',
        )
        path = checkpoint_path(self.args["--ckpt-dir"], step)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_checkpoint(step, self.w, self.m, self.v, trailer))
        self.saved = step

    def sample(self, payload):
        n_prompts, max_new, _top_k, _temperature = SAMPLE_PARAMS.unpack_from(payload, 0)
        at, out = SAMPLE_PARAMS.size, []
        for _ in range(n_prompts):
            _n_tokens, count, seed = SAMPLE_PROMPT.unpack_from(payload, at)
            at += SAMPLE_PROMPT.size
            rng = np.random.default_rng([seed, zlib.crc32(self.w.tobytes())])
            out += [rng.integers(0, self.V, size=max_new).tolist() for _ in range(count)]
        if self.breaks.get("kv") == "tokens" and "kv" in self.active:
            out[0][-1] = (out[0][-1] + 1) % self.V
        print('{"event":"sample","id":1,"step":%d,"tokens":%s}' % (self.step, str(out).replace(" ", "")), flush=True)


def main(argv):
    args = parse(argv)
    attention, fused, graph = (
        args.get("--attention", "naive"),
        args.get("--fused") == "on",
        args.get("--cuda-graph") == "on",
    )
    fused = fused or graph
    available = set(os.environ.get("FAKE_AVAILABLE", "cudnn,flash,fused,graph").split(","))
    breaks = dict(b.split(":") for b in os.environ.get("FAKE_BREAK", "").split(",") if b)
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(
                " ".join(
                    a
                    for a in argv
                    if a.startswith("--")
                    and a[2:] in ("attention", "fused", "cuda-graph", "sample-recompute", "sync-snapshot")
                )
                + f" {attention} fused={fused} graph={graph}\n"
            )
    precision = args.get("--precision", "bf16")
    fp8 = os.environ.get("FAKE_FP8", "gap:0.001")
    if precision == "fp8" and fp8 == "missing":
        print(
            "microgpt: error: --precision fp8 is not built into the CUDA engine (use bf16; the CPU engine runs fp8)",
            file=sys.stderr,
        )
        return 2
    if precision == "fp8" and fp8 == "ignored":
        precision = "bf16"
    if attention != "naive" and attention not in available:
        print(
            f"microgpt: warning: --attention {attention}: not in this build; using the naive attention kernels",
            file=sys.stderr,
        )
        attention = "naive"
    if graph and "graph" not in available:
        graph = False
    if fused and "fused" not in available:
        fused = graph = False
    active = [
        p
        for p, on in (
            ("cudnn", attention == "cudnn"),
            ("flash", attention == "flash"),
            ("fused", fused),
            ("graph", graph),
            ("kv", "--sample-recompute" not in args),
            ("snapshot", "--sync-snapshot" not in args),
        )
        if on
    ]
    if attention != "naive" and fused:
        active.append("together")
    for p in active:
        how = breaks.get(p)
        if how == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif how == "exit":
            print(
                "microgpt: error: CUDA error at microgpt_cuda.cu:1: an illegal memory access was encountered",
                file=sys.stderr,
            )
            return 5
        elif how == "hang":
            time.sleep(3600)
    print(
        '{{"event":"ready","step":0,"device":"Fake GPU (sm_90, 132 SMs, 79.6 GiB), attention {}","precision":"{}",'
        '"paths":{{"attention":"{}","fused":{},"cuda_graph":{}}}}}'.format(
            attention, precision, attention, "true" if fused else "false", "true" if graph else "false"
        ),
        flush=True,
    )
    fake = Fake(args, active, breaks)
    if precision == "fp8" and fp8.startswith("gap:"):
        fake.fp8_gap = float(fp8.split(":")[1])
    stdin = sys.stdin.buffer
    while True:
        header = stdin.read(HEADER.size)
        if len(header) < HEADER.size:
            break
        _magic, kind, _flags, _id, _rows, _row_len, size, _ = HEADER.unpack(header)
        payload = stdin.read(size)
        if kind == TRAIN:
            fake.train(np.frombuffer(payload, dtype=np.uint16))
        elif kind == SAMPLE:
            fake.sample(payload)
        elif kind == CHECKPOINT:
            fake.write(fake.step)
    if fake.saved != fake.step:
        fake.checkpoint()
    if fake.pending is not None:
        fake.write(fake.pending)
    print('{"event":"exit","step":%d,"reason":"eof"}' % fake.step, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
