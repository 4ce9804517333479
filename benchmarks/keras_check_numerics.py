"""An independent second opinion for labelling the Keras scenarios (does not use nanguard).

    python benchmarks/keras_check_numerics.py benchmarks/scenarios/keras/lr_sgd_mlp_fit.py

Runs the script with TensorFlow's own ``tf.debugging.enable_check_numerics()`` switched on and
prints what it reports: the type and the graph name (with its name scope, i.e. the Keras layer
path) of the first op whose output held NaN or Inf. It has no notion of provenance: a ``-inf``
mask that a softmax absorbs stops it too, a NaN that TensorFlow's ``ReluGrad`` maps to 0 does not,
and it cannot tell data from an op. Use it to check a label's op, layer and phase by hand.
"""

from __future__ import annotations

import os
import re
import runpy
import sys


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.debugging.enable_check_numerics()
    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except tf.errors.InvalidArgumentError as exc:
        text = str(exc)
        op = re.search(r"op type: (\w+)|an op of type (\w+)|\(op type: (\w+)\)", text)
        name = re.search(r"(?:Graph name|graph name|Op name): \"?([^\"\n]+)", text)
        print("check_numerics: first non-finite output")
        if op:
            print("  op type:", next(g for g in op.groups() if g))
        if name:
            print("  op name:", name.group(1))
        print("  " + "\n  ".join(text.splitlines()[:12]))
        return 1
    print("check_numerics: no non-finite value")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
