"""Run an unmodified training script under guard (``nanguard run script.py``).

The script runs as ``__main__`` — its ``sys.argv``, working directory, ``sys.path[0]`` and
``if __name__ == "__main__"`` behave as with ``python script.py`` — and the framework adapters
install themselves the moment the script imports their framework (a post-import hook), so a
PyTorch script never loads TensorFlow and the other way round.

Exit status: the script's own when it ends (healthy or recovered); **4** when it finished after
non-finite values but its loss never came back to its healthy level (``not-recovered``; the
script's own status when that is not 0); **3** when it stopped on a
non-finite value (also when the NaN made the script fail in its own way, e.g. in
``torch.multinomial``); 1 for an unrelated exception (its traceback is printed as Python would);
2 for a missing script, bad arguments or an output that cannot be written (checked before the
script starts; at the end, a failed output turns a 0 into 2 and leaves any other status);
130 on Ctrl-C, 143 on SIGTERM (as a shell reports a process killed by it).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import runpy
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .core.errors import NonFiniteError
from .core.ranks import rank_from_env, rank_path, say
from .core.runlog import RunLog, finished_status

__all__ = ["EXIT_NONFINITE", "RunOptions", "run_script"]

EXIT_NONFINITE = 3
EXIT_NOT_RECOVERED = 4  # finished after non-finite values, but the loss never came back
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM: what schedulers (Slurm, Kubernetes) expect


class Session(Protocol):
    framework: str
    notes: list[str]

    def install(self) -> None: ...
    def uninstall(self) -> None: ...
    @property
    def steps(self) -> int: ...
    @property
    def history(self) -> Any: ...
    @property
    def events(self) -> list[Any]: ...
    @property
    def recoveries(self) -> list[dict[str, Any]]: ...
    def complete(self, err: NonFiniteError) -> NonFiniteError: ...
    def swallowed(self) -> tuple[NonFiniteError, str] | None: ...
    def outcome(self) -> dict[str, Any] | None: ...
    def warnings(self) -> list[dict[str, Any]]: ...
    def explain_crash(self, exc: BaseException) -> NonFiniteError | None: ...


@dataclass
class RunOptions:
    policy: str = "raise"
    json_path: str | None = None
    report_path: str | None = None
    trace: bool = False
    guard_kwargs: dict[str, Any] = field(default_factory=dict)
    tensorboard_dir: str | None = None  # per-step scalars and events for TensorBoard
    live: bool | None = None  # live status line; None: only when stderr is a terminal


# ----------------------------------------------------------------------------------------------
# post-import hooks: install an adapter when its framework is imported


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callback: Callable[[], None]) -> None:
        self.inner = inner
        self.callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        self.callback()


class _PostImport(importlib.abc.MetaPathFinder):
    """Calls ``hooks[name]()`` right after the top-level package ``name`` finished importing."""

    def __init__(self, hooks: dict[str, Callable[[], None]]) -> None:
        self.hooks = dict(hooks)
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.hooks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self.hooks.pop(fullname))
        return spec


# ----------------------------------------------------------------------------------------------


def _user_traceback(exc: BaseException, script: str) -> str:
    """The traceback as ``python script.py`` would print it: from the script's first frame."""
    tb = exc.__traceback__
    script = os.path.abspath(script)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _print_stop(err: NonFiniteError, log: RunLog, policy: str, stream: Any) -> None:
    from .core.console import make_console, print_stop

    print_stop(make_console(stream), err, log.events, log.recoveries, log.steps, policy)


def _not_runnable(script: str, opts: RunOptions) -> str | None:
    """Why the run cannot start (a missing script, an output that cannot be written)."""
    if os.path.isdir(script):
        main = os.path.join(script, "__main__.py")
        hint = f" (python would run its __main__.py: nanguard run {main})" if os.path.isfile(main) \
            else ""
        return f"{script} is a directory, not a Python script: name the script to run{hint}"
    if not os.path.isfile(script):
        return f"no such file: {script}"
    from ._run_outputs import check_outputs

    problems = check_outputs(opts.json_path, opts.report_path)
    return "\nnanguard run: ".join(problems) + " (nothing was run)" if problems else None


def run_script(script: str, args: Sequence[str], opts: RunOptions) -> int:
    """Run ``script`` with ``args`` under nanguard; return the exit status."""
    problem = _not_runnable(script, opts)
    if problem:
        print(f"nanguard run: {problem}", file=sys.stderr)
        return 2
    try:
        with open(script, "rb") as fh:
            source = fh.read()
        code = compile(source, script, "exec", dont_inherit=True)
    except SyntaxError as exc:
        print(f"nanguard run: {script} does not compile:", file=sys.stderr)
        traceback.print_exception(type(exc), exc, None, file=sys.stderr)
        return 1
    del code
    return _Run(script, args, opts).run()


