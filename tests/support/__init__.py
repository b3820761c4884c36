"""What the tests and the benchmarks share: child processes and waiting (``processes``), private
PostgreSQL, Redis and RabbitMQ servers (``services``), worker processes (``worker_stack``), the
Celery app on a test broker (``celery_helpers``, ``brokers``), ``recap serve`` (``serve_stack``),
the stand-in model servers (``llm_server``, ``hostile_upstream``), the ``recap`` command
(``cli_helpers``) and the other shared drivers. Nothing here is a test; ``bench`` imports it.
"""
