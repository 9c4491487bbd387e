"""The application layer: what the service does for one model, whatever the route.

==============  ======================================================================
``serving``     :class:`ModelHandle` (one served model as the use cases see it, with
                the ports the start-up code fills in: worker, capacity), the samples in
                (:func:`ingest`) and the centroids out (:func:`require_model`,
                :func:`centroids_json`), :func:`off_loop`
``reads``       the other reads of a model: assignments, statistics, readiness
``catalog``     create, describe, list and delete models (``/models``)

``errors``      the domain errors: one class per refusal, its facts as attributes
==============  ======================================================================

The use cases (and the model registry, :mod:`nmbatch.service.models`) refuse a request
by raising a :class:`~nmbatch.service.usecases.errors.DomainError`: its facts and a
plain-words detail, no HTTP status. :mod:`nmbatch.service.problems` is the one module
that maps each class to its ``application/problem+json`` answer (status, ``type``,
title, headers, members). The inputs come validated: the routes parse and check the
request at the edge (:mod:`nmbatch.service.parsing`). Nothing here imports FastAPI,
Starlette, the problems, the parsing, a route, the HTTP context or the worker, nor
constructs a ``ProblemError`` (``tests/test_architecture.py`` checks it).
"""
