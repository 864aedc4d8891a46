"""The soak's "flood" fault: `n` connections to the PMIx gate that send nothing, kept open (each
one the gate closes is opened again) from the soak's own uid, the workers' too, while a job runs.
The gate must let the job's clients through all the same."""

from __future__ import annotations

import selectors
import socket
import threading
import time


class Flood:
    def __init__(self, port: int, n: int = 300):
        self.port = port
        self.n = n
        self.stats = {"opened": 0, "closed_by_gate": 0, "connect_errors": 0, "max_open": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-flood", daemon=True)

    def start(self) -> "Flood":
        self._thread.start()
        deadline = time.monotonic() + 10
        while self.stats["opened"] < self.n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(10)
        return dict(self.stats)

    def _open(self, sel: selectors.BaseSelector) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        except OSError:
            self.stats["connect_errors"] += 1
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        self.stats["opened"] += 1

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self._stop.is_set():
                while len(sel.get_map()) < self.n and not self._stop.is_set():
                    self._open(sel)
                self.stats["max_open"] = max(self.stats["max_open"], len(sel.get_map()))
                for key, _ in sel.select(timeout=0.05):
                    s = key.fileobj
                    try:
                        data = s.recv(64)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(s)
                        s.close()
                        self.stats["closed_by_gate"] += 1
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()
