"""Framework-free core: findings, history, diagnosis, rendering. Imports neither torch nor TF."""

from .case import Case
from .diagnosis import RULES, Diagnosis, RunContext, diagnose
from .errors import GiveUpError, NonFiniteError
from .evidence import Evidence
from .finding import Finding, TensorStats
from .history import History, StepRecord
from .taxonomy import PHASES, Cause

__all__ = [
    "PHASES",
    "RULES",
    "Case",
    "Cause",
    "Diagnosis",
    "Evidence",
    "Finding",
    "GiveUpError",
    "History",
    "NonFiniteError",
    "RunContext",
    "StepRecord",
    "TensorStats",
    "diagnose",
]
