"""The Ray Serve application every TauGrid endpoint runs: ``import_path: tau.serving:app``.

tau.yaml says what to serve (``serve.import_path``, the project's own Ray Serve application)
and how much of it (``serve.replicas`` or ``serve.autoscaling``, and ``compute`` per replica).
Ray Serve takes replicas and resources per *deployment*, by deployment name, and the name of
the project's deployment is known only once its code is imported. So the endpoint's Serve
config names this application builder instead, with the project's import path and the sizes
as ``args``, and the builder imports the project's application and gives its ingress
deployment those options: on a cluster (KubeRay's RayService) and on this machine (the local
executor) alike, so both size an endpoint the same way.

What ``serve.import_path`` may name:

* an application (``app = Model.bind()``): its ingress deployment gets the options;
* a deployment (``@serve.deployment class Model``) that takes no arguments: bound here;
* an application builder (``def build(args) -> Application``): called with ``args["args"]``.

Only the ingress deployment is sized: the other deployments of a composed application keep
what their code says (they are the project's to size).

Shipped with every workload (``runs.workload_sdk``); imports Ray only when called, and
nothing from TauGrid.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

#: ``args`` keys this builder reads (and the only ones it accepts).
ARGS = ("import_path", "num_replicas", "autoscaling_config", "ray_actor_options", "args")


class ServeConfigError(ValueError):
    """The endpoint's import path does not name something Ray Serve can run."""


def import_target(import_path: str) -> Any:
    """The object ``module:attribute`` (or ``module.attribute``) names, imported from the
    project (its folder is the working directory, first on ``sys.path``)."""
    module_name, _, attribute = import_path.partition(":")
    if not attribute:
        module_name, _, attribute = import_path.rpartition(".")
    if not module_name or not attribute:
        raise ServeConfigError(f"serve.import_path {import_path!r} is not module:attribute")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ServeConfigError(
            f"serve.import_path {import_path!r}: no module {error.name!r} in the project"
        ) from error
    target = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ServeConfigError(
                f"serve.import_path {import_path!r}: {module_name} has no {attribute!r}"
            ) from None
    return target


def _options(args: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.get("autoscaling_config") is not None:
        options["autoscaling_config"] = dict(args["autoscaling_config"])
    elif args.get("num_replicas") is not None:
        options["num_replicas"] = int(args["num_replicas"])
    if args.get("ray_actor_options"):
        options["ray_actor_options"] = dict(args["ray_actor_options"])
    return options


def app(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder: the project's application, sized as tau.yaml says."""
    from ray import serve  # type: ignore[import-not-found]

    unknown = sorted(set(args) - set(ARGS))
    if unknown:
        raise ServeConfigError(f"unknown arguments {unknown}; expected some of {list(ARGS)}")
    import_path = str(args.get("import_path") or "")
    target = import_target(import_path)
    options = _options(args)
    if isinstance(target, serve.Deployment):
        return target.options(**options).bind()
    if not isinstance(target, serve.Application) and callable(target):
        target = target(dict(args.get("args") or {}))
    if not isinstance(target, serve.Application):
        raise ServeConfigError(
            f"serve.import_path {import_path!r} names a {type(target).__name__}, not a Ray "
            "Serve application (`app = Model.bind()`), deployment or application builder"
        )
    ingress = getattr(target, "_bound_deployment", None)
    if not isinstance(ingress, serve.Deployment):
        raise ServeConfigError(
            "this version of Ray Serve does not let TauGrid size the application's ingress "
            f"deployment (Ray {getattr(sys.modules.get('ray'), '__version__', '?')})"
        )
    # The application was imported for this endpoint alone: sized in place, it keeps what
    # else Ray Serve attached to it.
    target._bound_deployment = ingress.options(**options)
    return target
