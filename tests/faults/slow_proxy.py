"""A loopback TCP proxy that delays every chunk it forwards: a Redis "answering slowly"
without touching the server. Used by the fault tests and ``benchmarks/faults.py``."""
from __future__ import annotations

import socket
import threading
import time


class SlowProxy:
    """Listens on 127.0.0.1:``port`` and forwards to 127.0.0.1:``target_port``, sleeping
    ``delay_s`` before each chunk sent back to the client. ``delay_s`` may change live."""

    def __init__(self, target_port: int, delay_s: float = 0.0) -> None:
        self.target_port, self.delay_s = target_port, delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, 0.0),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, None),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delay_s: float | None) -> None:
        try:
            while chunk := src.recv(1 << 16):
                wait_s = self.delay_s if delay_s is None else delay_s
                if wait_s:
                    time.sleep(wait_s)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._sockets:
            s.close()
