"""The web console: a read-only view of conversations in the browser, with two actions.

``recap serve`` mounts it at ``/ui`` when ``RECAP_UI_KEYS`` is set; ``recap ui`` runs it alone.
See ``docs/console.md``.
"""
