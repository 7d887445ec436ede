"""A pid namespace for the scenarios that hand the proxy forged process records.

Those scenarios feed the proxy `{"pid": 1}`, `{"pid": -1}`, a live process
that is not the engine, a copied live run. The code under test must refuse to
signal any of them; if it were wrong, `kill(-1, SIGKILL)` would reach every
process the user owns, here root: every process on the machine. So these
scenarios never run in the test's own pid namespace. `run_scenario` starts
them under `unshare --pid --fork --mount-proc`: the scenario is pid 1 of a
fresh namespace, every process it starts (sentinels, proxies, engines) is in
it, and a signal sent from inside reaches nothing outside. The scenario
refuses to start anywhere else (`require_namespace`).

Inside, `Sentinels` are the victims to watch: one process in a session of its
own (the "live unrelated pid"), one in pid 1's own process group (what
`killpg(1, ...)` or `kill(-1, ...)` reaches). A scenario checks they are alive
and never stopped after every fault.

The scenario's Outcome comes back as the last line of its stdout (JSON).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import psutil

from .scenarios import FaultCheckFailed

REPO = Path(__file__).resolve().parents[2]
UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
RESULT_MARK = "sandbox-outcome: "


def unavailable() -> str | None:
    """Why no pid namespace can be made here (None: one can)."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    try:
        out = subprocess.run(
            [*UNSHARE, "--", sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare failed: {exc}"
    if out.returncode != 0 or out.stdout.strip() != "1":
        return f"unshare --pid --mount-proc is not permitted here ({out.stderr.strip()[:200] or out.returncode})"
    return None


def run_scenario(function: str, timeout: float, **kwargs) -> dict:
    """`tests.faults.<module>.<name>(**kwargs)` as pid 1 of a new pid namespace; its Outcome as a dict."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    argv = [*UNSHARE, "--", sys.executable, "-m", "faults.sandbox", function, json.dumps(kwargs, default=str)]
    try:
        out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        raise AssertionError(f"{function} did not finish within {timeout:.0f}s in its sandbox: {tail!r}") from None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    raise AssertionError(
        f"{function} left no outcome (exit {out.returncode}):\n{out.stderr[-3000:]}\n{out.stdout[-2000:]}"
    )


def require_namespace() -> None:
    """Refuse to go on outside a fresh pid namespace (where this process is pid 1)."""
    if os.getpid() != 1:
        raise SystemExit(
            "tests/faults/sandbox.py: a scenario that forges process records runs only as pid 1 of "
            "its own pid namespace (run_scenario); refusing"
        )


class Sentinels:
    """Victims to watch: `alone` leads a session of its own (an unrelated live process), `grouped` shares
    pid 1's process group. Both only sleep; any signal that ends or stops them shows."""

    CODE = "import time\nwhile True: time.sleep(3600)"

    def __init__(self):
        require_namespace()
        self.alone = subprocess.Popen([sys.executable, "-c", self.CODE], start_new_session=True)
        self.grouped = subprocess.Popen([sys.executable, "-c", self.CODE])
        self.procs = {"unrelated": self.alone, "pid 1's group": self.grouped}

    def create_time(self, which: str = "unrelated") -> float:
        return psutil.Process(self.procs[which].pid).create_time()

    def damaged(self) -> list[str]:
        """The sentinels a signal reached: ended or stopped."""
        out = []
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                out.append(f"the {name} sentinel (pid {proc.pid}) was killed ({proc.returncode})")
                continue
            try:
                if psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED:
                    out.append(f"the {name} sentinel (pid {proc.pid}) was stopped")
            except psutil.Error:
                out.append(f"the {name} sentinel (pid {proc.pid}) is gone")
        return out

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _main(argv: list[str]) -> int:
    require_namespace()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    module_name, _, name = argv[0].rpartition(".")
    module = importlib.import_module(f"faults.{module_name}")
    try:
        outcome = getattr(module, name)(**json.loads(argv[1]))
    except FaultCheckFailed as failed:  # the test outside fails on the outcome's failure
        outcome = failed.outcome
    data = outcome.to_dict()
    keep = {f.name for f in fields(outcome) if not f.name.startswith("_")}
    print(RESULT_MARK + json.dumps({k: v for k, v in data.items() if k in keep}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
