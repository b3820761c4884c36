"""The compression run with the workers' parts: the run itself is core code
(``core.compression.run``); this module gives it the model summarizer (``workers.summarizers``,
through litellm) and the reporter that also publishes events on Redis (``workers.events``).

The Celery task (``workers.tasks``), the CLI, ``recap serve`` and, through the ``recap.engine``
entry point, ``Recap.compress`` run it with these parts.
"""

from __future__ import annotations

from functools import partial

from recap.core.compression import inplace, run
from recap.core.compression.run import COMPACTION_LOG as COMPACTION_LOG
from recap.core.compression.run import DELETED_REASON as DELETED_REASON
from recap.core.compression.run import Outcome as Outcome
from recap.core.compression.run import Parts
from recap.core.compression.summarizer import RetryLater as RetryLater
from recap.workers.events import Publisher
from recap.workers.summarizers import summarizer_for

PARTS = Parts(summarizers=summarizer_for, reporter=Publisher())


def worker_parts() -> Parts:
    """The ``recap.engine`` entry point: the parts a run uses in this distribution."""
    return PARTS


compress_session = partial(run.compress_session, parts=PARTS)
compress_now = partial(inplace.compress_now, parts=PARTS)
run_with_retries = partial(inplace.run_with_retries, parts=PARTS)
