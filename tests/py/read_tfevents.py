#!/usr/bin/env python3
"""tests/py/read_tfevents.py RUN_DIR — print every scalar TensorBoard's own reader (EventAccumulator, which checks
the record CRCs) finds in RUN_DIR's events.out.tfevents.* files, one "tag step value" line each (value with 9
significant digits), sorted by tag then step. Used by tests/test_tfevents.c when `tensorboard` is importable."""
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
for tag in sorted(ea.Tags()["scalars"]):
    for e in ea.Scalars(tag):
        print(f"{tag} {e.step} {e.value:.9g}")
