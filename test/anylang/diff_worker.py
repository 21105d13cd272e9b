#!/usr/bin/env python3
"""The Python side of the differential test (TestWorkersLeaveEqualRows):
worker_example.work with handlers that follow the script in $SCRIPT (per
effect type: replaySafe and the outcome of each attempt) on $QUEUE until
SIGTERM."""

import json
import os
import signal
import threading
from datetime import timedelta

import worker_example as w

script = json.loads(os.environ["SCRIPT"])


def scripted(outcomes):
    def handler(effect_id, key, payload, attempt, max_attempts):
        o = outcomes[min(attempt, len(outcomes)) - 1]
        if o == "success":
            return
        raise {"retry": lambda: w.Retry("boom"), "retry_after": lambda: w.RetryAfter(1, "boom"),
               "permanent": lambda: w.Permanent("boom"), "ambiguous": lambda: w.Ambiguous("boom"),
               "error": lambda: RuntimeError("boom")}[o]()
    return handler


handlers = {t: (s["replaySafe"], scripted(s["outcomes"])) for t, s in script.items()}
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
w.work(os.environ["DATABASE_URL"], os.environ["QUEUE"], handlers, stop, lease=timedelta(seconds=30), poll=0.1,
       backoff_cap=timedelta(seconds=1), recover_every=0.5)
