"""Prefect flows that drive the DVC pipeline stages (retries, UI, scheduled retraining)."""
