"""``recap serve``: an OpenAI-compatible chat-completions endpoint over Recap.

Any OpenAI client gets Recap's store, assembly and background compression by changing its base
URL: ``app`` builds the ASGI app, ``routes`` answers the endpoints, ``turns`` runs one stored
turn (map the resent history onto the tree, assemble, call the upstream model, store the reply),
``prefix`` and ``history`` map a history onto the tree, ``upstream`` calls the model (through
``direct``, its own HTTP client, for an OpenAI-compatible base URL, or through litellm),
``streaming`` passes a streamed reply through, ``auth`` checks client keys. ``api_routes``
answers the Responses and Messages APIs over the same turns, converting with ``responses_api``
and ``messages_api`` and replying through a ``shapes.Shape``; ``startup`` checks the database
and the workers when the server starts.
"""

from recap.workers.serve.app import create_app

__all__ = ["create_app"]
