"""HTTP/1.1 over a Unix socket (h11 on trio): JSON replies, NDJSON progress streams."""
