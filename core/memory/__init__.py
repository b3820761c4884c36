"""A user's memory, written in the background: the extraction window (``window``), the
extractors (``extractor``: the protocol and the offline one), the run (``run``: read, call,
one short write) and the export (``export``). The store is ``core.storage.memories``; what a
request sends, ``core.request.memory``."""
