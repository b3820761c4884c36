"""One small patch to kombu's Redis transport, so a worker survives a Redis restart mid-task.

**The failure** (kombu 5.7.0 with celery 5.7.0, reproduced by ``tests/test_restarts.py``): when
the broker connection drops while a late-acknowledged task runs, Celery's consumer first calls
``Connection.collect()``, which detaches the transport (``transport.client = None``), and then
``Connection.close()``, which closes the channel; closing the channel restores its unacknowledged
messages through a new Redis client, whose parameters are read from ``transport.client``:
``AttributeError: 'NoneType' object has no attribute 'hostname'`` in ``Channel._connparams``.
``maybe_close_channel`` and ``ignore_errors`` only swallow connection and channel errors, so the
AttributeError reaches the worker as "Unrecoverable error" and the worker exits once its running
task is done. Upstream: the same ``restore_unacked_once`` -> ``_connparams`` AttributeError on a
transport without a client is https://github.com/celery/kombu/issues/970; the close after
``collect()`` is in celery 5.7.0's ``Consumer.on_connection_error_after_connected`` ("close the
broken connection so the old socket is released"), part of the work on workers that stopped
consuming after a Redis reset (https://github.com/celery/celery/issues/10205, reopened as
https://github.com/celery/celery/issues/10302).

**The patch**: a channel whose transport has been detached raises a Redis ``ConnectionError``
instead, which is what it is (the connection is gone), so the existing handlers swallow it and the
consumer reconnects. What is lost is nothing new: the messages of that channel stay in Redis's
unacked set and come back after the visibility timeout (or are gone with a Redis that restarted
without persistence), and a late ack on the dead channel is logged as "Couldn't ack" instead of
crashing. ``apply()`` is idempotent and leaves any other transport alone; delete this module when
kombu stops calling ``_connparams`` on a detached transport (the test then passes without it).

RabbitMQ needs nothing of the kind: kombu's py-amqp transport drops a lost connection's channels
without restoring anything itself (the broker requeues their unacknowledged messages), and
``tests/test_rabbitmq.py`` restarts a node under a running worker with this patch in place but
unused (it touches only ``kombu.transport.redis``).
"""

from __future__ import annotations

from typing import Any

PATCHED_FLAG = "_recap_detached_transport_patch"


def _connparams_or_connection_error(original: Any) -> Any:
    def _connparams(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self.connection, "client", None) is None:
            from redis.exceptions import ConnectionError as RedisConnectionError

            raise RedisConnectionError("the broker connection of this channel was closed")
        return original(self, *args, **kwargs)

    setattr(_connparams, PATCHED_FLAG, True)
    _connparams.__wrapped__ = original  # type: ignore[attr-defined]
    _connparams.__doc__ = original.__doc__
    return _connparams


def apply() -> bool:
    """Patch kombu's Redis channel once; True when the patch is (now) in place."""
    try:
        from kombu.transport import redis as redis_transport
    except ImportError:  # kombu without the redis client: nothing to patch
        return False
    channel = redis_transport.Channel
    original = getattr(channel, "_connparams", None)
    if original is None:
        return False
    if not getattr(original, PATCHED_FLAG, False):
        channel._connparams = _connparams_or_connection_error(original)  # type: ignore[method-assign]
    return True


def remove() -> None:
    """Undo ``apply()`` (the test that shows the failure without the patch uses this)."""
    from kombu.transport import redis as redis_transport

    current = redis_transport.Channel._connparams
    if getattr(current, PATCHED_FLAG, False):
        redis_transport.Channel._connparams = current.__wrapped__  # type: ignore[attr-defined,method-assign]
