"""Configuring the Celery app again reaches the tasks it has bound already.

Celery copies ``task_ignore_result`` (and the other per-task settings) into a task once, when it
binds it. A process whose first configuration had no result backend (the file broker, say) used
to keep its tasks ignoring results for good: a later worker on Redis ran them and stored nothing,
and every ``result.get`` timed out. Which test bound the tasks first depended on the order the
tests ran in, so the failure showed only when the files were split between processes.
"""

from __future__ import annotations

from recap.core.settings import load_settings
from recap.workers.app import COMPRESS_TASK, app
from tests.support.celery_helpers import configured_app

REDIS = "redis://127.0.0.1:1/0"  # never connected to: only the configuration is read


def test_a_result_backend_given_later_reaches_bound_tasks() -> None:
    import recap.workers.tasks  # noqa: F401  (registers the compression task)

    without = load_settings(broker_url="filesystem://", result_backend=None)
    with_backend = load_settings(broker_url=REDIS, result_backend=REDIS)
    with configured_app(without, None):
        task = app.tasks[COMPRESS_TASK]  # finalizes the app: the task is bound now
        assert task.ignore_result is True
        with configured_app(with_backend, None):
            assert app.tasks[COMPRESS_TASK].ignore_result is False
            assert task.acks_late is True
        with configured_app(without, None):
            assert app.tasks[COMPRESS_TASK].ignore_result is True
