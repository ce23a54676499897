#!/usr/bin/env python3
"""Run a command with a real, throwaway PostgreSQL, Redis and S3 store, for the test suite.

    python deploy/dev/test_services.py run -- make check-all

If ``TAU_TEST_DATABASE_URL`` / ``TAU_TEST_REDIS_URL`` name servers that answer, those are
used. Otherwise fresh instances are started on 127.0.0.1 on free ports, with random
passwords, in a temporary directory that is removed afterwards (also on Ctrl-C). Missing
server binaries are installed from Debian's packages.

The S3 store is SeaweedFS (``weed server -s3``: master, volume server, filer and S3 gateway in
one process, every port on 127.0.0.1), built from the Go module proxy by
``deploy/cluster/controlplane.py build weed`` (``make test`` does) into
``~/.cache/taugrid/weed-<version>/``; it gets an access key and secret made for this run and
one bucket, given to the command as ``TAU_TEST_S3_ENDPOINT``, ``TAU_TEST_S3_ACCESS_KEY``,
``TAU_TEST_S3_SECRET_KEY`` and ``TAU_TEST_S3_BUCKET`` (or those, set already, are passed on
as they are), and its master as ``TAU_TEST_S3_SEAWEEDFS_MASTER`` (the benchmark asks it to
compact between rounds). Without the binary nothing is started and ``TAU_TEST_S3_MISSING``
says how to build it: the tests that need S3 fail with that message.

Standard library only: this runs before anything else is known to work.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

READY_TIMEOUT_SECONDS = 60
VERSIONS_FILE = Path(__file__).resolve().parents[1] / "cluster" / "versions.env"


def log(message: str) -> None:
    print(f"[test-services] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def wait_until(
    what: str, ready: Callable[[], bool], process: subprocess.Popen[bytes] | None
) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if ready():
            return
        if process is not None and process.poll() is not None:
            raise SystemExit(f"{what} exited with code {process.returncode} before it was ready")
        time.sleep(0.2)
    raise SystemExit(f"{what} did not become ready within {READY_TIMEOUT_SECONDS}s")


def apt_install(packages: list[str]) -> None:
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None:
            raise SystemExit(
                f"need the Debian packages {' '.join(packages)}; install them "
                "(apt-get install ...) or run as root"
            )
        prefix = [sudo]
    else:
        prefix = []
    log(f"installing Debian packages: {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*prefix, "apt-get", "update", "-q"], check=True, env=env)  # noqa: S603
    subprocess.run(  # noqa: S603
        [*prefix, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        check=True,
        env=env,
    )


def find_postgres_bin() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def weed_binary() -> Path:
    """Where ``controlplane.py build weed`` puts SeaweedFS: the cache directory named by the
    version pinned in deploy/cluster/versions.env (read here as the tool reads it)."""
    versions = {}
    for line in VERSIONS_FILE.read_text(encoding="utf-8").splitlines():
        key, equals, value = line.strip().partition("=")
        if equals and not key.startswith("#"):
            versions[key.strip()] = value.strip()
    cache = Path(os.environ.get("TAUGRID_CACHE_DIR") or Path.home() / ".cache" / "taugrid")
    return cache / f"weed-{versions['SEAWEEDFS_VERSION']}" / "bin" / "weed"


def s3_answers(endpoint: str) -> bool:
    """The S3 gateway answers (an unsigned request gets an S3 error: it is up)."""
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=2):  # noqa: S310 - our loopback
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def create_bucket(weed: Path, ports: dict[str, int], bucket: str, directory: Path) -> None:
    """The bucket, made by SeaweedFS's own shell (no S3 client here: standard library only).
    Its addresses name the gRPC ports too (``host:port.grpcPort``): they are not the
    defaults."""
    master = f"127.0.0.1:{ports['master']}.{ports['master.port.grpc']}"
    filer = f"127.0.0.1:{ports['filer']}.{ports['filer.port.grpc']}"
    done = subprocess.run(  # noqa: S603
        [str(weed), "shell", f"-master={master}", f"-filer={filer}"],
        input=f"s3.bucket.create -name {bucket}\n",
        capture_output=True,
        text=True,
        cwd=directory,
        timeout=READY_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0 or "error" in done.stdout.lower():
        raise SystemExit(
            f"SeaweedFS did not create the bucket {bucket}: {done.stdout}{done.stderr}"
        )


class Services:
    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="taugrid-test-services-"))
        self.stops: list[Callable[[], None]] = []
        self.env: dict[str, str] = {}

    # --- PostgreSQL ------------------------------------------------------------------------
    def start_postgres(self) -> None:
        given = os.environ.get("TAU_TEST_DATABASE_URL")
        if given:
            log("using PostgreSQL from TAU_TEST_DATABASE_URL")
            self.env["DATABASE_URL"] = given
            return
        bin_dir = find_postgres_bin()
        if bin_dir is None:
            apt_install(["postgresql"])
            bin_dir = find_postgres_bin()
            if bin_dir is None:
                raise SystemExit("PostgreSQL was installed but initdb cannot be found")
        data = self.tmp / "pgdata"
        socket_dir = self.tmp / "pgsocket"
        socket_dir.mkdir()
        password = secrets.token_urlsafe(16)
        pwfile = self.tmp / "pgpass"
        pwfile.write_text(password + "\n", encoding="utf-8")
        # PostgreSQL refuses to run as root; run it as the postgres user in that case.
        run_as: list[str] = []
        if os.geteuid() == 0:
            user = "postgres"
            try:
                account = pwd.getpwnam(user)
            except KeyError:
                raise SystemExit("running as root needs a 'postgres' system user") from None
            for path in (self.tmp, socket_dir, pwfile):
                os.chown(path, account.pw_uid, account.pw_gid)
            run_as = ["runuser", "-u", user, "--"]
        subprocess.run(  # noqa: S603
            [
                *run_as,
                str(bin_dir / "initdb"),
                "--pgdata",
                str(data),
                "--username",
                "taugrid",
                "--pwfile",
                str(pwfile),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        port = free_port()
        # Durability is irrelevant for a throwaway test database; speed is not.
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={socket_dir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        logfile = self.tmp / "postgres.log"
        subprocess.run(  # noqa: S603
            [
                *run_as,
                str(bin_dir / "pg_ctl"),
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(logfile),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )

        def stop() -> None:
            subprocess.run(  # noqa: S603
                [
                    *run_as,
                    str(bin_dir / "pg_ctl"),
                    "stop",
                    "-D",
                    str(data),
                    "-m",
                    "immediate",
                    "-w",
                ],
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        self.stops.append(stop)
        wait_until("PostgreSQL", lambda: port_answers("127.0.0.1", port), None)
        self.env["DATABASE_URL"] = f"postgres://taugrid:{password}@127.0.0.1:{port}/postgres"
        log(f"PostgreSQL {bin_dir.parent.name} on 127.0.0.1:{port}")

    # --- Redis -----------------------------------------------------------------------------
    def start_redis(self) -> None:
        given = os.environ.get("TAU_TEST_REDIS_URL")
        if given:
            log("using Redis from TAU_TEST_REDIS_URL")
            self.env["REDIS_URL"] = given
            self.env["CELERY_BROKER_URL"] = given
            return
        server = shutil.which("redis-server")
        if server is None:
            apt_install(["redis-server"])
            server = shutil.which("redis-server")
            if server is None:
                raise SystemExit("redis-server was installed but cannot be found")
        port = free_port()
        password = secrets.token_urlsafe(16)
        config = self.tmp / "redis.conf"
        config.write_text(
            f'bind 127.0.0.1\nport {port}\nrequirepass {password}\nsave ""\nappendonly no\n'
            f"dir {self.tmp}\nprotected-mode yes\n",
            encoding="utf-8",
        )
        config.chmod(0o600)
        process = subprocess.Popen(  # noqa: S603
            [server, str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )

        def stop() -> None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

        self.stops.append(stop)
        wait_until("Redis", lambda: port_answers("127.0.0.1", port), process)
        url = f"redis://default:{password}@127.0.0.1:{port}/0"
        self.env["REDIS_URL"] = url
        self.env["CELERY_BROKER_URL"] = url
        log(f"Redis on 127.0.0.1:{port}")

    # --- S3 (SeaweedFS) ----------------------------------------------------------------------
    def start_s3(self) -> None:
        if os.environ.get("TAU_TEST_S3_ENDPOINT"):
            log("using the S3 store from TAU_TEST_S3_ENDPOINT")
            return
        weed = weed_binary()
        if not weed.is_file():
            self.env["TAU_TEST_S3_MISSING"] = (
                f"SeaweedFS is not built ({weed} is missing): run `make test`, or "
                "`.venv/bin/python deploy/cluster/controlplane.py build weed` (minutes, once)"
            )
            log(self.env["TAU_TEST_S3_MISSING"] + "; the tests that need S3 will fail")
            return
        started = time.monotonic()
        directory = self.tmp / "seaweedfs"
        directory.mkdir()
        access_key = "tau" + secrets.token_hex(8)
        secret_key = secrets.token_urlsafe(30)
        identities = {
            "identities": [
                {
                    "name": "taugrid-tests",
                    "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        config = directory / "s3.json"
        config.write_text(json.dumps(identities), encoding="utf-8")
        config.chmod(0o600)
        ports = {
            name: free_port()
            for name in (
                "master",
                "master.port.grpc",
                "volume",
                "volume.port.grpc",
                "filer",
                "filer.port.grpc",
                "s3",
                "s3.port.grpc",
            )
        }
        # Every listener on loopback, every port chosen here (grpc ports would otherwise be
        # http + 10000, and the Iceberg and Lance ports fixed), no telemetry, and small volumes
        # (the data folder holds only what the tests write; deleted objects' space comes back
        # only when SeaweedFS compacts, so a benchmark's rounds add up).
        logs = directory / "logs"
        logs.mkdir()
        command = [
            str(weed),
            f"-logdir={logs}",  # its log files, else a few more in /tmp at every start
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={directory}",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={ports['master.port.grpc']}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=256",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={ports['volume.port.grpc']}",
            "-volume.max=100",  # slots, not space: a volume file grows as it is written
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={ports['filer.port.grpc']}",
            f"-filer.localSocket={directory / 'filer.sock'}",
            "-s3",
            f"-s3.port={ports['s3']}",
            f"-s3.port.grpc={ports['s3.port.grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={directory / 's3.sock'}",
            f"-s3.config={config}",
        ]
        logfile = (directory / "weed.log").open("wb")
        process = subprocess.Popen(  # noqa: S603
            command, stdout=logfile, stderr=subprocess.STDOUT, cwd=directory
        )

        def stop() -> None:
            # Throwaway data: a few seconds of graceful shutdown, then no more.
            process.terminate()
            try:
                process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            logfile.close()

        self.stops.append(stop)
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        bucket = "taugrid-tests"
        wait_until("SeaweedFS", lambda: s3_answers(endpoint), process)
        create_bucket(weed, ports, bucket, directory)
        self.env.update(
            TAU_TEST_S3_ENDPOINT=endpoint,
            TAU_TEST_S3_ACCESS_KEY=access_key,
            TAU_TEST_S3_SECRET_KEY=secret_key,
            TAU_TEST_S3_BUCKET=bucket,
            TAU_TEST_S3_SEAWEEDFS_MASTER=f"http://127.0.0.1:{ports['master']}",
        )
        log(
            f"SeaweedFS S3 on {endpoint} (bucket {bucket}), "
            f"ready in {time.monotonic() - started:.1f} s"
        )

    def stop_all(self) -> None:
        for stop in reversed(self.stops):
            try:
                stop()
            except Exception as exc:  # keep stopping the others
                log(f"while stopping: {exc}")
        self.stops.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)


def run(command: list[str]) -> int:
    services = Services()

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        services.start_postgres()
        services.start_redis()
        services.start_s3()
        env = {**os.environ, **services.env, "TAU_TEST_SERVICES": "1"}
        return subprocess.call(command, env=env)  # noqa: S603
    except KeyboardInterrupt:
        return 130
    finally:
        services.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="action", required=True)
    run_parser = sub.add_parser("run", help="run a command with PostgreSQL, Redis and S3")
    run_parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = (
        [part for part in args.command if part != "--"]
        if args.command[:1] == ["--"]
        else args.command
    )
    if not command:
        parser.error("give the command to run after --")
    return run(command)


if __name__ == "__main__":
    sys.exit(main())
