"""Run a campaign: print the plan, resume from the journal, run every step, analyse, report.

Each prepare, quantize, data, accuracy and run step runs as its own process
(host.campaign.step) in its own session; the analysis and the report are library calls
(host.analysis.output.analyze_to, host.report.build.write_report) in the campaign's process.
The journal records `started` (with the process group) before and `done` (with the step's
result) after. A resumed campaign:

* trusts a `done` line only when the step's output is on disk (host.campaign.verify): a step
  whose output is missing runs again, and so do the analysis and report after it;
* skips every other step with a `done` line (it never repeats a finished step);
* stops whatever an interrupted step left running, and renames an interrupted run's
  directory to `*.interrupted`, so the analysis never sees half a run (only the run
  directories named in `done` lines are analysed);
* touches nothing outside its own directory: the journal's paths are relative to it, and a
  process group is stopped only when its marker names this directory;
* says what it resumed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from epi.core.errors import UserError
from host.campaign import accuracy_projection, procs, sizing
from host.campaign.adaptive_loop import run_adaptive_rounds, settle_command
from host.campaign.adaptive_round import finished as adaptive_finished
from host.campaign.budget import with_extensions
from host.campaign.journal import (
    Done,
    Failed,
    Journal,
    JournalState,
    Session,
    Settle,
    Started,
    StepResult,
    marker_root,
)
from host.campaign.layout import Layout
from host.campaign.meter import ACTIVITY_TEXT, emulated_daemon, stop_stale_daemon, trace_nodes
from host.campaign.plan import (
    CLOSING_STEPS,
    Plan,
    Step,
    StepKind,
    base_path,
    build_plan,
    format_duration,
    meter_rate_hz,
    plan_text,
    rounds_text,
    run_shape,
    sizing_lines,
    spread_and_basis,
    trace_dirs,
)
from host.campaign.preflight import lines as preflight_lines
from host.campaign.preflight import preflight, require
from host.campaign.progress import Progress
from host.campaign.remeasure import Remeasurer, add_recorded_takes, check_run
from host.campaign.sizing import RunSizing, read_sizing
from host.campaign.specs import (
    AccuracyArgs,
    DataArgs,
    PrepareArgs,
    QuantizeArgs,
    RunArgs,
    StepArgs,
)
from host.campaign.study import Study
from host.campaign.thermal import settle
from host.campaign.verify import verify_done
from host.errors import StepFailed

LOCK = ".campaign.lock"
IN_PROCESS = CLOSING_STEPS  # library calls, not step processes


@contextmanager
def campaign_lock(root: Path) -> Iterator[None]:
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"{root / LOCK}: cannot open the campaign lock ({exc.strerror})"
                        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{root}: another campaign is running in this directory") from None
        yield
    finally:
        os.close(fd)


def study_sha256(study: Study) -> str:
    return hashlib.sha256(study.path.read_bytes()).hexdigest()


def resume_lines(plan: Plan, state: JournalState, layout: Layout) -> list[str]:
    """What the journal says was done before, and what was interrupted."""
    if not state.sessions:
        return []
    ids = {s.step_id for s in plan.steps}
    done = [s for s in state.done if s in ids]
    lines = [f"resuming the campaign in {layout.root}: {len(done)} of {len(plan.steps)} "
             f"steps finished in {state.sessions} earlier session(s); they are not repeated"]
    for step_id, ev in state.interrupted.items():
        extra = ""
        if ev.run_dir and (layout.root / ev.run_dir).exists():
            extra = f"; its partial run {ev.run_dir} is not counted"
        lines.append(f"  {step_id} was interrupted (attempt {state.attempts.get(step_id, 1)})"
                     f"{extra}: it runs again")
    if state.torn_line:
        lines.append("  the journal's last line was cut short (power cut?): ignored")
    if state.study_sha256 and state.study_sha256 != study_sha256(plan.study):
        lines.append(f"  note: {plan.study.path} changed since the last session; finished "
                     "steps stay finished (for a fresh start, give a new --out)")
    return lines


def _clean_interrupted(state: JournalState, layout: Layout) -> None:
    """Stop what interrupted steps left running and set their partial runs aside; only this
    campaign's own processes (marker names this directory) and directories."""
    mine = {os.path.abspath(layout.root), str(layout.root.resolve())}
    for step_id, ev in state.interrupted.items():
        if ev.pgid and ev.marker and marker_root(ev.marker, step_id, ev.attempt) in mine:
            procs.stop_stale_group(ev.pgid, ev.marker)
        if not ev.run_dir:
            continue
        rd = layout.root / ev.run_dir  # relative: inside this campaign by construction
        if rd.is_dir() and not rd.is_symlink():
            target = rd.with_name(rd.name + ".interrupted")
            n = 1
            while target.exists():
                n += 1
                target = rd.with_name(f"{rd.name}.interrupted{n}")
            os.replace(rd, target)


