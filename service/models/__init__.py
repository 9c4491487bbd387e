"""The models an app serves: the default one and the named ones (``PUT /models/{name}``).

=============  =====================================================================
``registry``   :class:`ModelSpec` (a model's settings), the registry hash in Redis,
               the memory budget of a model, :func:`purge_model`
``manager``    :class:`ModelManager`: the one registry of the app's running models,
               started, looked up and stopped by the same code
``capacity``   :class:`ModelCapacity`: a model's capacity and its share of the
               embedded Redis's ``maxmemory``
=============  =====================================================================
"""

from nmbatch.service.models.manager import ModelManager, RunningModel, StartupError
from nmbatch.service.models.registry import NAME_PATTERN, REGISTRY_KEY, ModelRegistry, ModelSpec

__all__ = [
    "NAME_PATTERN",
    "REGISTRY_KEY",
    "ModelManager",
    "ModelRegistry",
    "ModelSpec",
    "RunningModel",
    "StartupError",
]
