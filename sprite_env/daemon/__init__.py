"""The sprite-env daemon: one trio process that owns the store and serves the API, the
checkpoint view, the auto-checkpoint scheduler and the one job runner."""