class Campaign:
    """One session of a campaign (a fresh start or a resume)."""

    def __init__(self, study: Study, *, stream: TextIO | None = None,
                 python: str = sys.executable) -> None:
        study = with_extensions(study)  # a recorded --extend-budget raises the time budget
        self.study = study
        self.layout = Layout(study.out)
        self.sizing: RunSizing | None = read_sizing(study.out, study.run.tokens)
        self.journal = Journal(study.out)
        self.stream = stream or sys.stderr
        self.python = python
        # a projection measured by an earlier session (same accuracy settings) is reused
        self.plan = build_plan(study, accuracy_projection.load(study))
        # every meter daemon's URL, in the study's order (emulated ones once started)
        self.meter_urls: list[str] = [m.url for m in study.meters if m.url]

    # -- output
    def echo(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    # -- step arguments (the spec a step process reads)
    def _args(self, step: Step, state: JournalState) -> tuple[StepArgs, Path | None]:
        st, lay = self.study, self.layout
        if step.kind == StepKind.PREPARE:
            return PrepareArgs(name=step.detail), None
        cfg = self.plan.config(step.config) if step.config else None
        if step.kind == StepKind.QUANTIZE:
            assert cfg is not None and cfg.map_path is not None
            return QuantizeArgs(map=str(cfg.map_path), base=str(base_path(st, cfg.model)),
                                out_dir=str(cfg.gguf.parent), threads=st.run.threads), None
        if step.kind == StepKind.DATA:
            return DataArgs(benchmarks=list(st.accuracy.benchmarks),
                            texts=[st.accuracy.ppl] if st.accuracy.ppl == "lambada" else []
                            ), None
        if step.kind == StepKind.ACCURACY:
            assert cfg is not None
            a = st.accuracy
            acc = AccuracyArgs(model=str(cfg.gguf), benchmarks=dict(a.benchmarks), ppl=a.ppl,
                               ppl_windows=a.ppl_windows, threads=a.threads, seed=a.seed,
                               out=str(lay.root / "accuracy" / f"{cfg.config_id}.json"),
                               cluster=a.cluster, shots=dict(a.shots),
                               shot_seed=a.shot_seed,
                               store=str(a.store.resolve()) if a.store else None)
            if cfg.decode_gguf is not None:  # a split only: the others' specs are unchanged
                acc["decode_model"] = str(cfg.decode_gguf)
            return acc, None
        if step.kind == StepKind.RUN:
            assert cfg is not None
            r = st.run
            run_dir = lay.run_dir(step, state.attempts.get(step.step_id, 0) + 1)
            return RunArgs(model=str(cfg.gguf), out=str(run_dir),
                           prompts=str(r.prompts) if r.prompts else None,
                           tokens=self.sizing.tokens if self.sizing else r.tokens,
                           repeats=r.repeats_per_run, warmups=r.warmups,
                           warmup_tokens=r.warmup_tokens, threads=r.threads,
                           workers=r.workers, split=r.split, node=r.node,
                           meters=list(self.meter_urls), idle_s=r.idle_s,
                           cooldown_s=r.cooldown_s,
                           seed=st.seed, map_id=cfg.config_id if cfg.is_split or (
                               cfg.map_path is not None and cfg.config_id != cfg.gguf.stem)
                           else None,
                           decode_model=str(cfg.decode_gguf) if cfg.decode_gguf else None
                           ), run_dir
        raise AssertionError(step.kind)

    def run_dirs(self, state: JournalState) -> list[Path]:
        """The finished runs' directories, in plan order (what the analysis reads)."""
        out = []
        for s in self.plan.run_steps:
            ev = state.done.get(s.step_id)
            if ev is not None and "run_dir" in ev.result:
                out.append(self.layout.root / ev.result["run_dir"])
        return out

    def trace_dirs(self) -> list[Path]:
        """Each meter's trace directory, in the study's order (host.campaign.plan)."""
        return trace_dirs(self.study)

    def trace_dir(self) -> Path | list[Path]:
        """What the analysis reads: the one trace, or every meter's (host.analysis.multi_trace).
        A missing trace directory, or a declared node found on another meter's trace or on
        none, is one line naming the study file and the field."""
        meters, dirs = self.study.meters, self.trace_dirs()
        many = len(dirs) > 1
        found = []
        for k, (m, d) in enumerate(zip(meters, dirs, strict=True)):
            if not d.is_dir():
                raise UserError(f"{self.study.path}: field '{_field(k, many, 'trace')}': {d} is "
                                f"not a directory (no trace of {m.url or 'the emulated daemon'})")
            found.append(trace_nodes(d))
        for k, m in enumerate(meters):
            for j, node in enumerate(m.nodes):
                where = f"{self.study.path}: field '{_field(k, many, f'nodes[{j}]')}'"
                other = [i for i, f in enumerate(found) if node in f and i != k]
                if other:
                    raise UserError(f"{where}: node {node!r} is on a channel of "
                                    f"meter[{other[0]}]'s trace {dirs[other[0]]} too: one "
                                    "node, one meter")
                if node not in found[k]:
                    raise UserError(f"{where}: node {node!r} is on no channel of {dirs[k]} "
                                    f"(its nodes: {', '.join(sorted(found[k])) or 'none'})")
        return dirs[0] if not many else dirs

    def merge_accuracy(self, state: JournalState) -> None:
        """One epi-accuracy file over every configuration's (for the analysis)."""
        from host.accuracy.results import read_results, write_results

        docs = []
        for s in self.plan.steps:
            ev = state.done.get(s.step_id)
            if s.kind == StepKind.ACCURACY and ev is not None and "out" in ev.result:
                docs.append(read_results(self.layout.root / ev.result["out"]))
        if not docs:
            return
        merged = dict(docs[0])
        merged["models"] = [m for d in docs for m in d["models"]]
        write_results(self.layout.accuracy, merged)

    # -- the two library steps
    def analyse(self, state: JournalState, log: TextIO) -> StepResult:
        """The analysis of every finished run (host.analysis.output), its tables to `log`."""
        from host.analysis.output import analyze_to
        from host.analysis.summary import summary_text

        runs = self.run_dirs(state)
        if not runs:
            raise StepFailed("no run finished: nothing to analyse")
        self.merge_accuracy(state)
        if self.study.analysis.compute_probe:
            self.probe_compute(log)
        acc = self.layout.accuracy if self.layout.accuracy.is_file() else None
        a = analyze_to(self.layout.analysis, runs, self.trace_dir(),
                       self.study.analysis.options(self.study.baseline), acc,
                       option=f"{self.layout.analysis}")
        log.write(summary_text(a) + "\n")
        return {"out": str(self.layout.analysis)}

    def probe_compute(self, log: TextIO) -> None:
        """This node's cache-resident cost per weight of every tensor type the configurations
        use (host/run/compute_probe.py), kept in OUT/probes/compute.json for the report's
        bandwidth-or-compute answer; measured again only when a type is missing or the build
        or thread count changed."""
        from host.llama.install import llama_info
        from host.run.compute_probe import probe_compute, read_probe, weights_by_type, write_probe

        types: set[str] = set()
        for c in self.plan.configs:
            if c.gguf.is_file():
                types |= set(weights_by_type(c.gguf))
        path = self.layout.root / "probes" / "compute.json"
        threads = self.study.run.threads or 1
        info = llama_info()
        build = f"llama-cpp-python {info['llama_cpp_python']} ({info['build_flags']})"
        if path.is_file():
            old = read_probe(path)
            if old.build == build and old.threads == threads and types <= set(old.costs):
                return
        def echo(line: str) -> None:
            log.write(line + "\n")

        probe = probe_compute(types, threads=threads, echo=echo)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_probe(probe, path)
        log.write(f"compute probe: {path}\n")

    def write_report(self, log: TextIO) -> StepResult:
        """The HTML and Markdown report of the analysis (host.report.build)."""
        from host.report.build import write_report

        st = self.study
        title = (f"epi study '{st.name}': {len(self.plan.configs)} configurations x "
                 f"{rounds_text(st)} rounds ({st.path.name})")
        r = write_report(self.layout.analysis, self.layout.report, title)
        log.write(f"wrote {r.markdown}\nreport: {r.html}\n")
        return {"out": str(self.layout.report)}

    # -- one step
    def run_step(self, step: Step, state: JournalState, progress: Progress
                 ) -> tuple[StepResult, Settle | None]:
        sdir = self.layout.step_dir(step.step_id)
        try:
            sdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{sdir}: cannot make the step's directory ({exc.strerror or exc})"
                            ) from None
        attempt = state.attempts.get(step.step_id, 0) + 1
        log = sdir / f"attempt{attempt}.log"
        settled = settle(self.study.thermal, self.meter_urls) if step.kind == StepKind.RUN else None
        if step.kind in IN_PROCESS:
            state.attempts[step.step_id] = attempt
            self.journal.append(Started(step.step_id, attempt, log=str(log)))
            result, rc, ok = self._in_process(step, state, log)
        else:
            result, rc, ok = self._in_step_process(step, state, progress, sdir, log, attempt,
                                                   settled)
        if not ok:
            why = self._failure(sdir, log)
            self.journal.append(Failed(step.step_id, attempt, rc, why))
            raise StepFailed(f"step {step.step_id} failed (exit {rc}): {why}")
        ev = Done(step.step_id, attempt, result, settled)
        self.journal.append(ev)
        state.done[step.step_id] = Done(step.step_id, attempt,
                                        self.journal.relative_result(result), settled)
        state.interrupted.pop(step.step_id, None)
        return result, settled

    def _in_process(self, step: Step, state: JournalState, log: Path
                    ) -> tuple[StepResult, int, bool]:
        with open(log, "a") as fh:
            try:
                result = self.analyse(state, fh) if step.kind == StepKind.ANALYSIS else \
                    self.write_report(fh)
            except UserError as exc:
                fh.write(f"epi: error: {exc}\n")
                return {}, exc.exit_code, False
        return result, 0, True

    def _in_step_process(self, step: Step, state: JournalState, progress: Progress,
                         sdir: Path, log: Path, attempt: int, settled: Settle | None
                         ) -> tuple[StepResult, int, bool]:
        spec_path, result_path = sdir / "spec.json", sdir / "result.json"
        result_path.unlink(missing_ok=True)
        (sdir / "error.json").unlink(missing_ok=True)
        args, run_dir = self._args(step, state)
        spec_path.write_text(json.dumps({"kind": step.kind, "args": args,
                                         "result": str(result_path)}, indent=1))
        marker = f"{self.layout.root.resolve()}:{step.step_id}:{attempt}"
        proc = procs.start([self.python, "-m", "host.campaign.step", str(spec_path)], log,
                           marker)
        state.attempts[step.step_id] = attempt
        self.journal.append(Started(step.step_id, attempt, proc.pid, marker,
                                    None if run_dir is None else str(run_dir), str(log),
                                    settled))
        try:
            while proc.poll() is None:
                try:
                    proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    progress.tick()
        except KeyboardInterrupt:
            procs.stop(proc)
            raise
        rc = proc.returncode
        if rc == 0 and result_path.is_file():
            return json.loads(result_path.read_text()), rc, True
        if step.kind == StepKind.RUN and rc == 1 and run_dir is not None and run_dir.exists():
            # The run started and failed (its token log says why): a finished step whose
            # verdict the analysis reports; running it again would not be the same run.
            return {"run_dir": str(run_dir), "failed": True}, rc, True
        return {}, rc, False

    @staticmethod
    def _failure(sdir: Path, log: Path) -> str:
        try:
            return str(json.loads((sdir / "error.json").read_text())["error"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        try:
            tail = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            tail = []
        return (tail[-1] if tail else "no output") + f" (log {log})"

    # -- the accuracy stage's projection
    def project_accuracy(self, state: JournalState, progress: Progress) -> None:
        """Before the accuracy stage: measure its time on this machine (a short probe of the
        first configuration's model, host.campaign.accuracy_projection) unless a measured
        figure for these settings is already kept or the stage is too small for a probe to
        be worth its cost; print it, and let the ETA use it."""
        left = [s for s in self.plan.steps
                if s.kind == StepKind.ACCURACY and s.step_id not in state.done]
        if not left:
            return
        proj = self.plan.accuracy
        items = accuracy_projection.stage_items(self.study) * len(left)
        if proj is None or not proj.measured:
            if items >= accuracy_projection.MIN_STAGE_ITEMS:
                progress.line(f"measuring the accuracy stage's time: a short probe of "
                              f"{len(self.study.accuracy.benchmarks)} benchmark(s)")
                proj = accuracy_projection.measured_or_assumed(
                    self.study, [self.plan.config(s.config).gguf for s in left
                                 if s.config is not None], len(left))
                if proj.measured:
                    accuracy_projection.save(self.layout.root, proj)
            else:
                proj = accuracy_projection.assumed(
                    self.study, f"not probed: {items} items in all, under "
                    f"{accuracy_projection.MIN_STAGE_ITEMS}, so a probe would cost a large "
                    "share of the stage")
        progress.line(f"accuracy stage: {len(left)} configuration(s), projected "
                      f"~{format_duration(proj.seconds * len(left))} "
                      f"(~{format_duration(proj.seconds)} each; {proj.basis}; cached results "
                      "take no time)")
        step_est = left[0].estimate_s
        if step_est > 0 and proj.seconds > 0:
            progress.ratio["accuracy"] = [proj.seconds / step_est]  # the ETA follows it

    # -- runs sized to this machine
    def size_runs(self, state: JournalState, progress: Progress) -> None:
        """Before the first run: time the baseline on this machine and choose the tokens per
        request that let the budget hold the rounds the comparisons need
        (host/campaign/sizing.py); kept, so every run of the campaign has the same size."""
        dec = self.study.decide
        if dec is None or not dec.size_runs or dec.rules.time_budget_s is None:
            return
        if self.sizing is not None:
            for line in self.sizing.lines():
                progress.line(line)
            return
        if any(s.step_id in state.done for s in self.plan.run_steps):
            return  # runs were measured at the study's size already: one size per campaign
        from host.run.prompts import load_prompt_set

        cid = self.study.baseline or self.plan.configs[0].config_id
        model = self.plan.config(cid).gguf
        prompts = load_prompt_set(self.study.run.prompts).prompts
        progress.line(f"sizing the runs to this machine: a short speed probe of {cid}")
        probe = sizing.probe_speed(model, prompts[0].text, prompts[0].n_tokens,
                                   threads=self.study.run.threads or 1)
        sd, basis = spread_and_basis(self.study)
        self.sizing = sizing.size_runs(
            study_tokens=self.study.run.tokens, shape=run_shape(self.study), probe=probe,
            n_configs=len(self.plan.configs), budget_s=dec.rules.time_budget_s,
            rate_hz=meter_rate_hz(self.study), spread_pct=sd, spread_basis=basis,
            size_for_pct=dec.size_for_pct, min_rounds=dec.rules.min_rounds,
            max_rounds=dec.rules.max_rounds, alpha=dec.rules.alpha)
        sizing.write_sizing(self.layout.root, self.sizing)
        for line in self.sizing.lines():
            progress.line(line)
        self.plan.steps[:] = [replace(s, estimate_s=self.sizing.per_run_s)
                              if s.kind == StepKind.RUN else s for s in self.plan.steps]

    # -- the meters
    def _start_meters(self, stack: ExitStack, progress: Progress) -> list[str]:
        """Every meter's URL in the study's order, starting the emulated ones (each stops when
        `stack` closes, after the last measured step)."""
        urls = []
        dirs = self.trace_dirs()
        for k, m in enumerate(self.study.meters):
            if not m.emulate:
                assert m.url is not None  # the study file has one of url, emulate
                urls.append(m.url)
                continue
            url = stack.enter_context(emulated_daemon(
                self.layout.root, dirs[k], m.rate_hz, m.activity, index=k, nodes=m.nodes))
            nodes = f", nodes {', '.join(m.nodes)}" if m.nodes else ""
            progress.line(f"emulated meter daemon at {url}, trace {dirs[k]}{nodes} "
                          f"(modelled power: {ACTIVITY_TEXT[m.activity]})")
            urls.append(url)
        return urls

    def remeasurer(self) -> Remeasurer:
        """The rule that measures a refused run's configuration again (host/campaign/
        remeasure.py): [decide] remeasure, checked on this campaign's trace."""
        dec = self.study.decide
        opts = self.study.analysis.options(None)
        return Remeasurer(self.layout.root, self.plan, dec.rules.remeasure if dec else 0,
                          dec.rules.time_budget_s if dec else None,
                          lambda d: check_run(d, self.trace_dir(), opts))

    # -- the whole campaign
    def run(self) -> Path:
        try:
            return self._run()
        except KeyboardInterrupt:
            self.echo(f"\ninterrupted: nothing half-finished is counted; run the same command "
                      f"to continue (`epi campaign {self.study.path}`)")
            raise

    def _run(self) -> Path:
        with campaign_lock(self.layout.root):
            state = self.journal.read()
            add_recorded_takes(self.plan, [*state.done, *state.attempts])
            for line in resume_lines(self.plan, state, self.layout):
                self.echo(line)
            for line in verify_done(self.plan, state, self.layout):
                self.echo(line)
            dec = self.study.decide
            if (dec is not None and "analysis" in state.done
                    and not adaptive_finished(self.layout.root, dec.rules.min_rounds)):
                # the rounds were reopened (--extend-budget): analyse and report again
                for sid in ("analysis", "report"):
                    state.done.pop(sid, None)
                self.echo("  the adaptive rounds were reopened: the analysis and the report "
                          "run again after them")
            _clean_interrupted(state, self.layout)
            stop_stale_daemon(self.layout.root)  # every emulated daemon a killed session left
            self.journal.append(Session(str(self.study.path), study_sha256(self.study),
                                        str(self.layout.root.resolve()), os.getpid()))
            done = set(state.done)
            for line in plan_text(self.plan, done):
                self.echo(line)
            todo = [s for s in self.plan.steps if s.step_id not in done]
            if not todo:
                self.echo("every step is finished; nothing to do")
                return self.layout.report_html
            findings = preflight(self.study)
            for line in preflight_lines(findings):
                self.echo(line)
            require(findings)
            progress = Progress(self.plan.steps, done, stream=self.stream)
            needs_meter = any(s.kind == StepKind.RUN for s in todo) or (
                dec is not None and not adaptive_finished(self.layout.root, dec.rules.min_rounds))
            t0 = time.monotonic()
            projected = sized = False
            with ExitStack() as daemons:
                if needs_meter:
                    self.meter_urls = self._start_meters(daemons, progress)

                def run_one(step: Step) -> None:  # a run the plan did not hold at the start
                    progress.start(step)
                    result, settled = self.run_step(step, state, progress)
                    progress.finish(step, summary(step, result, settled))
                    remeasure.run_takes(step, state, run_one, progress.line)

                remeasure = self.remeasurer()
                if needs_meter:
                    remeasure.catch_up(state, run_one, progress.line)
                for step in todo:
                    if step.kind in IN_PROCESS:
                        continue  # after the daemon has stopped and flushed its trace
                    if step.step_id in state.done:
                        continue  # a re-measure the catch-up ran
                    if step.kind == StepKind.ACCURACY and not projected:
                        self.project_accuracy(state, progress)
                        projected = True
                    if step.kind == StepKind.RUN and not sized:
                        self.size_runs(state, progress)
                        sized = True
                    progress.start(step)
                    result, settled = self.run_step(step, state, progress)
                    progress.finish(step, summary(step, result, settled))
                    remeasure.run_takes(step, state, run_one, progress.line)

                run_adaptive_rounds(self, state, run_one, progress.line)
            for step in todo:
                if step.kind in IN_PROCESS and step.step_id not in state.done:
                    progress.start(step)
                    result, settled = self.run_step(step, state, progress)
                    progress.finish(step, summary(step, result, settled))
            progress.close()
            self.echo(f"campaign finished in {format_duration(time.monotonic() - t0)} "
                      f"(this session)")
            from host.campaign.console_answers import answer_lines

            for line in answer_lines(self.layout.analysis):
                self.echo(line)
            settle = settle_command(self.layout.analysis)
            if settle:
                self.echo(settle)
            return self.layout.report_html


def _field(k: int, many: bool, name: str) -> str:
    """A meter field's name as the study file spells it: meter.X, or meter[K].X."""
    return f"meter[{k}].{name}" if many else f"meter.{name}"


def summary(step: Step, r: StepResult, s: Settle | None = None) -> str:
    """The one line printed when a step finishes."""
    if step.kind == StepKind.QUANTIZE:
        state = "up to date, skipped" if r.get("skipped") else "quantized"
        return (f"{Path(r.get('output', '?')).name} {state} "
                f"({(r.get('size_bytes') or 0) / 1e6:.1f} MB, {r.get('bits_per_weight')} "
                "bits/weight)")
    if step.kind == StepKind.ACCURACY:
        comp = r.get("composite")
        return (f"composite accuracy {comp:.3f}" if comp is not None else "composite null") + (
            " (cached)" if r.get("cached") else "")
    if step.kind == StepKind.RUN:
        s = s or {}
        how = (f"settled ({s.get('rule')}, {s.get('waited_s', 0):.1f} s)" if s.get("settled")
               else f"NOT settled after {s.get('waited_s', 0):.1f} s")
        run_dir = r.get("run_dir", "")
        if r.get("failed"):
            return f"run FAILED (the analysis reports why); {how}; {run_dir}"
        dec = r.get("decode_tok_s_median")
        return (f"{r.get('n_measured')} measured requests, decode "
                f"{dec:.1f} tok/s; {how}; {run_dir}" if dec else f"{run_dir}; {how}")
    if step.kind == StepKind.DATA:
        return "prepared " + (", ".join(r.get("prepared", [])) or "nothing (already there)")
    if step.kind == StepKind.PREPARE:
        return r.get("path") or ""
    return r.get("out", "")


def dry_run(study: Study, echo: Callable[[str], None], *, probe_accuracy: bool = False,
            accuracy_workers: int | None = None, as_json: bool = False) -> None:
    """Print the plan and the estimate; touch nothing. The accuracy figure is one measured
    earlier in this campaign directory, or (`probe_accuracy`) measured now with a short probe
    where a model file is on this host, or else the study file's assumption, said as such."""
    study = with_extensions(study)
    proj = accuracy_projection.load(study)
    if probe_accuracy:
        plan0 = build_plan(study)
        models = [c.gguf for c in plan0.configs] + [base_path(study, m.name)
                                                    for m in study.models]
        echo("measuring the accuracy stage's time: a short probe on this machine")
        proj = accuracy_projection.measured_or_assumed(study, models, len(plan0.configs))
    plan = build_plan(study, proj)
    state = Journal(study.out).read()
    add_recorded_takes(plan, [*state.done, *state.attempts])
    findings = preflight(study)
    if as_json:
        import json

        from host.campaign.plan_json import plan_document

        echo(json.dumps(plan_document(plan, set(state.done), findings), indent=1))
        return
    for line in preflight_lines(findings):
        echo(line)
    for line in resume_lines(plan, state, Layout(study.out)):
        echo(line)
    for line in verify_done(plan, state, Layout(study.out)):
        echo(line)
    for line in plan_text(plan, set(state.done)):
        echo(line)
    from host.campaign.shorten import shorten_lines

    for line in shorten_lines(plan, set(state.done)):
        echo(line)
    for line in sizing_lines(study):
        echo(line)
    if accuracy_workers and plan.accuracy is not None:
        left = [s for s in plan.steps if s.step_id not in state.done]
        for line in accuracy_projection.offload_lines(
                plan.accuracy, sum(s.estimate_s for s in left if s.kind == StepKind.ACCURACY),
                sum(s.estimate_s for s in left if s.kind == StepKind.RUN),
                sum(s.estimate_s for s in left), accuracy_workers):
            echo(line)
