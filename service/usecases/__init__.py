"""The application layer: what the service does for one model, whatever the route.

==============  ======================================================================
``serving``     :class:`ModelHandle` (one served model as the use cases see it, with
                the ports the start-up code fills in: worker, capacity), the samples in
                (:func:`ingest`) and the centroids out (:func:`require_model`,
                :func:`centroids_json`), :func:`off_loop`
``reads``       the other reads of a model: assignments, statistics, readiness
``catalog``     create, describe, list and delete models (``/models``)
==============  ======================================================================

The use cases raise :class:`~nmbatch.service.problems.ProblemError` (status, a slug
naming the fault, the detail, extension members); :mod:`nmbatch.service.problems` is the
one module that renders it as ``application/problem+json``. Nothing here imports a
route, the HTTP context or the worker.
"""
