"""The compression run, as core code: claim the conversation's lease, read, decide, summarize
with no session held, write (``run``), with the summarizer (``summarizer``) and the reporter of its
events (``report``) injected, and database writes that outlast a restart (``dbretry``).

The Celery task (``workers.tasks``), ``Recap.compress``, the CLI and ``recap serve`` call it; the
workers pass their model summarizer and the reporter that also publishes on Redis.
"""
