"""The prose of docs/RELIABILITY.md that scripts/reliability_report.py does not measure: what each fault
class asserts (WHAT, in the table's order) and how to read the table (NOTES). Kept apart from the report's
code: a new fault scenario adds its class here."""

from __future__ import annotations

from collections import OrderedDict

# What each fault class asserts (the scenarios' contracts, in short). Classes the suite records
# that are not listed here still appear in the table, with the scenario's name.
WHAT = OrderedDict(
    [
        (
            "kill -9 of the engine (standalone, random moments)",
            "SIGKILL at startup, after a step, after a ckpt event, inside writes; every step_*.bin verifies after "
            "every kill, no valid one vanishes, each relaunch resumes from the newest valid one, every replayed step "
            "and every checkpoint of the finished run are bit-identical to an uninterrupted run",
        ),
        (
            "kill -9 of one rank, or of the launcher, of a 2-rank run",
            "proxy run --ranks 2 under the real mpirun: SIGKILL of rank 1, then rank 0, then mpirun, each mid-launch; "
            "every process of the job exits, each relaunch resumes from a valid logged checkpoint no older than the "
            "newest at the kill, and the finished run equals an uninterrupted 1-rank run (steps, evals, samples, "
            "checkpoint bytes)",
        ),
        (
            "a rank that hangs (SIGSTOP) in a 2-rank run",
            "rank 1 stopped mid-launch: rank 0 waits in a collective, the watchdog (--hang-timeout 4) kills the "
            "launcher's group, the proxy SIGKILLs the rest of the launch's session (the stopped rank), resumes and "
            "finishes equal to an uninterrupted 1-rank run",
        ),
        (
            "a rank that dies non-zero (SIGSEGV, SIGABRT) in a 2-rank run",
            "rank 1 gets SIGSEGV, then rank 0 SIGABRT, each mid-launch (signals the engine does not catch: the rank "
            "dies at once, without a checkpoint); mpirun ends the job, every process of it exits, each relaunch "
            "resumes from a valid logged checkpoint no older than the newest at the crash, and the finished run "
            "equals an uninterrupted 1-rank run",
        ),
        (
            "SIGTERM to the launcher (mpirun) of a 2-rank run",
            "mpirun gets SIGTERM twice, each mid-launch: the ranks stop with a checkpoint at their last step before "
            "mpirun ends them, mpirun exits non-zero, the proxy relaunches from the newest valid logged checkpoint "
            "(no older than the newest at the signal), and the finished run equals an uninterrupted 1-rank run",
        ),
        (
            "kill -9 of the engine inside checkpoint writes (22 MB)",
            "SIGKILL at a random offset within the measured write time; the temp file is never taken and is removed "
            "by the next start; final checkpoint bit-identical",
        ),
        (
            "kill -9 of the proxy's process group",
            "the orphaned engine checkpoints on EOF; the relaunched proxy resumes from the newest valid checkpoint "
            "whose steps are all in .loss.json; per-step losses, mixtures, evals, samples, final weights identical",
        ),
        (
            "kill -9 of the engine under the proxy",
            "the proxy restarts the engine from the newest valid checkpoint; the finished run is identical",
        ),
        ("kill -9 of the proxy and the engine together", "as above, both killed at once"),
        (
            "kill -9 of the engine under the proxy (2 ranks)",
            "proxy run --ranks 2, gated in front of mpirun: SIGKILL of mpirun at seeded moments, around checkpoints "
            "too; each relaunch resumes from a valid logged checkpoint no older than the newest at the kill (the "
            "ranks may checkpoint on their way out); the finished run equals an uninterrupted 1-rank run",
        ),
        (
            "kill -9 of the proxy's process group (2 ranks)",
            "as on 1 rank, on 2 ranks under mpirun (MICROGPT_TEST_RANKS=2), compared with a 1-rank run",
        ),
        (
            "kill -9 of the proxy and the engine together (2 ranks)",
            "the proxy and mpirun killed at once, on 2 ranks (MICROGPT_TEST_RANKS=2), compared with a 1-rank run",
        ),
        (
            "checkpoint retention with keep_last 0 (keep all)",
            "docs/EXPERIMENTS.md: keep_last 0 keeps every checkpoint; a deleted one counts as data lost",
        ),
        (
            "full disk during a checkpoint (engine)",
            "tmpfs that holds five checkpoints: the sixth save exits 5 with one line (ENOSPC), earlier checkpoints "
            "intact, no partial file; after moving to a roomy disk the run ends bit-identical",
        ),
        (
            "write error during a checkpoint (engine, EFBIG)",
            "RLIMIT_FSIZE below one checkpoint (seeded limits, 0 included): exit 5, one line, nothing partial, "
            "resume without the limit ends bit-identical",
        ),
        (
            "write error during a checkpoint (proxy run, EFBIG)",
            "the engine's save fails (exit 5); the proxy retries it like any crash and stops as a crash loop "
            "(exit 3) with a last line naming the failed write; nothing changed, no partial file; relaunched "
            "without the limit it finishes identical",
        ),
        (
            "corrupted checkpoint (engine loader)",
            "a bit flipped in step, n_params, weights, m, v, trailer, meta, footer; truncations; wrong n_params; "
            "another model's file; foreign files: exit 3 with one line naming the reason, file untouched, "
            "`--resume latest` falls back to the older one; a bare ANDREA file loads with a warning",
        ),
        (
            "corrupted newest checkpoint (proxy falls back)",
            "bit flip: the proxy skips it saying why; another shape: the engine rejects it and the proxy falls "
            "back; both runs finish identical",
        ),
        (
            "torn or garbage lines in .loss.json",
            "torn last line, garbage lines: skipped, never glued; the log is only appended to; run identical",
        ),
        (
            "missing or corrupt .state.json, .samples.json, phases.json",
            "state and samples rebuilt; phases.json missing: recreated; unreadable: one line, exit 2, "
            "nothing changed, and after restoring it nothing is lost; never a traceback",
        ),
        (
            "hung engine (SIGSTOP)",
            "proxy: --hang-timeout 2 detects the stopped engine, kills its group, restarts, run identical; "
            "engine alone: SIGSTOP/SIGCONT changes nothing",
        ),
        (
            "crash loop (engine dies at every start)",
            "an engine that segfaults / prints junk and exits 1 at every start: the proxy gives up after "
            "--max-failures with exit 3, status crashloop, nothing changed; a working engine then finishes identical",
        ),
        (
            "SIGTERM during a checkpoint write (engine)",
            "the write completes, exit 0 with reason signal, a valid checkpoint of the last step; bit-identical end",
        ),
        (
            "SIGUSR1 storm (engine)",
            "200 signals while training: training goes on, every checkpoint verifies, losses and final weights equal "
            "an unsignalled run's, a run resumed from a SIGUSR1 checkpoint ends bit-identical",
        ),
        ("SIGUSR1 storm (proxy)", "200 signals to the proxy (checkpoint requests) while training: run identical"),
        (
            "fuzzed frames sent to the engine",
            "random headers, payloads, truncations, garbage: exit 0 or 4, one error line, no signal death, no hang, "
            "every checkpoint left announced and valid",
        ),
        (
            "fuzzed experiment files (loader)",
            "load_experiment: an Experiment or one ExperimentError line naming the file",
        ),
        ("fuzzed experiment files (`proxy run BAD.json`)", "exit 2, one stderr line, no traceback, no run directory"),
        ("fuzzed caps files (loader)", "load_caps: full maps with a non-empty capped simplex, or one error line"),
        (
            "fuzzed caps files (`proxy pivot --caps BAD.json`)",
            "on a stopped run: exit 2, one line naming the file, no traceback, not one byte of the run directory "
            "changed",
        ),
        (
            "write error in the proxy's own files (proxy run, EFBIG)",
            "RLIMIT_FSIZE only `.loss.json` reaches: the partial line is cut off, the engine is stopped cleanly (it "
            "checkpoints), `.state.json` says stopped with EFBIG, exit 5 with one last line; every complete line and "
            "checkpoint kept; relaunched without the limit it finishes identical",
        ),
        (
            "full disk while the proxy runs (tmpfs, ENOSPC)",
            "a real tmpfs filled to the last byte while training: whichever write fails first, exit 5 with one last "
            "line naming the file and ENOSPC, no torn line, no temp file, every line and valid checkpoint kept, "
            "`.state.json` stopped with ENOSPC (written over itself); after freeing space the relaunch finishes "
            "identical",
        ),
        (
            "full disk at a run's first launch (tmpfs, ENOSPC)",
            "a new run on a full tmpfs: exit 5, one line, no traceback, no temp file; after freeing space the same "
            "command trains the whole run identical",
        ),
        (
            "read-only run directory at launch (EROFS)",
            "a stopped run through a read-only bind mount: exit 5, one line, nothing changed; through a writable path "
            "the relaunch finishes identical",
        ),
        (
            "I/O error appending to .loss.json (EIO, injected in-process)",
            "EIO after half a line: the half is cut off, one line naming the file and EIO; the next append is whole "
            "(no device here fails on demand, so EIO is injected into the write)",
        ),
        (
            "run-directory files that are devices, FIFOs, huge or symlinks out",
            "`.loss.json`, `.state.json`, phases.json, experiment.json, `.samples.json` as /dev/zero, a FIFO, 8 GiB or "
            "a symlink out of the run, under RLIMIT_AS 8 GiB: exit 2 at once with one line naming the file, not one "
            "byte changed; a checkpoint symlinked to /dev/zero is skipped with one line; restored, the run finishes "
            "identical",
        ),
        (
            "command-line files that are devices or FIFOs",
            "`proxy run /dev/zero|FIFO`, `proxy pivot --caps /dev/zero|FIFO`, `proxy status` over a /dev/zero "
            "`.state.json`: exit 2 at once with one line naming the file, the run unchanged",
        ),
        (
            "phase history lost or rewritten after a pivot",
            "phases.json deleted, restored from before the pivot, or edited (start step, caps, policy) after training "
            "in the new phase: `proxy run`, `pivot`, `fork` refuse with one line naming the contradiction with the "
            "log, the pivot's receipt or a checkpoint; nothing changed, no fork made; restored, the run finishes "
            "identical to the pivoted run trained uninterrupted",
        ),
        (
            "names and strings beyond their bounds",
            "an arm name of 250 characters, 65 arms, long prompts, paths and keys, counts past the engine's: exit 2, "
            "one short line naming the field, no run directory; a caps file with a 100000-character arm: exit 2, one "
            "short line; 64-character names (the bound) train and show on the dashboard",
        ),
        (
            "frozen experiment.json edited by hand",
            "a proxy-side field, an engine flag or a floor edited in RUN/experiment.json: `proxy run --run-dir` "
            "refuses at once with one line naming the field, no engine started; with the edit undone the run finishes "
            "identical",
        ),
        (
            "bogus step_NNNNNN.bin files (status, resume, retention)",
            "a 0-byte file and a directory under checkpoint names: status names the real newest checkpoint, the "
            "relaunch skips each with one line, retention (keep_last 2) neither counts nor deletes them; identical end",
        ),
        (
            "NaN and Infinity in .loss.json (proxy status --json)",
            "`proxy status --json` prints strict JSON (null for them), exit 0, no traceback",
        ),
        (
            "SIGTERM, SIGHUP, SIGINT before training starts",
            "during data preparation: exit 130 with one last line, no traceback, no temp directory left in the cache; "
            "a dead preparation's temp directory is removed at the next start, a live one's kept; the next launch "
            "trains identical",
        ),
        (
            "SIGHUP while training (proxy run)",
            "handled as SIGTERM: the engine checkpoints, exit 0, `.state.json` stopped; the relaunch finishes "
            "identical",
        ),
        (
            "queries while the dashboard indexes a large log",
            "a ~40 MB log with a 64 MB garbage line in its middle, served by a real uvicorn server: while it indexes, "
            "every query answers within three times the mean time of a chunk (+1 s), between chunks, with what is "
            "indexed so far (the old, unfair lock failed this only on a busy machine)",
        ),
        (
            "a 64 MB line without a newline while the dashboard indexes",
            "the index in-process: every poll of the log (each under the index's lock) reads at most one 4 MiB chunk; "
            "all the valid lines around the garbage are indexed (the old skip read the whole line under the lock)",
        ),
        (
            'forged engine records (pid true, 1, -1, "12", a live unrelated pid)',
            "in a pid namespace of their own (tests/faults/sandbox.py) with sentinel processes as the victims: "
            'RUN/.engine.json replaced by `{"pid": true}`, 1, -1, "12", 1.9, bare or inside a valid record, a '
            "record naming a live unrelated process with its real start time (alone, or in pid 1's group), a record "
            "of another run: `proxy run` reports each in one line naming .engine.json, signals nothing (every sentinel "
            "alive and running), exit 0, the run identical",
        ),
        (
            "a copied live run relaunched",
            "`cp -a` of a run while its proxy and engine train, then `proxy run` on the copy: one line saying it is a "
            "copy (a run id of its own), the original's engine never signalled (no restart of it), both runs "
            "identical to the reference",
        ),
        (
            "lock files deleted or forged while the proxy runs",
            "`.lock` and `.pivot.lock` written with a sentinel's pid, then deleted: a second `proxy run` is refused "
            "naming the real proxy (exit 1; the kernel holds the lock on the run directory); `proxy status` shows and "
            "`proxy checkpoint` and `stop` signal the real proxy (the checkpoint frame reaches the engine), never the "
            "sentinel; the run identical",
        ),
        (
            "a live run's engine record copied into another run",
            "in a pid namespace of their own with sentinels: run A trains on the engine itself; runs B get A's "
            "`.engine.json` with B's run id and directory, then with its argv's --ckpt-dir edited to B's checkpoints, "
            "then a record naming A's proxy with its real start time and command line: each `proxy run` of B says one "
            "line naming .engine.json (A's engine writes elsewhere: its --ckpt-dir is not B's checkpoints by device "
            "and inode; the edited argv is not the live command line; the proxy lacks the token), signals nothing, "
            "exit 0, B identical at once; A's proxy and engine never signalled, A stops cleanly with no restart",
        ),
        (
            "a foreign process holding the run directory's lock",
            "`flock -x RUN sleep 300`, a Python script named proxy running `proxy run` of another run, one running "
            "`proxy status` of this run, each holding the run's flock: `proxy checkpoint`, `pivot`, `stop --no-wait`, "
            "`stop` and a second `run` each exit 1 with one line naming the holder's pid as not a proxy of this run, "
            "`status` shows no proxy and one WARNING line (`--json`: proxy_pid null, lock_holder), the holder never "
            "signalled, the run unchanged; released, the run identical",
        ),
        (
            "the proxy SIGSTOPped longer than --hang-timeout",
            "`--hang-timeout 5`: the proxy SIGSTOPped for 15 s while its engine waits, then SIGCONT: no hang "
            "reported, no engine killed, no step replayed, one line saying the proxy did not run; then the engine "
            "SIGSTOPped (a real hang) and the proxy with it for 15 s: the hang is found once, 5 s of the proxy's own "
            "running time after SIGCONT, `using no CPU`, the engine restarted; the run identical, one restart",
        ),
        (
            "run directory moved or replaced under a live proxy",
            "renamed while training, a copy or an empty directory put in its place: the proxy stops (exit 1, one last "
            "line), kills its engine, writes nothing into the impostor; the moved run, relaunched, identical",
        ),
        (
            "checkpoints/ or archive/ a symlink out of the run",
            "checkpoints/ linked to a finished run's (a new run, a stopped run, swapped in while training) and "
            "archive/ linked elsewhere with an experiment change: exit 2 with one line, the other directory "
            "byte-identical (the engine writes into the directory it opened at start); restored, the run identical",
        ),
        (
            "stray checkpoints with huge step numbers",
            "a valid checkpoint copied to step_3000000000.bin and step_2000000000.bin: verify, export, sample, fork "
            "--at 3000000000, an offline pivot and run, each under RLIMIT_AS 8 GiB: no traceback or MemoryError, the "
            "misnamed one passed over with one line, the strays untouched, the run identical",
        ),
        (
            "experiment changes within one second (archive names)",
            "two archives in the same second (the clock held still) make experiment_<s>.json and _2; a receipt is "
            "never written over a name or through a symlink; two relaunches of a finished run with changed experiments "
            "keep both replaced versions, the original byte for byte",
        ),
        (
            "a checkpoint of another experiment among the run's",
            "a same-shape checkpoint written by another experiment copied under the next step's name: `proxy run` "
            "exits 2 with one line naming it, nothing changed; verify says the next launch would stop; moved away, "
            "the run identical",
        ),
        (
            "temp names planted (symlinks, files, directories)",
            "300 symlinks `RUN/.data.tmp-<n>` to a directory outside a new run, the same names as files and "
            "directories with `.data.old-<n>` links, `.<to>.fork-<n>`, `.<out>.export-<n>` and "
            "`archive/.pivot_<s>.tmp-<n>` links, `..state.json.<n>.tmp` and `checkpoints/.step_<s>.bin.tmp` linked to "
            "a file outside (in a pid namespace, so pids 1..300 are every pid there): exit 0, RUN/data, the fork, "
            "the export and the archive real directories, nothing outside changed, verify clean, runs identical",
        ),
        (
            "temp files and directories left by kill -9",
            "a process that made the proxy's temp files and directories (and the older `.NAME.fork-PID`, "
            "`.NAME.export-PID`, `..state.json.PID.tmp` names, one a symlink out) killed with SIGKILL: the next fork, "
            "export and run remove them all (the symlink unlinked, its target untouched), a live process's stay; "
            "the run identical; real `proxy fork`, `export` and `run` SIGKILLed while their temp exists: the same "
            "command again removes it and finishes (the run identical)",
        ),
        (
            "a fork's frozen data (accepted by run, eval, export; refused alike)",
            "a fork at step 24 is evaluated, exported and run to the end identical to the reference; a tokenizer or "
            "a validation shard replaced with data.json's hashes updated (an id >= vocab): fork and eval exit 2 with "
            "one line naming the file, no fork directory or temp left",
        ),
        (
            "JSON nested 4,000 to 200,000 deep in run files",
            "a 200,000-deep line in `.loss.json` and checkpoint metadata nested 4,000 deep (valid CRC): verify, "
            "status, eval, export, sample, fork, an offline pivot exit 0 without a traceback, the line treated as "
            "damaged, the metadata as unreadable; the relaunches finish identical; a deep `.state.json` is rebuilt; "
            "deep phases.json, experiment and caps files: exit 2, one line naming the file, nothing changed",
        ),
        (
            "diverged runs (non-finite or insane loss and state)",
            "the engine refuses to write a non-finite state (exit 6, one line, no file) and to load one (exit 3; "
            "--resume latest falls back); lr 1 (loss past 2 ln(vocab) at step 6): exit 6, one last line naming the "
            "step and the newest sane checkpoint, no engine restart, retention (keep_last 1) keeps that checkpoint, "
            "the relaunch replays bit for bit and stops the same way, verify resumes from it; lr 3.4e38: the engine's "
            "exit 6 stops the run at once; a non-finite newest checkpoint is passed over with one line",
        ),
        (
            "unreadable inputs (eval --data, data sources)",
            "`proxy eval --data` /dev/zero, a FIFO, a 2 GiB file, a directory, /proc/self/mem under RLIMIT_AS 8 GiB, "
            "and sources that refuse reads (EACCES as the files' owner in a user namespace, a directory that cannot be "
            "listed, /proc/self, /proc/self/mem, EISDIR, ENOTDIR): exit 2 with one line, no traceback, the run "
            "unchanged",
        ),
        (
            "frozen validation ids beyond the vocabulary",
            "a frozen <arm>.val.tok holding id 65535 (vocab 300) with its SHA-256 updated in data.json: `run` and "
            "`eval` exit 2 at once with one line naming the file, the id and its position, no engine started, the run "
            "unchanged; with the file restored the relaunch finishes bit-identical",
        ),
        (
            "full disk that only the engine's checkpoints meet (tmpfs at checkpoints/, ENOSPC)",
            "checkpoints/ a filled tmpfs while the run trains: the engine's checkpoint fails (its exit 5) and the "
            "proxy stops at once with exit 5, no restart, one line naming ENOSPC and the checkpoint a relaunch resumes "
            "from, .state.json stopped with ENOSPC, every line and checkpoint kept; after freeing space bit-identical",
        ),
        (
            "a device or FIFO where a checkpoint is named (eval --checkpoint)",
            "`proxy eval --checkpoint` /dev/zero, a FIFO, a directory: exit 2, one line saying what it is (not "
            '"no such checkpoint file"); a missing file: "no such checkpoint file"',
        ),
        (
            "forged steps and clock jumps in .loss.json (proxy status)",
            "five steps whose times jump a year ahead and back, and a forged step 999999999999: `proxy status` shows "
            "the last real step (at most 100%) and one warning naming the forged step; its tokens/s stays that of the "
            "log without the jumps (a jump counts as the step's compute time), never days or unknown",
        ),
        (
            "a huge single-word document (eval --data)",
            "`proxy eval --data` of a 20 MiB file of one word under RLIMIT_AS 3 GiB: encoded in words of at most "
            "4096 characters, its 1.3M rows sent in two EVAL frames (the engine takes 1M a frame): exit 0 within 3 "
            "minutes, every token counted",
        ),
        (
            "hostile table sources (hf_dataset, Parquet)",
            "`proxy run` of an arm whose hf_dataset Arrow file is a symlink to /dev/zero, a FIFO, or truncated: exit 2 "
            'at once, one line naming the arm, the file and what it is (never "missing"); a Parquet text column '
            "stored dictionary-encoded trains (exit 0)",
        ),
        (
            "non-finite weights given to --init-from",
            "`proxy run --init-from` a GPT-2 directory whose model.safetensors holds a NaN, a +inf, a -inf: exit 2 at "
            "once, one line naming the tensor and what it holds, nothing written to checkpoints/; the same directory "
            "with finite weights imports and trains (exit 0)",
        ),
        (
            "dashboard flooded by event-stream clients that never read",
            "1000 raw-socket clients against a real uvicorn server, none reading, while the run grows: at most 32 "
            "streams served, the rest 503; /healthz answers within 2 s throughout; every non-reader's stream dropped "
            "within its write timeout; a reading client served afterwards; RSS within 256 MiB of the baseline while "
            "flooded and within 64 MiB once the clients are gone",
        ),
        (
            "a dashboard reachable from other machines",
            "`proxy run --host 0.0.0.0` warns on stderr (not only in dashboard.log) and `proxy status` repeats it "
            "while the run lives; on 127.0.0.1 neither does",
        ),
        (
            "mixtures within caps and floors (weights and rows, property test)",
            "hypothesis: projections onto random caps and floors (sums on and within tolerance of 1) and the rows of "
            "random batches never pass a cap or a floor: weights exactly, rows by at most the ceiling of cap x rows",
        ),
    ]
)

