"""Feeding an engine launch its frames: TRAIN for every step whose mixture is known, EVAL and SAMPLE when due.

A FrameFeeder holds what the frames are made of, fixed for the whole run (the
batch sampler, the training and sample settings, the prompts); the launch and
its mixture schedule are passed per call, so each signature says what it reads.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..config.experiment import SampleConfig, TrainConfig
from ..data.batches import BatchSampler
from ..formats import frames
from ..rundir.phases import Phase
from .launch import EngineLaunch, Request


def sample_seed(seed: int, step: int, index: int) -> int:
    """The SAMPLE seed for prompt `index` at `step`: a pure function of (seed, step, index)."""
    digest = hashlib.sha256(f"microgpt-sample:{seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def due(every: int, step: int, max_steps: int) -> bool:
    """An eval or a sample audit every `every` steps (0: never) and at the last step."""
    return bool(every) and (step == max_steps or step % every == 0)


@dataclass(frozen=True)
class FrameFeeder:
    sampler: BatchSampler
    train: TrainConfig
    samples: SampleConfig
    prompts: list[tuple[str, list[int]]]  # (text, token ids) of each sample prompt

    @property
    def max_steps(self) -> int:
        return int(self.train.max_steps)

    def feed(self, launch: EngineLaunch) -> None:
        """Send every TRAIN frame whose mixture is known (at most `lag` ahead), with the evals and samples due."""
        while not launch.stop_sent and launch.next_step <= self.max_steps:
            s = launch.next_step
            mixture = launch.schedule.mixture_for(s)
            if mixture is None:
                return
            tokens, groups = self.sampler.train_batch(s, mixture, self.train.rows)
            launch.engine.send(frames.train_frame(s, tokens, groups))
            launch.sent_step(s)
            if due(int(self.train.eval_every), s, self.max_steps):
                self.send_evals(launch, s)
            if self.prompts and due(int(self.train.sample_every), s, self.max_steps):
                self.send_samples(launch, s)
            if s == self.max_steps:
                launch.send_stop()

    def catch_up(self, launch: EngineLaunch, phase: Phase, audited: set[int]) -> None:
        """An eval or a sample audit due at the resume step that a crash lost: do it now (the engine holds
        exactly that step's weights, so the result is the one the crash lost). `audited`: the steps whose
        sample audits `.samples.json` holds."""
        c = launch.resume.step
        if c <= 0 or c > self.max_steps:
            return
        if due(int(self.train.eval_every), c, self.max_steps) and launch.replay_index.eval(c) is None:
            self.send_evals(launch, c)
        pivot_point = phase.phase > 0 and c == phase.start_step  # audits there were archived
        if (
            self.prompts
            and due(int(self.train.sample_every), c, self.max_steps)
            and not pivot_point
            and c not in audited
        ):
            self.send_samples(launch, c)

    def send_evals(self, launch: EngineLaunch, step: int) -> None:
        """One EVAL frame holding every arm's fixed validation rows (group id = arm), so the engine runs them
        in the fewest forward passes; its event carries each arm's mean loss."""
        rows = self.train.eval_row_count(self.sampler.row_len - 1, max(v.size for v in self.sampler.val))
        if rows <= 0:
            return
        tokens, groups = self.sampler.eval_batch_all(rows)
        rid = launch.add_request(Request("eval", step), max(1.0, len(groups) / self.train.rows))
        launch.engine.send(frames.eval_frame(rid, tokens, groups))

    def send_samples(self, launch: EngineLaunch, step: int) -> None:
        """The audit: every prompt in one SAMPLE frame, each with its own seed (one batch in the engine)."""
        cfg = self.samples
        prompts = [
            frames.SamplePrompt(ids, int(cfg.count), sample_seed(int(self.train.seed), step, i))
            for i, (_prompt, ids) in enumerate(self.prompts)
        ]
        work = max(1.0, len(prompts) * int(cfg.count) * int(cfg.max_new) / self.train.rows)
        rid = launch.add_request(Request("sample", step), work)
        launch.engine.send(
            frames.sample_batch_frame(rid, prompts, int(cfg.max_new), float(cfg.temperature), int(cfg.top_k or 0))
        )
