"""A run directory that stands alone: the data definition frozen in RUN/data/ (docs/FORMATS.md).

After a run, its sources may be replaced or deleted: `sample`, `eval`,
`export` and `verify` print byte-identical output, `fork` copies what they
need, and `proxy run` refuses the changed run with one line unless
`--allow-data-change` (recorded). An experiment whose sources are relative to
its file works from the run directory alone; a launch that failed before its
first step froze nothing binding.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from .conftest import REPO, TINY, Proxy, last_steps, max_logged_step, read_entries, run_args, run_cmd, wait_for

CORPUS = "".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))


def relative_experiment(root: Path, name: str = "REL", **train) -> Path:
    """root/exp/NAME.json reading ../data/corpus.txt and ../data/code/*.py (relative to the experiment file)."""
    exp = json.loads(TINY.read_text())
    exp["name"] = name
    exp["train"].update(
        {"max_steps": 30, "ckpt_every": 10, "eval_every": 10, "sample_every": 10, "keep_last": 0, "threads": 1, **train}
    )
    exp["arms"] = [
        {"name": "corpus", "sources": [{"file": "../data/corpus.txt"}]},
        {"name": "code", "sources": [{"glob": "../data/code/*.py"}]},
    ]
    (root / "exp").mkdir(parents=True, exist_ok=True)
    (root / "data" / "code").mkdir(parents=True, exist_ok=True)
    (root / "data" / "corpus.txt").write_text(CORPUS)
    for p in sorted((REPO / "proxy" / "data").glob("*.py")):
        (root / "data" / "code" / p.name).write_text(p.read_text())
    path = root / "exp" / f"{name}.json"
    path.write_text(json.dumps(exp, indent=1))
    return path


def follow_ups(run: Path, engine, cache: Path, out: Path) -> dict[str, str]:
    """What sample, eval, verify print and export writes, for a run at step 20."""
    result = {}
    for name, args in (
        ("sample", ["sample", "--prompt", "The ", "--max-new", "24", "--seed", "3"]),
        ("eval", ["eval", "--json"]),
        ("verify", ["verify", "--json"]),
    ):
        extra = ["--engine", engine.flag] if name in ("sample", "eval") else []
        step = ["--step", "20"] if name != "verify" else []
        done = run_cmd([*args, "--run-dir", str(run), *step, *extra], cache)
        assert done.returncode == 0, (name, done.stderr)
        assert done.stderr == "", (name, done.stderr)
        result[name] = done.stdout
    shutil.rmtree(out, ignore_errors=True)
    done = run_cmd(["export", "--run-dir", str(run), "--step", "20", "--out", str(out)], cache)
    assert done.returncode == 0, done.stderr
    for p in sorted(out.iterdir()):
        result[f"export/{p.name}"] = hashlib.sha256(p.read_bytes()).hexdigest()
    return result


def train_and_stop(exp, run, step: int, gate, data_cache, tmp_path) -> None:
    """Train `exp` into `run` with the engine held after `step`; once that step is logged and checkpointed,
    `proxy stop`: the run exits 0."""
    gate.hold_after(step)
    proxy = Proxy(run_args(exp, run, engine=gate.engine_flag), data_cache).start()
    ckpt = run / "checkpoints" / f"step_{step:06d}.bin"
    wait_for(lambda: ckpt.exists() and max_logged_step(run) >= step, 240, f"the checkpoint of step {step}", proxy)
    assert run_cmd(["stop", "--run-dir", str(run)], data_cache).returncode == 0
    assert proxy.wait(60) == 0, proxy.output()


def test_follow_ups_need_no_source_and_run_refuses_a_changed_one(engine, gate, data_cache, tmp_path):
    exp = relative_experiment(tmp_path)
    run = tmp_path / "run"
    train_and_stop(exp, run, 20, gate, data_cache, tmp_path)
    before = follow_ups(run, engine, data_cache, tmp_path / "out")
    definition = json.loads((run / "data" / "data.json").read_text())
    corpus = tmp_path / "data" / "corpus.txt"
    assert definition["arms"]["corpus"]["sources"][0]["paths"] == {"file": str(corpus)}  # absolute

    # every source replaced (the tokenizer trained on them would differ), then deleted: the same output
    code = sorted((tmp_path / "data" / "code").glob("*.py"))
    originals = {p: p.read_text() for p in code}
    corpus.write_text(CORPUS[::-1])
    for p in code:
        p.write_text(originals[p][::-1])
    assert follow_ups(run, engine, data_cache, tmp_path / "out") == before
    changed = run_cmd(run_args(exp, run), data_cache)
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    line = changed.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"proxy: {run}: arm 'corpus' source 0 (file {corpus}) changed since the run froze it "
        f"(the same {len(CORPUS.encode()):,} bytes in 1 file(s), other content)"
    ), line
    assert "--allow-data-change" in line
    corpus.unlink()
    shutil.rmtree(tmp_path / "data" / "code")
    assert follow_ups(run, engine, data_cache, tmp_path / "out") == before
    vanished = run_cmd(run_args(exp, run), data_cache)
    assert vanished.returncode == 2
    assert vanished.stderr.strip().splitlines()[-1].startswith("proxy: ")  # refused at loading: the file is gone
    assert "corpus.txt" in vanished.stderr.strip().splitlines()[-1]
    gone = run_cmd(run_args(None, run), data_cache)  # from the run directory alone: the frozen absolute path
    line = gone.stderr.strip().splitlines()[-1]
    assert gone.returncode == 2 and f"arm 'corpus' source 0 (file {corpus}) vanished" in line, gone.stderr

    # restored: the run goes on from the run directory alone (the relative path resolves against nothing there)
    corpus.write_text(CORPUS)
    (tmp_path / "data" / "code").mkdir()
    for p, text in originals.items():
        p.write_text(text)
    done = run_cmd(run_args(None, run), data_cache)
    assert done.returncode == 0, done.stderr
    assert sorted(last_steps(run)) == list(range(1, 31))
    assert json.loads((run / "data" / "data.json").read_text()) == definition  # nothing recorded: nothing changed


def test_allow_data_change_trains_on_and_records_it(engine, gate, data_cache, tmp_path):
    exp = relative_experiment(tmp_path, "CHANGE")
    run = tmp_path / "run"
    train_and_stop(exp, run, 10, gate, data_cache, tmp_path)
    stopped = max_logged_step(run)  # the step the stop checkpointed (the gate holds the engine after 10)
    frozen = {p.name: p.read_bytes() for p in (run / "data").iterdir()}
    (tmp_path / "data" / "corpus.txt").write_text(CORPUS + "\nOne more paragraph at the end.\n")
    done = run_cmd(run_args(exp, run, "--allow-data-change"), data_cache)
    assert done.returncode == 0, done.stderr
    assert "training on changed data (--allow-data-change): arm 'corpus' source 0" in done.stderr
    definition = json.loads((run / "data" / "data.json").read_text())
    (change,) = definition["changes"]
    assert change["step"] == stopped and change["changes"][0].startswith("arm 'corpus' source 0 (file ")
    assert len(list((run / "archive").glob("data_*.json"))) == 1
    # the tokenizer and the validation tokens stay the frozen ones
    for name in ("tokenizer.json", "corpus.val.tok", "code.val.tok"):
        assert (run / "data" / name).read_bytes() == frozen[name]
    assert max(last_steps(run)) == 30
    assert run_cmd(["verify", "--run-dir", str(run)], data_cache).returncode == 0


def test_a_failed_first_launch_freezes_nothing(engine, data_cache, tmp_path):
    """A launch stopped by its data (an arm too small for ctx) is fixed by editing the experiment, and the
    next launch needs no flag: nothing was trained, so nothing was binding."""
    exp = relative_experiment(tmp_path, "FIRST")
    obj = json.loads(exp.read_text())
    (tmp_path / "data" / "corpus.txt").write_text("too short\n" * 20)
    run = tmp_path / "run"
    failed = run_cmd(run_args(exp, run), data_cache)
    assert failed.returncode == 2 and "arm 'corpus' has" in failed.stderr.strip().splitlines()[-1]
    (tmp_path / "data" / "corpus.txt").write_text(CORPUS)
    obj["train"]["lr"] = 0.002
    obj["train"]["max_steps"] = 10
    exp.write_text(json.dumps(obj))
    done = run_cmd(run_args(exp, run), data_cache)
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "experiment.json").read_text())["train"]["lr"] == 0.002
    assert not (run / "archive").exists()  # no replaced experiment recorded: none was binding
    assert "experiment changed" not in done.stderr
    assert sorted(last_steps(run)) == list(range(1, 11))


def test_a_fork_carries_the_data_definition(engine, data_cache, tmp_path):
    exp = relative_experiment(tmp_path, "FORKED", max_steps=20)
    run = tmp_path / "run"
    assert run_cmd(run_args(exp, run), data_cache).returncode == 0
    fork = tmp_path / "fork"
    assert run_cmd(["fork", "--run-dir", str(run), "--at", "20", "--to", str(fork)], data_cache).returncode == 0
    assert {p.name: p.read_bytes() for p in (fork / "data").iterdir()} == {
        p.name: p.read_bytes() for p in (run / "data").iterdir()
    }
    (tmp_path / "data" / "corpus.txt").unlink()
    evals = [
        run_cmd(["eval", "--run-dir", str(r), "--step", "20", "--engine", engine.flag, "--json"], data_cache)
        for r in (run, fork)
    ]
    assert all(e.returncode == 0 for e in evals), [e.stderr for e in evals]
    logged = [e for e in read_entries(run) if e["type"] == "eval" and e["step"] == 20][0]
    assert json.loads(evals[0].stdout)["arms"] == json.loads(evals[1].stdout)["arms"] == logged["arms"]


def test_damaged_frozen_data_is_refused_in_one_line(engine, data_cache, tmp_path):
    exp = relative_experiment(tmp_path, "DAMAGED", max_steps=10)
    run = tmp_path / "run"
    assert run_cmd(run_args(exp, run), data_cache).returncode == 0
    tok = run / "data" / "tokenizer.json"
    tok.write_bytes(tok.read_bytes().replace(b'"<|endoftext|>"', b'"<|endoftexT|>"', 1))
    for args in (
        ["sample", "--prompt", "x", "--engine", engine.flag],
        ["eval", "--engine", engine.flag],
        ["export", "--out", str(tmp_path / "x")],
    ):
        result = run_cmd([*args, "--run-dir", str(run)], data_cache)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "data/tokenizer.json does not match its SHA-256 in data.json" in lines[0]
    report = run_cmd(["verify", "--run-dir", str(run)], data_cache)
    assert report.returncode == 1 and "data: CORRUPT: data/tokenizer.json does not match" in report.stdout


def test_a_run_made_before_frozen_data_uses_the_data_it_was_made_with(engine, data_cache, tmp_path):
    """A run without data/ (trained by the version before): its follow-ups and its next launch take the
    format-1 cache entry its sources name (the only place its tokenizer is), and the launch freezes it;
    with the entry gone, one line."""
    from proxy.config.experiment import load_experiment
    from proxy.data.prepare import prepare_data, v1_key

    exp = relative_experiment(tmp_path, "LEGACY", max_steps=20)
    run = tmp_path / "run"
    assert run_cmd(run_args(exp, run), data_cache).returncode == 0
    logged = [e for e in read_entries(run) if e["type"] == "eval" and e["step"] == 20][0]
    shutil.rmtree(run / "data")
    # the entry format 1 would have left: this run's own data, under the key that version gave them
    experiment = load_experiment(exp)
    cache = tmp_path / "cache"
    data = prepare_data(experiment, exp.parent, tmp_path / "v2", progress=False)
    entry = cache / f"data-{v1_key(experiment, exp.parent)[:24]}"
    entry.mkdir(parents=True)
    (entry / "tokenizer.json").write_bytes(data.tokenizer_json)
    arms = {}
    for arm in experiment.arm_names:
        shutil.copy(data.train[arm][0].path, entry / f"{arm}.train.tok")
        shutil.copy(data.val_shards[arm], entry / f"{arm}.val.tok")
        arms[arm] = {"train": f"{arm}.train.tok", "val": f"{arm}.val.tok", **data.stats[arm]}
    (entry / "manifest.json").write_text(
        json.dumps(
            {
                "format": 1,
                "key": v1_key(experiment, exp.parent),
                "vocab": 512,
                "tokenizer": "tokenizer.json",
                "arms": arms,
            }
        )
    )
    gone = run_cmd(["eval", "--run-dir", str(run), "--step", "20", "--engine", engine.flag], tmp_path / "empty")
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1
    assert (
        "holds no frozen data (made before runs froze them), and the data it was prepared with are not in the "
        "cache" in gone.stderr
    )
    # relative sources resolve against the run directory for a run without data/: give the experiment's place
    frozen = json.loads(exp.read_text().replace("../data/", str(tmp_path / "data") + "/"))
    (run / "experiment.json").write_text(json.dumps(frozen))
    (run / ".experiment.seal.json").unlink()  # resealed from the copy at the next launch
    found = run_cmd(["eval", "--run-dir", str(run), "--step", "20", "--engine", engine.flag, "--json"], cache)
    assert found.returncode == 0, found.stderr
    assert "comes from the prepared-data cache" in found.stderr
    assert json.loads(found.stdout)["arms"] == logged["arms"]
    longer = json.loads(exp.read_text())
    longer["train"]["max_steps"] = 30  # ten more steps
    exp.write_text(json.dumps(longer))
    relaunch = run_cmd(run_args(exp, run, "--allow-experiment-change"), cache)
    assert relaunch.returncode == 0, relaunch.stderr
    assert "trained before runs froze their data; freezing the data it was prepared with" in relaunch.stderr
    assert (run / "data" / "tokenizer.json").read_bytes() == data.tokenizer_json
    assert max(last_steps(run)) == 30 and json.loads((run / "data" / "data.json").read_text())["cache_key"] == v1_key(
        experiment, exp.parent
    )
