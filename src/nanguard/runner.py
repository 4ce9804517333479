"""Run an unmodified training script under guard (``nanguard run script.py``).

The script runs as ``__main__`` — its ``sys.argv``, working directory, ``sys.path[0]`` and
``if __name__ == "__main__"`` behave as with ``python script.py`` — and the framework adapters
install themselves the moment the script imports their framework (a post-import hook), so a
PyTorch script never loads TensorFlow and the other way round.

Exit status: the script's own when it ends (healthy or recovered); **3** when it stopped on a
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
from .core.ranks import rank_from_env, rank_path
from .core.runlog import RunLog

__all__ = ["EXIT_NONFINITE", "RunOptions", "run_script"]

EXIT_NONFINITE = 3
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

    log = RunLog(script=script, argv=list(args), started=time.time())
    ranked = rank_from_env()  # under torchrun every rank gets the same paths: each keeps its own
    if ranked is not None:
        log.rank, log.world_size = ranked
    sessions: list[Session] = []
    from .cli._live import make_observers

    observers = make_observers(opts.tensorboard_dir, opts.live)

    def install_torch() -> None:
        from .torch.session import TorchSession

        s = TorchSession(policy=opts.policy, trace=opts.trace, **opts.guard_kwargs)
        s.install()
        sessions.append(s)
        for o in observers:
            o.watch(s)

    def install_keras(just_imported: str = "") -> None:
        if any(s.framework == "keras" for s in sessions):
            return
        for name in ("tensorflow", "keras"):
            spec = getattr(sys.modules.get(name), "__spec__", None)
            if name != just_imported and getattr(spec, "_initializing", False):
                return  # one imports the other: install once both have finished importing
        try:
            from .keras.session import KerasSession
        except ImportError:  # the Keras adapter needs keras 3 + tensorflow
            return
        s = KerasSession(policy=opts.policy, trace=opts.trace, **opts.guard_kwargs)
        s.install()
        sessions.append(s)
        for o in observers:
            o.watch(s)

    hooks: dict[str, Callable[[], None]] = {}
    if "torch" in sys.modules:
        install_torch()
    else:
        hooks["torch"] = install_torch
    if "keras" in sys.modules or "tensorflow" in sys.modules:
        install_keras()
    else:  # a script may import either first (tensorflow imports keras 3 itself)
        hooks["keras"] = lambda: install_keras("keras")
        hooks["tensorflow"] = lambda: install_keras("tensorflow")
    finder = _PostImport(hooks)
    sys.meta_path.insert(0, finder)

    old_argv, old_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [script, *args]
    script_dir = os.path.dirname(os.path.abspath(script))
    sys.path.insert(0, script_dir)
    old_term = signal.getsignal(signal.SIGTERM)
    terminated: list[int] = []

    def _term(signum: int, frame: Any) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt("SIGTERM")

    if old_term in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _term)

    t0 = time.perf_counter()
    status = 0
    swallow_note: str | None = None
    err_to_print: NonFiniteError | None = None
    try:
        # an absolute __file__, as `python script.py` gives since Python 3.9
        runpy.run_path(os.path.abspath(script), run_name="__main__")
        log.status = "ok"
    except NonFiniteError as err:
        err_to_print = _complete(err, sessions)
        log.status = "nonfinite"
        status = EXIT_NONFINITE
    except SystemExit as exc:
        status = _exit_code(exc.code)
        log.status = "ok"
        if exc.code not in (None, 0) and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        log.status = "interrupted"
        status = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        print("nanguard run: terminated (SIGTERM)" if terminated else "nanguard run: interrupted",
              file=sys.stderr)
    except BaseException as exc:
        explained = None
        for s in sessions:
            explained = s.explain_crash(exc)
            if explained is not None:
                break
        if explained is not None:
            err_to_print = explained
            log.status = "nonfinite"
            status = EXIT_NONFINITE
            log.error = f"{type(exc).__name__}: {exc}"
            sys.stderr.write(_user_traceback(exc, script))
            sys.stderr.write("\nnanguard: the error above was caused by a non-finite value:\n")
        else:
            log.status = "error"
            log.error = f"{type(exc).__name__}: {exc}"
            sys.stderr.write(_user_traceback(exc, script))
            status = 1
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
        log.duration_s = time.perf_counter() - t0
        from ._run_outputs import OutputShield, write_outputs

        shield = OutputShield().start()  # from here on a second Ctrl-C must not cost the outputs
        # a session that saw training steps speaks for the run (both frameworks may be imported)
        for s in sorted(sessions, key=lambda s: bool(s.steps or s.events)):
            log.framework = s.framework
            log.steps = max(log.steps, s.steps)
            log.history = s.history
            log.events.extend(s.events)
            log.recoveries.extend(s.recoveries)
            s.uninstall()  # may add notes (the guarantee check under NANGUARD_VERIFY)
            log.notes.extend(s.notes)
        if log.status == "ok" and err_to_print is None:
            caught = next((c for c in (s.swallowed() for s in sessions) if c is not None), None)
            if caught is not None:  # the script swallowed the finding; it is reported anyway
                err_to_print, swallow_note = caught
                log.status = "nonfinite"
                log.notes.append(swallow_note)
                status = status or EXIT_NONFINITE
        if log.status == "ok" and log.recoveries:
            log.status = "recovered"
        elif log.status == "ok" and log.events:
            log.status = "recovered"  # skipped steps: met non-finite values, finished anyway
        log.exit_code = status
        for o in observers:
            o.close(log)  # the live line goes before the finding is printed
        stop_note = _policy_stop_note(err_to_print, opts.policy)
        if stop_note:
            log.notes.append(stop_note)
        if err_to_print is not None:
            sys.stdout.flush()
            _print_stop(err_to_print, log, opts.policy, sys.stderr)
            for note in (stop_note, swallow_note):
                if note:
                    print(f"nanguard: {note}", file=sys.stderr)
        elif log.status == "recovered":
            from .core.render import recovery_summary

            text = recovery_summary(log.steps, log.recoveries, len(log.events), opts.policy)
            if text:
                sys.stdout.flush()
                print(text + ("" if opts.json_path or opts.report_path else
                              "\n  the run log: nanguard run --json PATH (or --report PATH)"),
                      file=sys.stderr)
        # each output on its own: a full disk for one does not cost the other, nor the status
        failures = write_outputs(
            log,
            rank_path(opts.json_path, log.rank) if opts.json_path else None,
            rank_path(opts.report_path, log.rank) if opts.report_path else None,
        )
        for line in failures:
            print(f"nanguard run: {line}", file=sys.stderr)
        if failures and status == 0:
            status = 2
        if shield.stop() is not None and status == 0:
            status = EXIT_INTERRUPTED
    return status


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
