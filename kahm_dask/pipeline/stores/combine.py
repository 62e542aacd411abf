"""The global model store of a federation: the sites' published model stores combined by their
distances alone (docs/federated.md#across-clusters).

Each site trains on its own cluster, under its own ledger, and publishes its model store (a
folder or a URL); no row leaves a site. The global classifier takes, for a query y, the class of
the smallest distance over every site's class models,

    ĉ(y) = argmin_c min_q min_s Γ_{D_{c,s}^(q)}(y),

which is the federated rule ``argmin_q ρ_q(y)`` followed by the winning site's own argmin
(:func:`kahm_dask.federated.combine`) written as one wide model: the clusters of class c of
every site together are class c's clusters. :func:`combine_models` therefore writes a model
store whose clusters are the sites' clusters, copied and renumbered (global class code, then a
running cluster index); ``kahm-dask predict`` and ``evaluate`` and ``DaskKAHMClassifier`` read it
like any other, on any cluster. Its manifest lists the sites (``federation``); a site's cluster
keeps where it came from in its ``info`` (``site``, ``site_class``, ``site_cluster``).

Sites are combined only when their distances measure the same thing (:func:`check_combinable`,
one line naming the first difference): the same features (p), the same public bounds and
scaling of the features (the models' coordinates), labels of one type that share at least one
class (unless ``disjoint_classes``: sites that each hold other classes, e.g. one class per
site), and one unit of privacy (all non-private, or all DP with the same unit of change d).
Copying a published store is post-processing: the global store is DP when every site's is, each
site's guarantee covering its own rows.

Examples
--------
>>> site = {"n_features": 4, "classes": [0, 1], "parameters": {"bounds": None}, "privacy": None}
>>> check_combinable([site, {**site, "classes": [1, 2]}], ["a", "b"])
>>> check_combinable([site, {**site, "n_features": 5}], ["a", "b"])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
kahm_dask.pipeline.stores.combine.IncompatibleSitesError: cannot combine b with a: b has 5 features, a has 4.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import zarr

from kahm_dask.pipeline.stores.manifest import build_manifest, read_manifest, write_manifest
from kahm_dask.pipeline.stores.model import cluster_location
from kahm_dask.storage.location import COMPLETE_FILE, LocationLike, as_location, committed_directory, copy_tree

__all__ = ["IncompatibleSitesError", "check_combinable", "combine_models", "site_unit"]

Options = Mapping[str, Any] | None


class IncompatibleSitesError(ValueError):
    """The sites' models measure different things: their distances cannot be compared."""


def site_unit(manifest: Mapping[str, Any]) -> dict | None:
    """The unit of privacy of a site's model: None (not private), else the public bounds, the
    unit of change d (feature units) and the scaling from the owner's raw units (its raw bounds;
    d is compared once, in feature units)."""
    privacy = manifest.get("privacy")
    if privacy is None:
        return None
    statement = privacy["statement"]
    mechanism = statement["mechanism"]
    raw = statement.get("raw")
    return {"lower": mechanism["lower"], "upper": mechanism["upper"], "d": mechanism["d"],
            "raw": None if raw is None else {k: v for k, v in raw.items() if k != "d"}}  # d: its own check


def _label_type(classes: Sequence) -> str:
    return "numbers" if all(isinstance(c, int | float) and not isinstance(c, bool) for c in classes) else (
        "strings" if all(isinstance(c, str) for c in classes) else "mixed")


def check_combinable(manifests: Sequence[Mapping[str, Any]], names: Sequence[str], *,
                     disjoint_classes: bool = False) -> None:
    """Raise :class:`IncompatibleSitesError` (one line, naming both sites and the difference)
    unless every site's model can be combined with the first's (module docstring)."""
    if len(manifests) < 2:
        raise IncompatibleSitesError(f"combine needs the model stores of at least two sites, got {len(manifests)}.")
    first, a = manifests[0], names[0]
    for m, b in zip(manifests[1:], names[1:], strict=True):
        def refuse(why: str, b: str = b) -> None:
            raise IncompatibleSitesError(f"cannot combine {b} with {a}: {why}.")

        if m["n_features"] != first["n_features"]:
            refuse(f"{b} has {m['n_features']} features, {a} has {first['n_features']}")
        kinds = {_label_type(first["classes"]), _label_type(m["classes"])}
        if len(kinds) > 1 or "mixed" in kinds:
            refuse(f"their labels are of other types ({b}: {m['classes'][:5]}, {a}: {first['classes'][:5]})")
        mine, theirs = site_unit(first), site_unit(m)
        if (mine is None) != (theirs is None):
            private, plain = (a, b) if theirs is None else (b, a)
            refuse(f"{private} is differentially private and {plain} is not (another unit of privacy: the "
                   "global model would not be DP)")
        if mine is not None:
            if (mine["lower"], mine["upper"], mine["raw"]) != (theirs["lower"], theirs["upper"], theirs["raw"]):
                refuse(f"other public bounds or scaling of the features ({b}: {_bounds(theirs)}; {a}: {_bounds(mine)})")
            if mine["d"] != theirs["d"]:
                refuse(f"another unit of privacy (d = {theirs['d']} at {b}, {mine['d']} at {a})")
        elif m["parameters"].get("bounds") != first["parameters"].get("bounds"):
            refuse(f"other public bounds ({b}: {m['parameters'].get('bounds')}, "
                   f"{a}: {first['parameters'].get('bounds')})")
        if not disjoint_classes and not set(map(str, m["classes"])) & set(map(str, first["classes"])):
            refuse(f"they share no class ({b}: {m['classes'][:5]}, {a}: {first['classes'][:5]}); if each site "
                   "really holds other classes of the same labelling, say so with --disjoint-classes")


