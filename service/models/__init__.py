"""Named models: several models in one service (``PUT /models/{name}``).

=============  =====================================================================
``registry``   :class:`ModelSpec` (a model's settings), the registry hash in Redis,
               the memory budget of a model, :func:`purge_model`
``manager``    :class:`ModelManager`: the named models of one app, started, looked
               up, created and deleted
=============  =====================================================================
"""

from nmbatch.service.models.manager import ModelManager, RunningModel
from nmbatch.service.models.registry import NAME_PATTERN, REGISTRY_KEY, ModelRegistry, ModelSpec

__all__ = [
    "NAME_PATTERN",
    "REGISTRY_KEY",
    "ModelManager",
    "ModelRegistry",
    "ModelSpec",
    "RunningModel",
]
