"""HTTP/1.1 over a Unix socket (h11 on trio): JSON replies, NDJSON progress streams.

- ``server``: connections, limits and HTTP framing; ``routes``: the router, which checks
  requests against its route table (``table``) and calls a ``backend.Backend`` (the
  daemon, or a test's fake), never the daemon's class.
- ``shapes``: every JSON shape, once, as TypedDicts with JSON Schemas derived from them;
  ``openapi``: ``GET /v1/openapi.json``, written from the route table and the shapes.
- ``events`` (NDJSON lines), ``problems`` (errors: code, message, status), ``pacing``.
"""
