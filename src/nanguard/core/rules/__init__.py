"""The diagnosis rules, one module per family; their order is :data:`nanguard.core.diagnosis.RULES`.

Each rule is a plain function ``Case -> Diagnosis | None`` (:class:`~nanguard.core.case.Case`):
it reads only the typed evidence, the trends and the run context, and spells its fixes with the
case's phrasebook, so it can be tested with hand-written numbers.

- :mod:`.inputs` — the batch, already bad weights, non-finite literals and masks
- :mod:`.optimizer` — clipping that overflowed, the optimizer step
- :mod:`.precision` — float16/bfloat16 range
- :mod:`.singular` — an op at its singular point (forward and backward)
- :mod:`.overflow` — ordinary arithmetic that overflowed: initialization, gradients, learning rate
"""

from . import inputs, optimizer, overflow, precision, singular

__all__ = ["inputs", "optimizer", "overflow", "precision", "singular"]
