"""Which command lines are a proxy's (rundir/lock_holder.py), without an engine."""

from __future__ import annotations

from proxy.rundir.lock_holder import proxy_arguments

PY = "/usr/bin/python3.11"


def test_proxy_arguments_only_for_the_proxy():
    assert proxy_arguments([PY, "-m", "proxy", "run", "--run-dir", "R"]) == ["run", "--run-dir", "R"]
    assert proxy_arguments([PY, "-u", "-X", "dev", "-mproxy", "stop"]) == ["stop"]
    assert proxy_arguments([PY, "/venv/bin/proxy", "run", "E.json"]) == ["run", "E.json"]  # the console script
    assert proxy_arguments([PY, "-m", "proxyx", "run"]) is None
    assert proxy_arguments([PY, "-c", "import proxy", "-m", "proxy", "run"]) is None
    assert proxy_arguments([PY, "/tmp/other.py", "-m", "proxy", "run"]) is None
    assert proxy_arguments(["flock", "-x", "R", "python3", "-m", "proxy", "run"]) is None
    assert proxy_arguments(["/bin/sh", "-c", "python3 -m proxy run"]) is None
    assert proxy_arguments([]) is None
