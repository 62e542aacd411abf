"""TLS for the Dask cluster: the ``tls`` settings and the one place that builds a
``distributed.security.Security`` from them.

A Dask scheduler runs whatever code a connected client sends, and the private rows live on its
workers: whoever reaches the scheduler's port can read them. With mutual TLS (``tls://``
addresses) the scheduler, the workers and the clients prove who they are with certificates
signed by the cluster's own certificate authority, and everything they exchange is encrypted;
a client without such a certificate is refused before it can send anything.

The ``tls`` mapping (the ``cluster.tls`` section of a pipeline file, ``tls`` in a ``kind:
remote`` or ``kind: local`` cluster config file, the CLI's ``--tls-*`` options, the
estimator's ``security`` parameter) has the keys

* ``ca_file``: the certificate authority's certificate (PEM), which every peer must be signed by;
* ``cert``: this side's certificate (PEM), signed by that authority;
* ``key``: its private key (PEM); may be omitted when ``cert`` holds the key too;
* ``require_encryption`` (default true): refuse any unencrypted connection.

Files are checked when the settings are built: they must exist and load as a certificate
chain (a wrong path or a key that does not match the certificate is named at once, not at the
first connection). :func:`check_address` refuses the two silent mistakes: a ``tls://`` address
without TLS settings, and TLS settings with an address that is not ``tls://`` (the user would
believe the connection is protected when it is not). :func:`warn_unencrypted` warns about a
scheduler address without TLS. Relative paths are relative to the current working directory, as
every path of the configs.
"""


from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from kahm_dask.pipeline.config.sections import ALL_ROLES, TLS_PROTOCOL, TLSConfig, check_address
from kahm_dask.privacy.randomness import PrivacyLeakWarning

if TYPE_CHECKING:  # imported where used: loading a config does not import distributed
    from distributed.security import Security

__all__ = ["TLS_PROTOCOL", "ALL_ROLES", "check_address", "to_security", "warn_unencrypted"]


def to_security(tls: TLSConfig, roles: tuple[str, ...] = ("client",)) -> Security:
    """The ``distributed.security.Security`` of ``tls`` for the given roles: ``("client",)``
    to connect to a scheduler, :data:`ALL_ROLES` for a cluster started here (its scheduler and
    workers present the same certificate)."""
    from distributed.security import Security

    files: dict[str, Any] = {}
    for role in roles:
        files[f"tls_{role}_cert"] = str(tls.cert)
        files[f"tls_{role}_key"] = None if tls.key is None else str(tls.key)
    return Security(tls_ca_file=str(tls.ca_file), require_encryption=tls.require_encryption, **files)


def warn_unencrypted(address: str, *, stacklevel: int = 2) -> None:
    """Warn (:class:`~kahm_dask.privacy.randomness.PrivacyLeakWarning`) when the scheduler
    ``address`` is not ``tls://``: the private rows would cross the network unencrypted, and the
    scheduler would take any client, which can read them from the workers. In-process
    (``inproc://``) addresses do not leave the process and do not warn."""
    if address.startswith((TLS_PROTOCOL, "inproc://")):
        return
    warnings.warn(
        f"the Dask scheduler {address} is reached without TLS: the private rows travel unencrypted, and any "
        "client that reaches the scheduler can read them from its workers. Use its tls:// address with "
        "--tls-ca-file, --tls-cert and --tls-key (cluster.tls in a pipeline file; docs/usage.md, section TLS).",
        PrivacyLeakWarning,
        stacklevel=stacklevel + 1,
    )
