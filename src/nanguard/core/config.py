"""Every setting read from the environment, read and validated here and nowhere else.

As equinox's ``_config``: one function per variable, each with its list of valid values, read
when the setting is needed (a test or a script may set the variable after import); a bad value
is one clear error naming the variable and what it may be.

=============================  ===========  ====================================================
variable                       values       meaning
=============================  ===========  ====================================================
``NANGUARD_POLICY``            raise, skip,  the default policy of ``nanguard run``
                               recover
``NANGUARD_VERIFY``            0, 1          after every step, check that no weight or optimizer
                                             state is non-finite (the guarantee of skip/recover)
``NANGUARD_LIVE``              0, 1          the live status line on a terminal (default 1)
``NANGUARD_WATCH_DEFERRED``    0, 1, auto    the deferred (no host sync) watch: auto = on CUDA
``NANGUARD_DEFERRED``          0, 1          the locator's device-side flags on the CPU too
``NANGUARD_STRICT``            0, 1          an error inside nanguard (a replay, a trial, a look
                                             at the data) is raised instead of logged and
                                             reported as ours (the test suite sets it)
``NANGUARD_FORWARD_CHECK``     0, 1          a script that runs many torch calls and no
                                             backward() or optimizer step is checked op by op
                                             from then on (default 1)
=============================  ===========  ====================================================
"""

from __future__ import annotations

import os

__all__ = [
    "ENV_POLICY", "POLICIES", "deferred_flags", "forward_check", "live", "policy_from_env", "strict",
    "verify", "watch_deferred",
]

#: the recovery policies, in order of intervention
POLICIES = ("raise", "skip", "recover")
#: environment variable that sets the default policy of ``nanguard run``
ENV_POLICY = "NANGUARD_POLICY"


def _choice(name: str, valid: tuple[str, ...], default: str) -> str:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; valid values: {', '.join(valid)}")
    return value


def _flag(name: str, default: bool = False) -> bool:
    return _choice(name, ("0", "1"), "1" if default else "0") == "1"


def policy_from_env(default: str = "raise") -> str:
    """The policy named by ``$NANGUARD_POLICY``; a clear error for anything else."""
    value = os.environ.get(ENV_POLICY, "").strip().lower()
    if not value:
        return default
    if value not in POLICIES:
        raise ValueError(
            f"{ENV_POLICY}={value!r} is not a policy; valid values: {', '.join(POLICIES)}"
        )
    return value


def verify() -> bool:
    """``NANGUARD_VERIFY=1``: check the guarantee of ``skip``/``recover`` after every step."""
    return _flag("NANGUARD_VERIFY")


def live() -> bool:
    """``NANGUARD_LIVE`` (default on): the live status line, when stderr is a terminal."""
    return _flag("NANGUARD_LIVE", default=True)


def watch_deferred() -> str:
    """``NANGUARD_WATCH_DEFERRED``: ``"1"`` forces the deferred watch on, ``"0"`` off,
    ``"auto"`` (unset) turns it on for CUDA parameters."""
    return _choice("NANGUARD_WATCH_DEFERRED", ("0", "1", "auto"), "auto")


def deferred_flags() -> bool:
    """``NANGUARD_DEFERRED=1``: the locator keeps its per-op flags on the device on the CPU too
    (how the tests exercise the CUDA path)."""
    return _flag("NANGUARD_DEFERRED")


def forward_check() -> bool:
    """``NANGUARD_FORWARD_CHECK`` (default on): a script that only runs forward computations
    (no ``backward()``, no optimizer step) is checked op by op once it has run for a while."""
    return _flag("NANGUARD_FORWARD_CHECK", default=True)


def strict() -> bool:
    """``NANGUARD_STRICT=1``: an error in nanguard's own code is raised, not reported as ours."""
    return _flag("NANGUARD_STRICT")
