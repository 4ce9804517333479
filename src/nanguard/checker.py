"""Run a script's first steps under the latent-hazard check (``nanguard check script.py``).

The script runs as ``__main__`` (its ``sys.argv``, ``sys.path[0]``, ``__name__``), as with
``nanguard run``; the check (:func:`nanguard.torch.hazards.check`) watches every op from the
start and stops the script after its ``steps``-th ``optimizer.step()``. The hazards are printed
on stderr (the script's stdout is its own), ranked, and optionally written as JSON.

Exit status: **0** when nothing risky was found, **5** when a hazard is ranked risky (``high``:
a margin within reach of its singularity, or ``medium``: a pattern with a stable form), 1 when
the script raised, 2 for a missing script or bad arguments, or a Keras script (its ops are not
PyTorch's: one line says so). A script that makes a NaN during the check meets the guard of
``nanguard run``, installed beside the check: its finding is printed and the check exits 3.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from collections.abc import Sequence

from .core.hazards import RISKY, hazard_lines

__all__ = ["EXIT_HAZARDS", "check_script"]

EXIT_HAZARDS = 5


def check_script(script: str, args: Sequence[str], steps: int, json_path: str | None = None) -> int:
    """Run ``script`` with ``args`` for ``steps`` optimizer steps under the check; the status."""
    if not os.path.isfile(script):
        print(f"nanguard check: no such file: {script}", file=sys.stderr)
        return 2
    from .core.errors import NonFiniteError
    from .torch.hazards import check
    from .torch.session import TorchSession

    old_argv, script_dir = sys.argv[:], os.path.dirname(os.path.abspath(script))
    sys.argv = [script, *args]
    sys.path.insert(0, script_dir)
    status, fired = 0, None
    # the guard of ``nanguard run`` watches the checked steps too: a NaN the script makes within
    # them is the finding (exit 3), not a margin read from values that were already NaN
    guard = TorchSession(policy="raise", say_notes=False)
    try:
        with check(steps=steps) as hz:
            guard.install()
            runpy.run_path(os.path.abspath(script), run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except NonFiniteError as err:
        fired = err
    except Exception:
        traceback.print_exc()
        status = 1
    finally:
        guard.uninstall()
        sys.argv = old_argv
        if script_dir in sys.path:
            sys.path.remove(script_dir)
    hazards = hz.hazards
    if not hz.steps and fired is None and "keras" in sys.modules:
        print(f"nanguard check: {script} trained with Keras, whose ops the check does not see "
              "(it reads PyTorch ops, and stops after --steps torch optimizer steps): nothing was "
              f"checked; nanguard run {script} watches Keras training as it runs", file=sys.stderr)
        return 2
    print("\n".join(hazard_lines(hazards, hz.steps, script)), file=sys.stderr)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"script": script, "steps": hz.steps, "hazards": [h.to_dict() for h in hazards]},
                      fh, indent=1)
    if fired is not None:
        print(f"\n{fired}", file=sys.stderr)
        return 3
    if status:
        return status
    return EXIT_HAZARDS if any(h.risk in RISKY for h in hazards) else 0
