"""Configuration read from the environment, validated with the list of valid values."""

from __future__ import annotations

import os

__all__ = ["ENV_POLICY", "POLICIES", "policy_from_env"]

#: the recovery policies, in order of intervention
POLICIES = ("raise", "skip", "recover")
#: environment variable that sets the default policy of ``nanguard run``
ENV_POLICY = "NANGUARD_POLICY"


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
