"""nmbatch service: FastAPI app, worker, Redis persistence, settings."""
