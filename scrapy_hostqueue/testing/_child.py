"""Entry point of the server process behind ``LocalHosts(..., process=True)``.

Protocol: one JSON line on stdin ``{"specs": [HostSpec dicts], "offset": N}``; one
JSON line on stdout ``{"ports": [...], "control_port": P}`` (or ``{"error": msg}``);
then serve until stdin reaches EOF or SIGTERM arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from scrapy_hostqueue.testing._server import HostGroup
from scrapy_hostqueue.testing._spec import HostSpec


def _answer(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


async def _serve(specs: list[HostSpec], offset: int) -> int:
    loop = asyncio.get_running_loop()
    group = HostGroup(specs, offset=offset, control=True)
    try:
        await group.start()
    except OSError as error:
        _answer({"error": f"cannot bind the local hosts: {error}"})
        return 1
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    stdin = sys.stdin.fileno()

    def on_stdin() -> None:
        # The parent holds the other end: EOF means it stopped us or died.
        if not os.read(stdin, 4096):
            loop.remove_reader(stdin)
            stop.set()

    loop.add_reader(stdin, on_stdin)
    _answer(
        {
            "ports": [state.port for state in group.states],
            "control_port": group.control_port,
        }
    )
    try:
        await stop.wait()
    finally:
        await group.close()
    return 0


def main() -> int:
    # Ctrl-C in a terminal reaches the whole process group; the parent decides
    # when this server stops (by closing our stdin).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    line = sys.stdin.buffer.readline()
    try:
        request = json.loads(line)
        specs = [HostSpec.from_dict(item) for item in request["specs"]]
        offset = int(request.get("offset", 0))
    except (ValueError, KeyError, TypeError) as error:
        _answer({"error": f"bad start request: {error}"})
        return 2
    return asyncio.run(_serve(specs, offset))


if __name__ == "__main__":
    sys.exit(main())
