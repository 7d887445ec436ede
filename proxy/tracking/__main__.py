"""`python -m proxy.tracking --run-dir RUN`: the tracker, as `proxy run` starts it (launch.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import one_line
from ..rundir.frozen import load_frozen_experiment
from ..rundir.layout import RunDir
from .follow import follow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxy.tracking")
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)
    run = RunDir(Path(args.run_dir))
    try:
        experiment = load_frozen_experiment(run)
    except Exception as exc:
        print(f"tracker: {one_line(exc)}; not tracking", file=sys.stderr, flush=True)
        return 1
    return follow(run, experiment)


if __name__ == "__main__":
    sys.exit(main())
