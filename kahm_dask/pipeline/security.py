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
believe the connection is protected when it is not). Relative paths are relative to the
current working directory, as every path of the configs.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kahm_dask.pipeline.config import ConfigError, Section, invalid_value

if TYPE_CHECKING:  # imported where used: loading a config does not import distributed
    from distributed.security import Security

__all__ = [
    "TLS_PROTOCOL",
    "ALL_ROLES",
    "TLSConfig",
    "ClusterTLSConfig",
    "check_address",
    "to_security",
    "as_security",
]

TLS_PROTOCOL = "tls://"
#: The roles of a cluster kahm-dask starts itself: it is the client, the scheduler and the workers.
ALL_ROLES = ("client", "scheduler", "worker")


def _no_password() -> bytes:
    """The password callback of the check: an encrypted key fails instead of prompting."""
    return b""


@dataclass(frozen=True, kw_only=True)
class TLSConfig(Section):
    """``tls``: the certificate authority, this side's certificate and key (PEM files).

    ``key`` may be None when the ``cert`` file holds the private key too. ``require_encryption``
    refuses any unencrypted connection (keep it true). See the module docstring.
    """

    _key: ClassVar[str] = "tls"
    ca_file: Path
    cert: Path
    key: Path | None = None
    require_encryption: bool = True

    def _validate(self) -> None:
        for name in ("ca_file", "cert", "key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise invalid_value(self._name(name), "no such file", str(path))
        self._check_loads()

    def _name(self, field_name: str) -> str:
        return f"{self._key}.{field_name}"

    def _check_loads(self) -> None:
        """Load the files as Dask will (a certificate chain, then the CA), naming the key at fault."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            context.load_cert_chain(self.cert, self.key, password=_no_password)
        except (ssl.SSLError, OSError) as exc:
            which = "cert" if self.key is None else "key"
            reason = (f"the certificate and its private key do not load ({exc.__class__.__name__}: {exc}); "
                      "give PEM files, the key unencrypted and matching the certificate")
            if self.key is None:
                reason += f", and '{self._name('key')}' unless '{self._name('cert')}' holds the key"
            raise invalid_value(self._name(which), reason, str(getattr(self, which))) from None
        try:
            context.load_verify_locations(cafile=self.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise invalid_value(self._name("ca_file"), f"not a PEM CA certificate ({exc})",
                                str(self.ca_file)) from None


@dataclass(frozen=True, kw_only=True)
class ClusterTLSConfig(TLSConfig):
    """``cluster.tls`` of a pipeline file (the same keys as :class:`TLSConfig`)."""

    _key: ClassVar[str] = "cluster.tls"


def check_address(address: str, has_tls: bool, *, address_key: str, tls_key: str) -> None:
    """Raise :class:`~kahm_dask.pipeline.config.ConfigError` unless the scheduler ``address``
    and the presence of TLS settings agree: ``tls://`` needs them, any other protocol refuses
    them. ``address_key`` and ``tls_key`` name the two settings in the message."""
    is_tls = address.startswith(TLS_PROTOCOL)
    if is_tls and not has_tls:
        raise ConfigError(
            f"missing '{tls_key}' for the tls:// address '{address_key}'",
            f": {address!r} needs TLS settings (ca_file, cert and key) to prove this client to the "
            f"scheduler; give '{tls_key}', or the scheduler's tcp:// address if it does not use TLS",
            key=tls_key,
        )
    if has_tls and not is_tls:
        raise ConfigError(
            f"'{tls_key}' is given but '{address_key}' is not a tls:// address",
            f": {address!r} would be neither encrypted nor authenticated, whatever '{tls_key}' says; "
            f"use the scheduler's tls:// address (tls://host:port), or remove '{tls_key}'",
            key=address_key,
        )


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


def as_security(value: Security | Mapping[str, Any] | None, name: str = "security") -> Security | None:
    """A ``Security`` from a ``Security`` (unchanged), a mapping of the :class:`TLSConfig`
    keys (validated; errors name ``name``), or None."""
    from distributed.security import Security

    if value is None or isinstance(value, Security):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a distributed.security.Security, a mapping of "
                        f"ca_file, cert, key and require_encryption, or None; got {type(value).__name__}.")
    try:
        return to_security(TLSConfig.from_mapping(value))
    except ConfigError as exc:
        raise exc.located(f"the {name} parameter") from None
