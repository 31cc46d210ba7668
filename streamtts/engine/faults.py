"""TEST SEAM ONLY: fault injection for the reliability tests. Off unless the environment variable
``STREAMTTS_TEST_FAULT_INJECTION=1`` is set; never set it in production.

With it on, the factory gives the Fish engine (including ``synthetic:*``) a job hook that its
generator thread calls before each segment's work; a text segment containing

- ``[[fault:job]]`` makes that segment's job raise inside the generator thread (the context
  must fail alone, with ``error`` code ``internal``);
- ``[[fault:worker]]`` kills the generator thread itself (the server must stop being ready and
  exit non-zero).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Protocol

log = logging.getLogger(__name__)

ENV_VAR = "STREAMTTS_TEST_FAULT_INJECTION"
JOB_FAULT = "[[fault:job]]"
WORKER_FAULT = "[[fault:worker]]"


class InjectedJobFault(RuntimeError):
    pass


class InjectedWorkerDeath(BaseException):
    """A BaseException: the generator's per-job guard does not catch it, so its thread dies."""


class HasText(Protocol):
    @property
    def text(self) -> str: ...


def inject(job: HasText) -> None:
    if WORKER_FAULT in job.text:
        raise InjectedWorkerDeath("injected worker death (test seam)")
    if JOB_FAULT in job.text:
        raise InjectedJobFault("injected job fault (test seam)")


def job_hook(environ: Mapping[str, str] | None = None) -> Callable[[HasText], None] | None:
    """The fault hook when the seam is switched on, else None."""
    env = os.environ if environ is None else environ
    if env.get(ENV_VAR) != "1":
        return None
    log.warning("TEST SEAM: fault injection is ON (%s=1); never use this in production", ENV_VAR)
    return inject
