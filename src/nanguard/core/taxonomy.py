"""The cause taxonomy: stable ids used in findings, JSON run logs and the docs.

The ids never change once published; descriptions may be refined.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["PHASES", "Cause"]

#: Where in a training step a non-finite value was made.
PHASES = ("data", "forward", "backward", "optimizer")


class Cause(str, Enum):
    """Why a non-finite value appeared. The value of each member is its stable id."""

    NONFINITE_INPUT = "nonfinite-input"
    UNSAFE_OP = "unsafe-op"
    EXPLODING_GRADIENTS = "exploding-gradients"
    LEARNING_RATE_TOO_HIGH = "learning-rate-too-high"
    BAD_INITIALIZATION = "bad-initialization"
    LOW_PRECISION_OVERFLOW = "low-precision-overflow"
    OPTIMIZER_STATE = "optimizer-state"
    NONFINITE_PARAMETERS = "nonfinite-parameters"
    UNSCALED_DATA = "unscaled-data"

    @property
    def headline(self) -> str:
        return _TITLES[self]

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    def __str__(self) -> str:
        return self.value


_TITLES = {
    Cause.NONFINITE_INPUT: "the batch itself holds NaN/Inf",
    Cause.UNSAFE_OP: "an operation met its singularity",
    Cause.EXPLODING_GRADIENTS: "exploding gradients",
    Cause.LEARNING_RATE_TOO_HIGH: "learning rate too high",
    Cause.BAD_INITIALIZATION: "bad initialization",
    Cause.LOW_PRECISION_OVERFLOW: "low-precision overflow",
    Cause.OPTIMIZER_STATE: "the optimizer step made the weights non-finite",
    Cause.NONFINITE_PARAMETERS: "the weights were already non-finite",
    Cause.UNSCALED_DATA: "the data is far from unit scale",
}

_DESCRIPTIONS = {
    Cause.NONFINITE_INPUT: "The input batch contained NaN or Inf before any operation ran.",
    Cause.UNSAFE_OP: (
        "An operation with a singularity met it: log of 0 or a negative number, division by 0, "
        "sqrt/pow of 0 (often only in backward), acos/asin out of range, exp overflow."
    ),
    Cause.EXPLODING_GRADIENTS: (
        "The gradient norm grew fast over the last steps, or a backward operation overflowed first."
    ),
    Cause.LEARNING_RATE_TOO_HIGH: (
        "Updates were too large for the weights: the weights grew step after step until an "
        "operation overflowed."
    ),
    Cause.BAD_INITIALIZATION: (
        "Activations overflowed at the very first step, their scale growing layer by layer."
    ),
    Cause.LOW_PRECISION_OVERFLOW: (
        "A float16/bfloat16 value exceeded its dtype's range where float32 would not have."
    ),
    Cause.OPTIMIZER_STATE: (
        "The gradients were finite, yet the optimizer's update made the weights non-finite "
        "(for example Adam with eps=0)."
    ),
    Cause.NONFINITE_PARAMETERS: (
        "The weights were non-finite before the step began (for example a corrupt checkpoint)."
    ),
    Cause.UNSCALED_DATA: (
        "The features or the targets are far from unit scale (raw values in the thousands, a first "
        "loss of 1e5): every update is large, and no learning rate trains well until they are "
        "standardised."
    ),
}