class _Run:
    """One ``nanguard run``: the adapters installed when the script imports its framework, the
    script run as ``__main__``, what it ended with, and the run log written."""

    def __init__(self, script: str, args: Sequence[str], opts: RunOptions) -> None:
        from .integrations.live import make_observers

        self.script, self.args, self.opts = script, list(args), opts
        self.log = RunLog(script=script, argv=list(args), started=time.time())
        ranked = rank_from_env()  # under torchrun every rank gets the same paths: each keeps its own
        if ranked is not None:
            self.log.rank, self.log.world_size = ranked
        self.sessions: list[Session] = []
        self.observers = make_observers(opts.tensorboard_dir, opts.live)
        self.status = 0
        self.err: NonFiniteError | None = None
        self.swallow_note: str | None = None
        self.terminated: list[int] = []

    # --- the adapters, installed as the script imports its framework ---------------------------
    def _add(self, s: Any) -> None:
        s.install()
        self.sessions.append(s)
        for o in self.observers:
            o.watch(s)

    def install_torch(self) -> None:
        from .torch.session import TorchSession

        self._add(TorchSession(policy=self.opts.policy, trace=self.opts.trace, **self.opts.guard_kwargs))

    def install_keras(self, just_imported: str = "") -> None:
        if any(s.framework == "keras" for s in self.sessions):
            return
        for name in ("tensorflow", "keras"):
            spec = getattr(sys.modules.get(name), "__spec__", None)
            if name != just_imported and getattr(spec, "_initializing", False):
                return  # one imports the other: install once both have finished importing
        try:
            from .keras.session import KerasSession
        except ImportError:  # the Keras adapter needs keras 3 + tensorflow
            return
        self._add(KerasSession(policy=self.opts.policy, trace=self.opts.trace, **self.opts.guard_kwargs))

    def _finder(self) -> _PostImport:
        hooks: dict[str, Callable[[], None]] = {}
        if "torch" in sys.modules:
            self.install_torch()
        else:
            hooks["torch"] = self.install_torch
        if "keras" in sys.modules or "tensorflow" in sys.modules:
            self.install_keras()
        else:  # a script may import either first (tensorflow imports keras 3 itself)
            hooks["keras"] = lambda: self.install_keras("keras")
            hooks["tensorflow"] = lambda: self.install_keras("tensorflow")
        return _PostImport(hooks)

    # --- the run ----------------------------------------------------------------------------------
    def run(self) -> int:
        finder = self._finder()
        sys.meta_path.insert(0, finder)
        old_argv, old_path0 = sys.argv[:], sys.path[0] if sys.path else None
        sys.argv = [self.script, *self.args]
        script_dir = os.path.dirname(os.path.abspath(self.script))
        sys.path.insert(0, script_dir)
        old_term = signal.getsignal(signal.SIGTERM)

        def _term(signum: int, frame: Any) -> None:
            self.terminated.append(signum)
            raise KeyboardInterrupt("SIGTERM")

        if old_term in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _term)
        t0 = time.perf_counter()
        try:
            self._execute()
        finally:
            sys.argv = old_argv
            if sys.path and sys.path[0] == script_dir:
                sys.path.pop(0)
            elif old_path0 is not None and script_dir in sys.path:
                sys.path.remove(script_dir)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            if signal.getsignal(signal.SIGTERM) is _term:
                signal.signal(signal.SIGTERM, old_term)
            self.log.duration_s = time.perf_counter() - t0
            self._finish()
        return self.status

    def _execute(self) -> None:
        """Run the script; what it ended with becomes the status and the log's ``status``."""
        log = self.log
        try:
            # an absolute __file__, as `python script.py` gives since Python 3.9
            runpy.run_path(os.path.abspath(self.script), run_name="__main__")
            log.status = "ok"
        except NonFiniteError as err:
            self.err = _complete(err, self.sessions)
            log.status, self.status = "nonfinite", EXIT_NONFINITE
        except SystemExit as exc:
            self.status = _exit_code(exc.code)
            log.status = "ok"
            if exc.code not in (None, 0) and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:
            log.status = "interrupted"
            self.status = EXIT_TERMINATED if self.terminated else EXIT_INTERRUPTED
            print("nanguard run: terminated (SIGTERM)" if self.terminated else "nanguard run: interrupted",
                  file=sys.stderr)
        except BaseException as exc:
            self._crashed(exc)

    def _crashed(self, exc: BaseException) -> None:
        """The script raised something else: a non-finite value may have caused it."""
        explained = None
        for s in self.sessions:
            explained = s.explain_crash(exc)
            if explained is not None:
                break
        self.log.error = f"{type(exc).__name__}: {exc}"
        sys.stderr.write(_user_traceback(exc, self.script))
        if explained is not None:
            self.err = explained
            self.log.status, self.status = "nonfinite", EXIT_NONFINITE
            sys.stderr.write("\nnanguard: the error above was caused by a non-finite value:\n")
        else:
            self.log.status, self.status = "error", 1

    # --- the end ----------------------------------------------------------------------------------
    def _finish(self) -> None:
        from ._run_outputs import OutputShield, write_outputs

        shield = OutputShield().start()  # from here on a second Ctrl-C must not cost the outputs
        self._gather()
        log, opts = self.log, self.opts
        log.exit_code = self.status
        for o in self.observers:
            o.close(log)  # the live line goes before the finding is printed
        stop_note = _policy_stop_note(self.err, opts.policy)
        if stop_note:
            log.notes.append(stop_note)
        if log.rank:  # another rank of a torchrun job: rank 0 prints the finding and the summary
            line = _other_rank_line(self.err, log, opts)
            if line:
                say(line)
        elif self.err is not None:
            sys.stdout.flush()
            _print_stop(self.err, log, opts.policy, sys.stderr)
            for note in (stop_note, self.swallow_note):
                if note:
                    print(f"nanguard: {note}", file=sys.stderr)
        elif log.status in ("recovered", "unjudged", "not-recovered"):
            self._print_summary()
        # the run log first, then the report, each on its own: a full disk for one does not
        # cost the other, nor the status; interrupted, the report's plots (seconds) are left out
        written = write_outputs(
            log,
            rank_path(opts.json_path, log.rank) if opts.json_path else None,
            rank_path(opts.report_path, log.rank) if opts.report_path else None,
            hurry=lambda: log.status == "interrupted" or shield.interrupted is not None,
        )
        for line in written.notes + written.failures:
            print(f"nanguard run: {line}", file=sys.stderr)
        if written.failures and self.status == 0:
            self.status = 2
        if shield.stop() is not None and self.status == 0:
            self.status = EXIT_INTERRUPTED

    def _gather(self) -> None:
        """The sessions' results into the run log; a finding the script swallowed stands."""
        log = self.log
        # a session that saw training steps speaks for the run (both frameworks may be imported)
        for s in sorted(self.sessions, key=lambda s: bool(s.steps or s.events)):
            log.framework = s.framework
            log.steps = max(log.steps, s.steps)
            log.history = s.history
            log.events.extend(s.events)
            log.recoveries.extend(s.recoveries)
            log.warnings.extend(s.warnings())
            s.uninstall()  # may add notes (the guarantee check under NANGUARD_VERIFY)
            log.notes.extend(s.notes)
        if log.status == "ok" and self.err is None:
            caught = next((c for c in (s.swallowed() for s in self.sessions) if c is not None), None)
            if caught is not None:  # the script swallowed the finding; it is reported anyway
                self.err, self.swallow_note = caught
                log.status = "nonfinite"
                log.notes.append(self.swallow_note)
                self.status = self.status or EXIT_NONFINITE
        if log.status == "ok" and (log.recoveries or log.events):
            log.status = "recovered"  # met non-finite values (skipped, recovered), finished anyway
            log.outcome = next((o for o in (s.outcome() for s in self.sessions) if o is not None), None)
            log.status = finished_status(log.outcome)
            if log.status == "not-recovered" and self.status == 0:
                # it finished, but its loss never came back to its healthy level: not a fix
                self.status = EXIT_NOT_RECOVERED

    def _print_summary(self) -> None:
        from .core.render import recovery_summary

        log, opts = self.log, self.opts
        text = recovery_summary(log.steps, log.recoveries, len(log.events), opts.policy, log.outcome)
        if text:
            sys.stdout.flush()
            print(text + ("" if opts.json_path or opts.report_path else
                          "\n  the run log: nanguard run --json PATH (or --report PATH)"),
                  file=sys.stderr)