def _bounds(unit: dict) -> str:
    raw = unit["raw"]
    scaled = f"[{unit['lower']}, {unit['upper']}]"
    if not raw:
        return scaled
    return f"{scaled} from raw [{raw.get('raw_lower')}, {raw.get('raw_upper')}] ({raw.get('kind')})"


def combine_models(
    sites: Sequence[LocationLike],
    out: LocationLike,
    *,
    storage_options: Options = None,
    disjoint_classes: bool = False,
) -> dict:
    """Write the global model store ``out`` from the sites' model stores ``sites`` (paths or
    URLs read with ``storage_options``); returns its manifest.

    Refused with :class:`IncompatibleSitesError` before anything is written (module docstring);
    FileExistsError if ``out`` exists. The store is committed in one step (renamed into place
    locally; written with its completion marker last on an object store).
    """
    locations = [as_location(s, storage_options) for s in sites]
    target = as_location(out, storage_options)
    if len({str(loc) for loc in locations}) != len(locations):
        raise IncompatibleSitesError("the same model store is named twice: each site counts once.")
    manifests = [read_manifest(loc) for loc in locations]
    check_combinable(manifests, [str(loc) for loc in locations], disjoint_classes=disjoint_classes)
    if target.exists():
        raise FileExistsError(f"{target} exists; choose another path for the global model store.")
    classes = sorted({c for m in manifests for c in m["classes"]})
    code = {c: g for g, c in enumerate(classes)}
    clusters: list[dict] = []
    next_cluster = dict.fromkeys(range(len(classes)), 0)
    with committed_directory(target) as tmp:
        for q, (loc, m) in enumerate(zip(locations, manifests, strict=True)):
            for entry in sorted(m["clusters"], key=lambda e: (e["class"], e["cluster"])):
                g = code[m["classes"][entry["class"]]]
                s = next_cluster[g]
                next_cluster[g] += 1
                info = {**entry, "class": g, "cluster": s, "site": q, "site_class": entry["class"],
                        "site_cluster": entry["cluster"]}
                _copy_cluster(cluster_location(loc, entry["class"], entry["cluster"]), cluster_location(tmp, g, s),
                              info)
                clusters.append({"class": g, "cluster": s, "n_rows": entry["n_rows"]})
        manifest = build_manifest(
            classes, manifests[0]["n_features"], dict(manifests[0]["parameters"]), _privacy(manifests),
            clusters, {"federation": _federation(locations, manifests)},
        )
        write_manifest(tmp, manifest)
    return manifest


def _copy_cluster(source, target, info: dict) -> None:
    """Copy one cluster group, then give it its global ``info`` and completion marker (last)."""
    copy_tree(source, target)
    (target / COMPLETE_FILE).remove()
    group = zarr.open_group(target.zarr_store(), mode="a", zarr_format=3)
    group.attrs["info"] = info
    (target / COMPLETE_FILE).write_json(info)


def _privacy(manifests: Sequence[Mapping[str, Any]]) -> dict | None:
    """The global store's ``privacy``: None (non-private sites), else the first site's statement
    (the unit every site shares) and each site's release."""
    if manifests[0]["privacy"] is None:
        return None
    return {"release_id": None, "statement": manifests[0]["privacy"]["statement"],
            "sites": [m["privacy"] for m in manifests]}


def _federation(locations, manifests) -> dict:
    return {"rule": "argmin over classes of the minimum distance over every site's class models",
            "sites": [{"model": str(loc), "classes": list(m["classes"]), "n_clusters": len(m["clusters"]),
                       "release_id": None if m["privacy"] is None else m["privacy"]["release_id"]}
                      for loc, m in zip(locations, manifests, strict=True)]}


def federation_markdown(manifest: Mapping[str, Any]) -> str:
    """The global store's PRIVACY.md: that no row left a site, and each site's guarantee."""
    from kahm_dask.privacy.statement import PrivacyStatement

    sites = manifest["federation"]["sites"]
    lines = ["# Privacy statement of a federated model", "",
             f"This model store combines the published model stores of {len(sites)} sites by their distances "
             "alone: the global class of a query is the class of the smallest distance over every site's "
             "class models. **No row left a site**: each site trained on its own cluster and published only "
             "its model store; combining them is post-processing of what they published.", ""]
    privacy = manifest["privacy"]
    if privacy is None:
        lines += ["**The sites' models are not differentially private**: each holds its site's private rows; "
                  "keep the global store with the sites' data owners.", ""]
    for q, site in enumerate(sites):
        lines += [f"## Site {q}: {site['model']}", "",
                  f"Classes {site['classes']}, {site['n_clusters']} cluster models."]
        if privacy is not None:
            statement = PrivacyStatement(**{k: v for k, v in privacy["sites"][q]["statement"].items()
                                            if k != "holds"})
            lines += [f"Release {site['release_id']}, recorded in that site's own privacy ledger.", "",
                      statement.to_markdown().replace("## Privacy statement", "### Its guarantee")]
        lines.append("")
    return "\n".join(lines)
