"""Every file name of a run directory, and the caps on what a reader takes from one, written once.

The leaf both formats/ (each file's format) and rundir/ (the directory as a whole) name files through:
it imports nothing of the proxy, so neither package has to import the other for a name. rundir/layout.py
describes the directory; docs/FORMATS.md each file.
"""

from __future__ import annotations

from pathlib import Path

RUNS_ROOT = Path("runs")

EXPERIMENT = "experiment.json"
EXPERIMENT_SEAL = ".experiment.seal.json"
CHECKPOINTS = "checkpoints"
BEST = "best.bin"
LOSS_LOG = ".loss.json"
SAMPLES = ".samples.json"
STATE = ".state.json"
PHASES = "phases.json"
DATA = "data"  # the frozen data definition (rundir/data.py): these three names, inside it
DATA_DEFINITION = "data.json"
TOKENIZER = "tokenizer.json"
VAL_SHARD_SUFFIX = ".val.tok"  # <arm>.val.tok
ARCHIVE = "archive"
ENGINE_LOG = "engine.log"
DASHBOARD_LOG = "dashboard.log"
IDENTITY = ".run.json"
ENGINE_RECORD = ".engine.json"
QUALIFICATION = ".qualification.json"
OVERRIDES = ".overrides.json"
TENSORBOARD = "tensorboard"
WANDB = "wandb"
TRACKER_LOG = "tracker.log"
TRACKER_MARKS = ".marks.json"  # in tensorboard/ and in wandb/: the last step each sink wrote (tracking/marks.py)
WANDB_RUN_ID = ".run_id.json"  # in wandb/: the W&B run id a resumed run appends to
PIVOT_LOCK = ".pivot.lock"
PIVOT_REQUEST = ".pivot_request.json"
PIVOT_CLAIMED = ".pivot_claimed.json"
PIVOT_RESPONSE = ".pivot_response.json"
PIVOT_RECEIPT = "phase.json"  # in a pivot's archive directory: the phase it committed (rundir/history.py)

# The directories inside a run that the proxy and the engine write and delete in: each must be a real
# directory of the run, never a symlink (a `checkpoints` linked to another run would have this run's
# retention delete that run's checkpoints; a `data` linked elsewhere, the data freeze replace what is there).
OWN_DIRS = (CHECKPOINTS, ARCHIVE, DATA)

# Files whose modification time says when a run was last active.
ACTIVITY_FILES = (LOSS_LOG, STATE, EXPERIMENT)

# The most bytes a reader takes from each small file of a run directory (proxy/safe_fs.py refuses a
# larger one, with one line). The writers stay far below: samples.py trims `.samples.json` to its cap.
READ_LIMITS = {
    EXPERIMENT: 1 << 20,
    EXPERIMENT_SEAL: 4 << 20,
    PHASES: 4 << 20,
    STATE: 4 << 20,
    SAMPLES: 32 << 20,
    ENGINE_RECORD: 64 << 10,
    OVERRIDES: 64 << 10,
    TRACKER_MARKS: 64 << 10,
    WANDB_RUN_ID: 4 << 10,
    IDENTITY: 4 << 10,
    QUALIFICATION: 64 << 10,
    PIVOT_REQUEST: 1 << 20,
    PIVOT_CLAIMED: 1 << 20,
    PIVOT_RESPONSE: 1 << 20,
    PIVOT_RECEIPT: 1 << 20,
    DATA_DEFINITION: 4 << 20,
    TOKENIZER: 64 << 20,
}
# A validation shard in data/ may be as large as data.json says (its size and SHA-256 are checked there).
LOSS_LINE_LIMIT = 1 << 20  # the longest `.loss.json` line read; a longer one is skipped like a torn one
ENGINE_LOG_TAIL = 4096  # bytes of engine.log read back for a crash's reason


def checkpoint_name(step: int) -> str:
    """`step_NNNNNN.bin`: the step zero-padded to six digits (more past 999,999)."""
    return f"step_{step:06d}.bin"


# Bounds on the names an experiment gives and a `.loss.json` entry carries (config/strict.py checks them
# in the experiment; formats/loss_log.py's readers keep no more).
MAX_NAME = 64  # characters of an arm or experiment name (ASCII, by experiment.py's ARM_NAME)
MAX_ARMS = 64  # arms of an experiment: the most a `.loss.json` entry names (its readers keep no more)
