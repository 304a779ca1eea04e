"""The engine shared by many clients: AsyncLLM on its thread, admission by tenant, streams, limits, metrics."""