NOTES = """\
## Reading the table

- **Injected**: faults of that class the suite caused in this run (a kill, a corrupted file, a signal, a
  fuzzed input, ...).
- **Survived**: faults after which every invariant the scenario checks held (see "What is asserted").
- **Steps lost**: training steps that had to be done again because they were newer than the checkpoint
  the run resumed from. This is the documented cost of a crash, not a defect.
- **Data lost**: valid checkpoints that vanished or changed, and `.loss.json` entries, evals, sample
  audits or checkpoints of the finished run that differ from an uninterrupted run. It must be zero.

Seeds: every random choice (which step to kill at, the offset into a write, which bit to flip, the
fuzzed inputs) comes from `FAULT_SEED`, so a run is reproducible by seed; the exact instant a signal
lands still depends on the machine's timing, which is why the counts of kills that landed inside a
write are measured, not chosen.

## Speed-independence

Each scenario says which engine it drives (the CPU one, or `MICROGPT_TEST_ENGINE`), and none races it.
The proxy-level scenarios that act mid-run (the kill storms, the hung engine, the SIGUSR1 storm, the
stopped run the sidecar cases start from) drive the engine through a frame gate
(`tests/harness/gate.py`): a relay on the engine's stdin that passes TRAIN frames up to the step the
scenario aims at (at most 2 past a kill's target) and holds the rest, so a fast engine waits there
instead of finishing the run; a STOP frame and a killed proxy's EOF pass it as they would reach the
engine. The engine-level scenarios wait for the engine's own `step` and `ckpt` events and then sleep a
few milliseconds at most. `MICROGPT_TEST_REACTION_S=S` makes every wait of the harness act S seconds
after its trigger, as if the engine were that much faster than the test; the suites are run that way
to check that they do not depend on the engine's speed.

## Known limits of the checks

- A checkpoint truncated to exactly `8 + 12 n` bytes is, by the format's design, a bare ANDREA file
  and loads (with a warning); the truncation cases skip that one length.
- The footer's 4 reserved bytes (between the CRC and the end magic) are covered neither by the CRC nor
  by a check that they are zero, so a flipped bit there is not detected; they carry no data, and the
  bit-flip cases skip them.
- A standalone engine (`--data FILE`) reads no frames, so the engine-level kill storm cannot be gated:
  it runs 1200 steps for its 40 kills, and counts every kill (the test asserts all 40 landed).
- The tmpfs and read-only cases need root (`mount -t tmpfs`, `mount --bind`); where they cannot mount,
  they are skipped and the RLIMIT_FSIZE cases (which need no privilege) still cover failed writes.
- EIO cannot be caused on demand by any device here; it is injected into the log's `write(2)` in-process.
- The forged-record, copied-run and lock scenarios need a pid namespace (`unshare --pid --mount-proc`:
  root, or unprivileged user namespaces); where none can be made they are skipped, never run in the
  test's own namespace, since a proxy that acted on `{"pid": 1}` would signal every process it can reach.
- A record forged to name a process built to pass every check (its command line, its process group and
  the launching proxy's secret token copied into its environment) is out of reach of any check a file
  allows; the checks stop records that are stale, copied or wrong, not a user set on killing his own
  processes, who needs no record for that.
"""
