"""Thin adapters that plug nanguard into the trainer you already use.

Each lives in its own module and imports its framework only when you import it::

    from nanguard.integrations.lightning import NanGuardCallback      # PyTorch Lightning
    from nanguard.integrations.huggingface import NanGuardCallback    # transformers.Trainer
    from nanguard.integrations.tensorboard import TensorBoardLogger   # per-step scalars

``import nanguard`` never imports Lightning, transformers or TensorBoard.
"""

from __future__ import annotations

__all__: list[str] = []
