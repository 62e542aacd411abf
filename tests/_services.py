"""Real cluster services for the tests: a SLURM controller and node, an sshd on loopback.

CI (``.ci/run``, as root) installs Debian's ``slurm-wlm``, ``munge`` and ``openssh-server`` and
starts SLURM with ``.ci/slurm.sh``; the fixtures here only check that it answers, and start an
``sshd`` of their own (a throwaway host key and client key pair, loopback only, a free port).
Where a service is missing, a test skips with the reason, or fails where services are required
(``KAHM_DASK_REQUIRE_SERVICES``, set in CI: :func:`tests._kit.service_unavailable`).

:func:`report_service_time` appends a line to ``$KAHM_DASK_SERVICE_TIMES`` (set by ``.ci/run``,
which prints the file at the end): the times of a run through each service, beside the
LocalCluster's for the same run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests._kit import free_port, service_unavailable, wait_for

__all__ = ["SERVICE_TIMES_ENV", "report_service_time", "require_slurm", "slurm_jobs", "SSHD", "sshd"]

SERVICE_TIMES_ENV = "KAHM_DASK_SERVICE_TIMES"
#: Environment an SSH session passes to the workers it starts (sshd starts sessions afresh).
_PASSED_ENV = ("PYTHONPATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def report_service_time(line: str) -> None:
    """Print ``line`` and append it to ``$KAHM_DASK_SERVICE_TIMES`` if set."""
    print(line)
    path = os.environ.get(SERVICE_TIMES_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def _run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def require_slurm() -> None:
    """Skip (or fail in CI) unless a SLURM controller answers with a usable node."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        service_unavailable("SLURM is not installed (CI: apt-get install slurm-wlm munge; .ci/slurm.sh start DIR)")
    states = _run(["sinfo", "-h", "-o", "%t"])
    if states.returncode != 0 or not any(s.strip() in ("idle", "mix", "alloc") for s in states.stdout.split()):
        service_unavailable(f"no SLURM node is up (sinfo: {(states.stdout + states.stderr).strip()!r}; "
                            "as root: bash .ci/slurm.sh start DIR)")


def slurm_jobs(name: str = "dask-worker") -> list[str]:
    """Ids of this user's SLURM jobs named ``name`` still queued or running."""
    out = _run(["squeue", "-h", "--user", os.environ.get("USER") or _whoami(), "-n", name, "-o", "%i"])
    return [j for j in out.stdout.split() if j]


def _whoami() -> str:
    return _run(["id", "-un"]).stdout.strip()


@dataclass(frozen=True)
class SSHD:
    """An sshd on 127.0.0.1:``port`` accepting ``user`` with the key ``client_key``."""

    port: int
    user: str
    client_key: Path

    def connect_options(self) -> dict:
        """The ``connect_options`` of a kahm-dask ``ssh`` cluster file for this server."""
        return {"port": self.port, "username": self.user, "client_keys": [str(self.client_key)],
                "known_hosts": None}


@contextmanager
def sshd(directory: Path) -> Iterator[SSHD]:
    """An sshd of this test's own on loopback: a throwaway host key, one client key pair (no
    passphrase) authorised for the current user, no passwords; stopped on exit."""
    binary = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    keygen = shutil.which("ssh-keygen")
    if binary is None or keygen is None:
        service_unavailable("no sshd (CI: apt-get install openssh-server)")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    host_key, client_key = directory / "host_ed25519", directory / "client_ed25519"
    for key in (host_key, client_key):
        _run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
    authorized = directory / "authorized_keys"
    authorized.write_text((client_key.with_suffix(".pub")).read_text())
    authorized.chmod(0o600)
    user = _whoami()
    port = free_port()
    config = directory / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"AuthorizedKeysFile {authorized}",
        f"PidFile {directory / 'sshd.pid'}", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no",
        # the workers inherit no environment from the client: pass the test's PATH and PYTHONPATH through
        # and this machine's OpenBLAS kernel settings, so the workers compute bit for bit as here
        "PermitUserEnvironment yes", "SetEnv " + " ".join(f"{k}={os.environ.get(k, '')}" for k in _PASSED_ENV
                                                           if os.environ.get(k) or k == "PYTHONPATH"),
        "Subsystem sftp internal-sftp", "",
    ]))
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory of Debian's sshd
    check = _run([binary, "-t", "-f", str(config)])
    if check.returncode != 0:
        service_unavailable(f"sshd refuses the test's config: {check.stderr.strip()}")
    proc = subprocess.Popen([binary, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=open(directory / "sshd.log", "w"))  # noqa: SIM115 - closed with the process
    try:
        def listening() -> bool:
            if proc.poll() is not None:
                service_unavailable(f"sshd exited: {(directory / 'sshd.log').read_text()[-500:]}")
            return _run(["ssh-keyscan", "-p", str(port), "127.0.0.1"], timeout=5).returncode == 0
        t0 = time.perf_counter()
        wait_for(listening, 30, "sshd did not listen", interval=0.2)
        report_service_time(f"sshd: listening after {time.perf_counter() - t0:.2f} s")
        yield SSHD(port, user, client_key)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
