"""LocalHosts: run a :class:`HostGroup` in a background thread or a child process."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from scrapy_hostqueue.testing._server import CONTROL_PREFIX, HostGroup
from scrapy_hostqueue.testing._spec import HostSpec, SpecError, parse_specs
from scrapy_hostqueue.testing._state import HostStats, host_address

logger = logging.getLogger(__name__)

CONTROL_TIMEOUT = 10.0


class ControlError(RuntimeError):
    """A control request to a test server failed (``reason``: the server's word)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


def control_request(
    hostname: str,
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    timeout: float = CONTROL_TIMEOUT,
) -> Any:
    """Send a ``/_hostqueue/`` control request; return its decoded JSON answer.

    Plain ``http.client``: proxy environment variables must not reroute loopback
    control traffic.
    """
    connection = http.client.HTTPConnection(hostname, port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload else {}
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        data = response.read()
    except OSError as error:
        raise ControlError(f"cannot reach http://{hostname}:{port}: {error}") from None
    finally:
        connection.close()
    try:
        decoded = json.loads(data)
    except ValueError:
        raise ControlError(
            f"http://{hostname}:{port}{path} did not answer JSON "
            f"(status {response.status}): is it a scrapy_hostqueue test host?"
        ) from None
    if response.status != 200:
        reason = decoded.get("error") if isinstance(decoded, dict) else None
        reason = str(reason or f"status {response.status}")
        raise ControlError(f"http://{hostname}:{port}{path}: {reason}", reason)
    return decoded


class _Backend(Protocol):
    def start(self, timeout: float) -> list[int]: ...
    def stop(self) -> None: ...
    def stats(self, index: int | None, arrivals: bool) -> list[HostStats]: ...
    def reset(self) -> None: ...
    def set_spec(self, index: int, spec: HostSpec) -> None: ...


class _ThreadBackend:
    """The server loop in a daemon thread of this process."""

    def __init__(self, specs: list[HostSpec], offset: int) -> None:
        self._group = HostGroup(specs, offset=offset)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hostqueue-local-hosts", daemon=True)

    def start(self, timeout: float) -> list[int]:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"local hosts did not start within {timeout:g} s")
        if self._error is not None:
            self._thread.join(timeout)
            raise self._error
        return [state.port for state in self._group.states]

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        try:
            await self._group.start()
        except BaseException as error:
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await self._group.close()

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and self._thread.is_alive():
            # The loop may have just ended on its own; there is then nothing to stop.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        self._thread.join(CONTROL_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError("the local hosts thread did not stop")

    def stats(self, index: int | None, arrivals: bool) -> list[HostStats]:
        states = self._group.states if index is None else [self._group.states[index]]
        return [state.snapshot(arrivals=arrivals) for state in states]

    def reset(self) -> None:
        for state in self._group.states:
            state.reset()

    def set_spec(self, index: int, spec: HostSpec) -> None:
        assert self._loop is not None

        async def apply() -> None:
            self._group.set_spec(index, spec)

        asyncio.run_coroutine_threadsafe(apply(), self._loop).result(CONTROL_TIMEOUT)


class _ProcessBackend:
    """The server in a child process (``python -m scrapy_hostqueue.testing._child``).

    The child reads its specs as one JSON line on stdin, answers one JSON line on
    stdout, and serves until its stdin closes, so it also ends if this process dies.
    """

    def __init__(self, specs: list[HostSpec], offset: int) -> None:
        self._specs = specs
        self._offset = offset
        self._process: subprocess.Popen[bytes] | None = None
        self._control_port = 0

    def start(self, timeout: float) -> list[int]:
        env = dict(os.environ)
        # The child must import this very package, installed or not.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        process = subprocess.Popen(
            [sys.executable, "-m", "scrapy_hostqueue.testing._child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._process = process
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            request = {
                "specs": [spec.to_dict() for spec in self._specs],
                "offset": self._offset,
            }
            process.stdin.write(json.dumps(request).encode() + b"\n")
            process.stdin.flush()
            with selectors.DefaultSelector() as selector:
                selector.register(process.stdout, selectors.EVENT_READ)
                if not selector.select(timeout):
                    raise TimeoutError(
                        f"the local hosts process did not start within {timeout:g} s"
                    )
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(
                    f"the local hosts process exited with code {process.wait(timeout)}"
                )
            answer = json.loads(line)
            if "error" in answer:
                raise OSError(answer["error"])
        except BaseException:
            self.stop()
            raise
        self._control_port = int(answer["control_port"])
        return [int(port) for port in answer["ports"]]

    def stop(self) -> None:
        process = self._process
        if process is None:
            return
        self._process = None
        assert process.stdin is not None
        assert process.stdout is not None
        with contextlib.suppress(OSError):  # the child may be gone already
            process.stdin.close()
        try:
            process.wait(CONTROL_TIMEOUT)
        except subprocess.TimeoutExpired:
            logger.warning("local hosts process %d ignored EOF; terminating", process.pid)
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        finally:
            process.stdout.close()

    def _control(self, method: str, action: str, query: str, body: Any = None) -> Any:
        return control_request(
            "127.0.0.1", self._control_port, method, f"{CONTROL_PREFIX}{action}?{query}", body
        )

    def stats(self, index: int | None, arrivals: bool) -> list[HostStats]:
        which = "all" if index is None else str(index)
        query = f"host={which}&arrivals={int(arrivals)}"
        data = self._control("GET", "stats", query)
        items = data if index is None else [data]
        return [HostStats.from_dict(item) for item in items]

    def reset(self) -> None:
        self._control("POST", "reset", "host=all")

    def set_spec(self, index: int, spec: HostSpec) -> None:
        try:
            self._control("POST", "spec", f"host={index}", spec.to_dict())
        except ControlError as error:
            raise SpecError(error.reason) from None


class LocalHosts:
    """A set of local HTTP/1.1 test hosts, one loopback address each.

    Host ``i`` listens on ``127.0.0.{i+1}`` (then ``127.0.1.1`` ... past 254 hosts;
    ``offset`` shifts the range) on a port of its own. ``process=False`` serves from
    a background thread with its own event loop; ``process=True`` from a child
    process so the server does not share the crawler's CPU and GIL (stats then come
    over a control listener). Use as a context manager or call :meth:`start` and
    :meth:`stop`. ``specs`` is a list of :class:`HostSpec` or a spec string.

    Every method is synchronous and may block briefly (a lock in thread mode, a
    loopback HTTP request in process mode). An answer is counted as served
    (``served``, ``statuses``, ``pages``) before its last bytes go out, so a client
    that has read it finds it counted; it stays in flight until its bytes are all
    written: call :meth:`wait_idle` before asserting on ``in_flight``,
    ``requests`` or ``resets`` right after the last response.
    """

    def __init__(
        self,
        specs: Iterable[HostSpec] | str,
        *,
        process: bool = False,
        offset: int = 0,
        start_timeout: float = 15.0,
    ) -> None:
        spec_list = parse_specs(specs) if isinstance(specs, str) else list(specs)
        if not spec_list:
            raise SpecError("LocalHosts needs at least one host spec")
        for spec in spec_list:
            if not isinstance(spec, HostSpec):
                raise SpecError(f"expected HostSpec objects, got {spec!r}")
        host_address(offset)
        host_address(offset + len(spec_list) - 1)
        self.process = process
        self.offset = offset
        self._start_timeout = start_timeout
        self._specs = spec_list
        self._hostnames = [host_address(offset + i) for i in range(len(spec_list))]
        self._ports: list[int] = []
        self._backend: _Backend | None = None

    # --- lifecycle --------------------------------------------------------

    def start(self) -> LocalHosts:
        """Bind every host and start serving; returns self."""
        if self._backend is not None:
            raise RuntimeError("LocalHosts already started")
        backend: _Backend = (
            _ProcessBackend(self._specs, self.offset)
            if self.process
            else _ThreadBackend(self._specs, self.offset)
        )
        self._ports = backend.start(self._start_timeout)
        self._backend = backend
        logger.debug("local hosts up: %s", ", ".join(self.url(i) for i in range(len(self))))
        return self

    def stop(self) -> None:
        """Close every listener and connection and free the ports (idempotent)."""
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.stop()

    def __enter__(self) -> LocalHosts:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._backend is not None

    def _running(self) -> _Backend:
        if self._backend is None:
            raise RuntimeError("LocalHosts is not running: call start() first")
        return self._backend

    def __len__(self) -> int:
        return len(self._specs)

    # --- addresses --------------------------------------------------------

    @property
    def hostnames(self) -> list[str]:
        return list(self._hostnames)

    @property
    def ports(self) -> list[int]:
        self._running()
        return list(self._ports)

    @property
    def specs(self) -> list[HostSpec]:
        """The current spec of every host (including :meth:`set_spec` changes)."""
        return list(self._specs)

    def netloc(self, index: int) -> str:
        self._running()
        return f"{self._hostnames[index]}:{self._ports[index]}"

    def url(self, index: int, path: str = "/") -> str:
        """``http://127.0.0.{index+1}:PORT`` + path."""
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path!r}")
        return f"http://{self.netloc(index)}{path}"

    def page_url(self, index: int, page: int) -> str:
        return self.url(index, f"/page/{page}")

    def robots_url(self, index: int) -> str:
        return self.url(index, "/robots.txt")

    def stats_url(self, index: int) -> str:
        return self.url(index, f"{CONTROL_PREFIX}stats")

    def start_urls(self, index: int, count: int) -> list[str]:
        """``count`` distinct page URLs on host ``index`` (pages 0 .. count-1)."""
        pages = self._specs[index].pages
        if count < 0 or (pages is not None and count > pages):
            raise ValueError(f"host {index} cannot give {count} distinct start pages")
        return [self.page_url(index, page) for page in range(count)]

    # --- stats and control --------------------------------------------------

    def stats(self, index: int, *, arrivals: bool = True) -> HostStats:
        """Return a snapshot of host ``index``'s counters."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"host index {index} out of range")
        return self._running().stats(index % len(self), arrivals)[0]

    def all_stats(self, *, arrivals: bool = True) -> list[HostStats]:
        return self._running().stats(None, arrivals)

    def reset(self) -> None:
        """Zero every counter of every host (requests in flight stay counted)."""
        self._running().reset()

    def set_spec(self, index: int, spec: HostSpec) -> None:
        """Change host ``index``'s behaviour now; waiting requests see the new latency.

        ``refuse`` cannot change at run time.
        """
        if not isinstance(spec, HostSpec):
            raise SpecError(f"expected a HostSpec, got {spec!r}")
        self._running().set_spec(index, spec)
        self._specs[index] = spec

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Block until no host has a page request in flight (or raise TimeoutError)."""
        deadline = time.monotonic() + timeout
        while any(stats.in_flight for stats in self.all_stats(arrivals=False)):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"hosts still busy after {timeout:g} s")
            time.sleep(0.01)
