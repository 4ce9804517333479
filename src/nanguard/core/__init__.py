"""Framework-free core: findings, history, diagnosis, rendering. Imports neither torch nor TF."""

from .diagnosis import Diagnosis, RunContext, diagnose
from .errors import GiveUpError, NonFiniteError
from .finding import Finding, TensorStats
from .history import History, StepRecord
from .taxonomy import PHASES, Cause

__all__ = [
    "PHASES",
    "Cause",
    "Diagnosis",
    "Finding",
    "GiveUpError",
    "History",
    "NonFiniteError",
    "RunContext",
    "StepRecord",
    "TensorStats",
    "diagnose",
]
