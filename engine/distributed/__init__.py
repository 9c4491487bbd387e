"""nmbatch on a Ray cluster: shard actors and a coordinator (issue 14).

- :mod:`.shard`: one part of the store (rows in priority order with their sample
  weights, per-row state, the ledger ``S_s``, ``v_s``, ``Q_s``) and its part of
  nmbatch's step; :mod:`.shard_rows`: the shard's store view and step on deltas; both
  import no Ray.
- :mod:`.coordinator`: ``C``, ``S``, ``v``, ``sse``, the prefix threshold ``tau``, one
  round over the shard actors, the doubling rule, fault recovery; imports Ray
  (:mod:`.relocation`: its part of relocating empty clusters).
- :mod:`.stream`: the streaming coordinator (rows appended between rounds, retired, or
  given by reference: :class:`~nmbatch.engine.rows.SourceRows`, read by the shards from
  a :class:`~nmbatch.engine.rows.RowSource`, the service's Redis log); its host, driven
  by the service's worker, is :class:`nmbatch.engine.hosting.ray.RayEngine`.
- :mod:`.fit`: ``NestedMiniBatchKMeans(backend="ray").fit`` (priorities, round-robin
  partitions, the Ray session).

Ray is an optional dependency (``pip install nmbatch[ray]``): importing this package
imports no Ray; the coordinator and the fit import it when they run.
"""
