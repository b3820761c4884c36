"""Recap's library: models, token accounting, request assembly and compression planning.

It never imports Celery: hosts use it on their request path, the workers use it in the background.
"""
