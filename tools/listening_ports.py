#!/usr/bin/env python3
"""The gate's last check: it leaves no new listening TCP port behind (``make test``).

``save FILE`` writes this network namespace's LISTEN sockets (address and port, IPv4 and IPv6)
to FILE; ``check FILE`` compares the current ones with it and exits 1 naming each new one with
the processes that hold it (a daemon a package install started, a server a test did not stop).
Only LISTEN sockets count, so client connections and their ephemeral ports never do; a new
listener that goes within ``GRACE_S`` (a server still stopping, a short test of someone else's
on a shared machine) is not reported. Read from /proc (Linux): elsewhere the check says it
cannot look and passes. The standard library only: it runs on the system Python, before and
after the gate's virtualenv exists.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from pathlib import Path

GRACE_S = 10.0
POLL_S = 0.5
LISTEN = "0A"  # the TCP state column of /proc/net/tcp
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))

Listener = tuple[str, int]  # (address, port)


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address: network-order bytes printed as 32-bit words in host byte order."""
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    return str(address) if address.version == 4 else f"[{address}]"


def listeners() -> dict[Listener, set[str]]:
    """Every LISTEN socket: (address, port) -> the socket inodes behind it."""
    found: dict[Listener, set[str]] = {}
    for table in TABLES:
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            address, port = fields[1].split(":")
            found.setdefault((_address(address), int(port, 16)), set()).add(fields[9])
    return found


def owners(inodes: set[str]) -> list[str]:
    """The processes holding any of these sockets, as ``pid command line``."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    found = []
    for pid in sorted((entry for entry in os.listdir("/proc") if entry.isdigit()), key=int):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in fds):
                continue
            command = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split())
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append(f"{pid} {command[:200]}")
    return found


def _format(listener: Listener) -> str:
    return f"{listener[0]}:{listener[1]}"


def save(path: Path) -> int:
    path.write_text("".join(f"{_format(listener)}\n" for listener in sorted(listeners())))
    return 0


def check(path: Path) -> int:
    before = set(path.read_text().split())
    deadline = time.monotonic() + GRACE_S
    while True:
        new = {listener: inodes for listener, inodes in listeners().items() if _format(listener) not in before}
        if not new or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    if not new:
        return 0
    print(f"make test: {len(new)} TCP port(s) listen now that did not before it ran:", file=sys.stderr)
    for listener, inodes in sorted(new.items()):
        held_by = owners(inodes) or ["(no process found: another user's, or a namespace this one cannot see)"]
        print(f"  {_format(listener)}  held by  " + "; ".join(held_by), file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("save", "check"):
        print("usage: tools/listening_ports.py save|check FILE", file=sys.stderr)
        return 2
    if not any(table.exists() for table in TABLES):
        print("listening ports: no /proc/net/tcp here, not checked", file=sys.stderr)
        return 0
    return (save if argv[1] == "save" else check)(Path(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
