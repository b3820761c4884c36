"""Types for the parts of Celery that Recap uses (Celery ships none, so mypy sees it as ``Any``).

The signals Recap connects to are re-exported here as ``Signal``: ``@signal.connect`` then keeps
the handler's own type. A registered task is a ``TaskHandle``: what ``@task(...)`` in
``workers.app`` returns, and the ``self`` of a task registered with ``bind=True``. Only what
Recap calls is declared; each object is Celery's own, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from celery import signals as _signals

Receiver = TypeVar("Receiver", bound=Callable[..., object])
R_co = TypeVar("R_co", covariant=True)


class Signal(Protocol):
    """A Celery signal: ``connect(receiver)`` registers the receiver and returns it."""

    def connect(self, receiver: Receiver, /) -> Receiver: ...


class AsyncResult(Protocol):
    """What sending a task returns."""

    id: str

    def get(self, timeout: float | None = None, **options: Any) -> Any: ...


class TaskHandle(Protocol[R_co]):
    """A registered task (also a bound task's ``self``) as Recap calls it."""

    name: str
    request: Any  # Celery's per-run context: id, retries, delivery_info, ... (free-form)

    def __call__(self, *args: Any, **kwargs: Any) -> R_co: ...

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult: ...

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult: ...

    def retry(self, *args: Any, **kwargs: Any) -> Exception: ...


celeryd_init: Signal = _signals.celeryd_init
setup_logging: Signal = _signals.setup_logging
task_postrun: Signal = _signals.task_postrun
task_prerun: Signal = _signals.task_prerun
task_received: Signal = _signals.task_received
worker_init: Signal = _signals.worker_init
worker_process_init: Signal = _signals.worker_process_init
worker_process_shutdown: Signal = _signals.worker_process_shutdown
worker_shutdown: Signal = _signals.worker_shutdown
