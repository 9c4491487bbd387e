"""nmbatch service: a FastAPI app that clusters a stream of vectors with nmbatch.

``python -m nmbatch`` runs it (see the README); ``create_app`` builds
the app for uvicorn or tests.
"""
