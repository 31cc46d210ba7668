"""TEST SEAM ONLY: fault injection for the reliability tests. Off unless the environment variable
``STREAMTTS_TEST_FAULT_INJECTION=1`` is set; never set it in production.

With it on, and an engine with a generator thread (Fish-Speech, including ``synthetic:*``), a
text segment containing

- ``[[fault:job]]`` makes that segment's job raise inside the generator thread (the context
  must fail alone, with ``error`` code ``internal``);
- ``[[fault:worker]]`` kills the generator thread itself (the server must stop being ready and
  exit non-zero).

It uses the generator's ``before_job_work`` hook, which exists for exactly this.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from streamtts.engine.base import Engine

log = logging.getLogger(__name__)

ENV_VAR = "STREAMTTS_TEST_FAULT_INJECTION"
JOB_FAULT = "[[fault:job]]"
WORKER_FAULT = "[[fault:worker]]"


class InjectedJobFault(RuntimeError):
    pass


class InjectedWorkerDeath(BaseException):
    """A BaseException: the generator's per-job guard does not catch it, so its thread dies."""


def _hook(job: Any) -> None:
    text = getattr(job, "text", "")
    if WORKER_FAULT in text:
        raise InjectedWorkerDeath("injected worker death (test seam)")
    if JOB_FAULT in text:
        raise InjectedJobFault("injected job fault (test seam)")


def install_if_enabled(engine: Engine) -> bool:
    """Install the hook when the test seam is switched on; True if installed."""
    if os.environ.get(ENV_VAR) != "1":
        return False
    generator = getattr(engine, "generator", None)
    if generator is None or not hasattr(generator, "before_job_work"):
        log.warning("%s=1 but engine %s has no generator hook", ENV_VAR, engine.name)
        return False
    generator.before_job_work = _hook
    log.warning("TEST SEAM: fault injection is ON (%s=1); never use this in production", ENV_VAR)
    return True
