"""Recap's workers: the Celery app, its tasks, logging, and the ``recap`` command line."""
