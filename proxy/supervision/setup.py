"""`proxy run`: everything from the experiment file to the exit code (docs/CLI.md, "proxy run").

Load the experiment, choose the engine, create and lock the run directory,
check the phase history against the run's records (rundir/history.py),
freeze the experiment (or check the frozen one), write phase 0, make step 0
from pretrained weights (`--init-from`), reap an engine a killed proxy left
behind, stop at once if the run already finished, prepare the data and hold
them to the run's frozen definition (run_data.py), build the run's context
and hand it to the supervisor's loop. What a launch freezes stays
provisional until the first trained step (rundir/frozen.py). A file of the
run that is not a regular file within its size cap (safe_fs.py) ends the
command with one line and exit 2; a stop signal before training starts,
with one line and exit 130.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from ..config.experiment import Experiment
from ..config.overrides import load_effective
from ..data.batches import BatchSampler, segment_arrays
from ..data.prepare import default_cache_dir
from ..data.row_spread import row_spread, unigram_gap
from ..data.tokenizer import prompt_ids
from ..errors import EXIT_OK
from ..formats.loss_log import LossLogIndex, LossLogWriter
from ..formats.samples import SamplesFile
from ..formats.state import EngineStatus, load_state, read_state, write_state
from ..qualification import VERIFIED_FLAGS, run_engine_paths
from ..qualification_fp8 import precision_flags
from ..rundir.foreign import foreign_checkpoints
from ..rundir.frozen import freeze_experiment, started_training
from ..rundir.history import check_history
from ..rundir.identity import RunIdentity, load_identity, save_identity
from ..rundir.layout import RunDir, RunDirError, default_run_dir
from ..rundir.lock import RunLock
from ..rundir.overrides_record import OverridesRecord, write_overrides
from ..rundir.phases import ensure_phases, first_phase, read_phases
from ..rundir.resume import choose_resume
from ..rundir.retention import RetentionPolicy
from .checkpoints import load_best
from .context import Console, RunContext, SupervisorOptions
from .engine_process import EngineChoice, choose_engine
from .engine_record import reap_orphan
from .init_from import import_model, model_block
from .loop import Supervisor
from .ranks import data_parallel, say_rank_change, say_unused_gpus
from .report import RunReport
from .run_data import RunData, open_run_data
from .signals import EARLY, SignalCounts, check_interrupted, install_interrupt

# Called once the run directory is locked and its data ready (`proxy run` starts its dashboard there): what
# it returns is the dashboard's {"url", "host"} for .state.json, or None.
OnStarted = Callable[[RunDir], dict | None]


@dataclass
class RunRequest:
    experiment_path: Path
    run_dir: Path | None = None
    engine: str | None = None
    allow_experiment_change: bool = False
    allow_data_change: bool = False
    from_frozen: bool = False  # `proxy run --run-dir DIR` alone: the experiment is DIR's frozen copy
    init_from: Path | None = None  # a Hugging Face GPT-2 directory: step 0 of a new run (init_from.py)
    cache_dir: Path | None = None
    options: SupervisorOptions = field(default_factory=SupervisorOptions)
    engine_paths: str = "qualified"  # the CUDA engine's fast paths: "qualified" (checked on this GPU) or "verified"
    overrides: list[str] = field(default_factory=list)  # `--set KEY=VALUE` (config/overrides.py)
    ranks: int | None = None  # data-parallel ranks (ranks.py); None: --ranks not given (the engine alone)
    launcher: str | None = None  # `--launcher CMD`: what starts the ranks instead of mpirun -np N


def start_run(
    request: RunRequest, on_started: OnStarted | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """`proxy run`. SIGUSR1 and SIGUSR2 (`proxy checkpoint`, `proxy pivot`) may come as soon as the lock
    names this process: until the supervisor acts on them they are counted, never fatal (their default
    action would end the process). A pivot request left unclaimed is withdrawn by `proxy pivot` when it
    sees the lock go."""
    signals = SignalCounts()
    old = signals.install(EARLY)
    old.update(install_interrupt())
    try:
        return _start_run(request, signals, on_started, Console(out, err))
    finally:
        SignalCounts.restore(old)


def _start_run(request: RunRequest, signals: SignalCounts, on_started: OnStarted | None, console: Console) -> int:
    """`on_started(run_dir)` is called once the run directory is locked and the data are ready (the CLI
    starts the dashboard there; it returns the dashboard's {"url", "host"} for `.state.json`, or None). Raises
    ProxyError for anything the user must fix; returns the exit code otherwise."""
    # a run's frozen experiment: its sources are where the run's data definition says (run_data.py)
    experiment, effective = load_effective(
        request.experiment_path,
        request.overrides,
        check_sources=not request.from_frozen,
        model_defaults=model_block(request.init_from) if request.init_from is not None else None,
    )
    chosen = choose_engine(request.engine)
    grad_accum = experiment.train.grad_accum
    ranks = request.ranks
    if ranks is None:  # the engine alone; several GPUs unused are said (ranks.py)
        ranks = 1
        if request.launcher is None:
            say_unused_gpus(chosen, grad_accum, console.say)
    engine = data_parallel(chosen, ranks, request.launcher, grad_accum)
    run = RunDir(Path(request.run_dir) if request.run_dir else default_run_dir(experiment.name))
    run.create()
    lock = RunLock(run).acquire()  # RunInUse: exit 1
    try:
        run.remove_leftovers()  # temp files of a proxy killed here before
        index = LossLogIndex.load(run.loss_log)
        recorded = read_phases(run)
        binding = started_training(run, index, recorded)
        check_history(run, recorded or [first_phase(experiment)], index)
        foreign = foreign_checkpoints(run, experiment)
        if foreign is not None:
            raise RunDirError(foreign)
        frozen = freeze_experiment(
            run,
            Path(request.experiment_path),
            experiment,
            request.allow_experiment_change,
            provisional=not binding,
            effective=effective,
            next_step=max(index.steps, default=0) + 1,
        )
        write_overrides(run, OverridesRecord.of(request.overrides))
        phases = ensure_phases(run, experiment, provisional=not binding)
        if frozen.changed:
            console.warn(
                f"experiment changed ({', '.join(frozen.changed)}); continuing with the new one "
                "(--allow-experiment-change)" + (f"; {frozen.lr_note}" if frozen.lr_note else "")
            )
        say_rank_change(read_state(run.state), engine.ranks, index.max_step(), console.say)
        identity, unsaved = load_identity(run, console.warn)
        reaped = reap_orphan(run, identity, lock, request.options.orphan_grace_s, console.warn)
        if reaped:
            console.warn(reaped)

        resume = choose_resume(run.checkpoints, index, phases, set(), vocab=int(experiment.model.vocab))
        if resume.step >= experiment.train.max_steps:
            console.say(
                f"run {run.root} already finished at step {resume.step} (max_steps "
                f"{experiment.train.max_steps}); nothing to do"
            )
            _mark_finished(run)
            return EXIT_OK
        data = open_run_data(
            run,
            experiment,
            Path(request.experiment_path).parent,
            request.cache_dir or default_cache_dir(),
            binding=binding,
            allow_change=request.allow_data_change,
            from_frozen=request.from_frozen,
            resume_step=resume.step,
            warn=console.warn,
        )
        if request.init_from is not None:
            import_model(run, experiment, data, request.init_from, binding, console)
        ctx = build_context(experiment, run, data, engine, request.options, console, signals, lock, identity)
        if unsaved:  # nothing refuses the launch any more: the run's identity is written before any engine
            save_identity(run, identity)
        paths = choose_engine_paths(experiment, run, engine, request, console)
        ctx.use_engine_paths(paths + choose_precision(experiment, engine, console))
        check_interrupted()  # a stop signal a library swallowed during the setup still ends it here
        if on_started is not None:
            ctx.report.dashboard_started(on_started(run))
        return Supervisor(ctx).run_forever()
    finally:
        lock.release()


def choose_engine_paths(
    experiment: Experiment, run: RunDir, engine: EngineChoice, request: RunRequest, console: Console
) -> list[str]:
    """The CUDA engine's path flags for this run (qualification.py): the verified paths, or those that
    passed their check on this GPU, as recorded in the run directory. Other engines take none."""
    if engine.kind != "cuda":
        return []
    if request.engine_paths == "verified":
        return list(VERIFIED_FLAGS)
    return run_engine_paths(
        run,
        engine.path,
        experiment.engine_flags(),
        check_shape(experiment),
        request.cache_dir or default_cache_dir(),
        console.say,
        console.warn,
    )


def check_shape(experiment: Experiment) -> dict:
    """The run's shape as the qualification's checks take it."""
    m, t = experiment.model, experiment.train
    return {
        "vocab": m.vocab,
        "ctx": m.ctx,
        "dim": m.dim,
        "layers": m.layers,
        "heads": m.heads,
        "batch": t.batch,
        "grad_accum": t.grad_accum,
    }


def choose_precision(experiment: Experiment, engine: EngineChoice, console: Console) -> list[str]:
    """The engine's precision flags for `train.precision` (qualification_fp8.py): FP8 on the CUDA engine
    only after its check on this GPU."""
    return precision_flags(
        experiment.train.precision,
        engine.kind,
        engine.path,
        experiment.engine_flags(),
        check_shape(experiment),
        console.say,
        console.warn,
    )


def _encode_prompts(experiment: Experiment, data: RunData, console: Console) -> list[tuple[str, list[int]]]:
    """The sample prompts as token ids (the last ctx of them); a prompt that encodes to nothing is skipped."""
    out = []
    ctx = int(experiment.model.ctx)
    for prompt in experiment.samples.prompts:
        try:
            ids = prompt_ids(data.tokenizer, prompt, ctx)
        except ValueError as exc:
            console.warn(f"sample prompt {prompt!r} {exc}; skipped")
            continue
        if not ids:
            console.warn(f"sample prompt {prompt!r} encodes to no tokens; skipped")
            continue
        out.append((prompt, ids))
    return out


def build_context(
    experiment: Experiment,
    run: RunDir,
    data: RunData,
    engine: EngineChoice,
    options: SupervisorOptions,
    console: Console,
    signals: SignalCounts,
    lock: RunLock,
    identity: RunIdentity,
) -> RunContext:
    """The run's context: batches, prompts, phases, the open log, the sample audits, the carried-over report."""
    train = experiment.train
    sampler = BatchSampler(
        {arm: segment_arrays(data.train[arm]) for arm in experiment.arm_names},
        data.val,
        experiment.arm_names,
        int(train.seed),
        int(experiment.model.ctx) + 1,
    )
    prompts = _encode_prompts(experiment, data, console)
    phases = read_phases(run)
    writer = LossLogWriter(run.loss_log, options.fsync_every_s)
    samples = SamplesFile(run.samples, options.samples_kept)
    report = RunReport(engine=EngineStatus(kind=engine.kind, path=str(engine.path), ranks=engine.ranks))
    report.carry_forward(read_state(run.state) or {}, experiment.arm_names, phases[-1], console.warn)
    load_best(report, run.best, run.loss_log)
    spread = row_spread(sampler, experiment.target_arms, int(experiment.model.vocab))
    if len(spread) > 1:
        console.say(
            "row spread of the target arms (the target policy's prior): "
            + ", ".join(f"{arm} {value:.3f}" for arm, value in spread.items())
        )
    gap = unigram_gap(sampler, experiment.target_arms, int(experiment.model.vocab))
    if gap:
        console.say(
            "unigram gap of the other arms to the targets (the target policy's opening): "
            + ", ".join(f"{arm} {value:+.2f}" for arm, value in gap.items())
        )
    return RunContext(
        experiment=experiment,
        run=run,
        data=data,
        engine_choice=engine,
        opts=options,
        console=console,
        signals=signals,
        sampler=sampler,
        prompts=prompts,
        phases=phases,
        writer=writer,
        samples=samples,
        report=report,
        retention=RetentionPolicy(int(train.keep_last), int(train.milestone_every)),
        lock=lock,
        identity=identity,
        row_spread=spread,
        unigram_gap=gap,
    )


def _mark_finished(run: RunDir) -> None:
    """A relaunch of a finished run: its `.state.json` says finished (and no engine alive)."""
    state = load_state(run.state)
    if state is not None and state.status != "finished":
        write_state(run.state, replace(state, status="finished", engine=replace(state.engine, alive=False)))
