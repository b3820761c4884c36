"""One rule per field of every body `recap serve` reads (chat completions, Responses,
Messages and count_tokens).

``fields`` holds the rules, each named for what the field means and used by every API that has
the field (chat completions' ``temperature``, Responses' ``temperature`` and Messages'
``temperature`` are one rule; ``max_output_tokens`` and Messages' ``max_tokens`` are checked by
chat completions' ``max_tokens`` rule). ``responses`` and ``messages`` walk their API's body,
every field and every item or block, with those rules. Each failure is one ``ServeError`` of
status 400 naming the field's path, raised before anything is stored or sent upstream, and
rendered by the route in its API's error format.
"""