def _other_rank_line(err: NonFiniteError | None, log: RunLog, opts: RunOptions) -> str | None:
    """What a rank other than 0 prints at the end of a run that met non-finite values: one line
    (rank 0 prints the finding, which names the rank that made the value, and the summary);
    the rest is in this rank's own run log."""
    asked = opts.json_path or opts.report_path
    own = rank_path(asked, log.rank) if asked else None
    where = f"; this rank's run log: {own}" if own else ""
    if err is not None:
        f, diag = err.finding, err.diagnosis
        made = f" made on rank {f.rank}" if f.rank is not None else ""
        cause = f"; {diag.cause.value}" if diag is not None else ""
        return (f"nanguard: stopped at step {f.step} on a non-finite value{made} (`{f.op}`, {f.phase} "
                f"pass{cause}): rank 0 prints the finding{where}")
    if log.status in ("recovered", "unjudged", "not-recovered"):
        return (f"nanguard: {log.status} after {len(log.events)} non-finite step(s), "
                f"{len(log.recoveries)} recovery action(s): rank 0 prints the summary{where}")
    return None


def _policy_stop_note(err: NonFiniteError | None, policy: str) -> str | None:
    """Why ``--policy recover`` stopped anyway, when its cause has no blind fix."""
    from .core.policy import UNFIXABLE

    diag = getattr(err, "diagnosis", None)
    if err is None or policy != "recover" or diag is None or diag.cause not in UNFIXABLE:
        return None
    return (f"policy 'recover' stopped here: {diag.cause.value} has no blind fix (the changes above are "
            "yours to make); --policy skip would skip such steps instead, and so would "
            "attach(..., policy='recover', on_unfixable='skip') in your code")


def _complete(err: NonFiniteError, sessions: list[Session]) -> NonFiniteError:
    for s in sessions:
        if err.finding.framework == s.framework:
            return s.complete(err)
    return err


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1
