"""One engine in its own process. The parent sends SQL, the worker answers
with the elapsed seconds and the result (Arrow IPC, small results through the
pipe, large ones through a file), or with the error. A query past its timeout
is ended by killing the worker (and the server it started), which the parent
then starts again.
"""

import multiprocessing as mp
import os
import signal
import time
import traceback
from pathlib import Path

import pyarrow as pa

# Results with more rows than this go through a file, not the pipe.
PIPE_ROWS = 200_000


def _to_ipc(table):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _from_ipc(buf):
    return pa.ipc.open_stream(buf).read_all()


def _serve(conn, name, ctx, spill_dir):
    from cirrobench import engines  # imports no engine library itself

    os.environ.update(engines.thread_env(ctx.threads))
    try:
        engine = engines.make(name, ctx)
    except BaseException as e:  # noqa: BLE001 — reported to the parent, which records it
        conn.send(("error", f"{type(e).__name__}: {e}".strip()[:2000]))
        return
    conn.send(("ready", {"version": str(getattr(engine, "version", "?")),
                         "pid": getattr(engine, "pid", None),
                         "load_seconds": getattr(engine, "load_seconds", None)}))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            engine.close()
            return
        _, sql, keep, tag = msg
        try:
            start = time.perf_counter()
            table = engine.run(sql)
            elapsed = time.perf_counter() - start
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", f"{type(e).__name__}: {e}".strip()[:2000]))
            continue
        rows = table.num_rows
        if not keep or (keep == "small" and rows > PIPE_ROWS):
            payload = None
        elif rows <= PIPE_ROWS:
            payload = ("ipc", _to_ipc(table).to_pybytes())
        else:
            path = Path(spill_dir) / f"{name}-{tag}.arrow"
            with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
                writer.write_table(table)
            payload = ("file", str(path))
        # a result of tens of millions of rows must not stay resident while the
        # other engines run (all workers live at once)
        del table
        conn.send(("ok", elapsed, rows, payload))


class EngineFailed(Exception):
    pass


class Worker:
    """Parent side of one engine's process."""

    def __init__(self, name, ctx, spill_dir, start_timeout=600):
        self.name, self.ctx, self.spill_dir = name, ctx, spill_dir
        self.start_timeout = start_timeout
        self.proc = None
        self.info = {}

    def start(self):
        mpctx = mp.get_context("spawn")
        self.conn, child = mpctx.Pipe()
        self.proc = mpctx.Process(target=_serve, args=(child, self.name, self.ctx, self.spill_dir), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(self.start_timeout):
            self.kill()
            raise EngineFailed(f"{self.name} did not start within {self.start_timeout} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            self.kill()
            raise EngineFailed(f"{self.name} exited while starting") from None
        if msg[0] != "ready":
            self.kill()
            raise EngineFailed(msg[1])
        self.info = msg[1]
        return self.info

    def run(self, sql, timeout, keep=False, tag="result"):
        """('ok', seconds, rows, table or None) | ('error', message) | ('timeout', None)."""
        if self.proc is None:
            self.start()
        self.conn.send(("run", sql, keep, tag))
        if not self.conn.poll(timeout):
            self.kill()
            return ("timeout", f"no answer within {timeout:g} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            code = self.proc.exitcode if self.proc else None
            self.kill()
            return ("error", f"{self.name} crashed (exit {code})")
        if msg[0] != "ok":
            return msg
        _, seconds, rows, payload = msg
        table = None
        if payload is not None:
            kind, data = payload
            table = _from_ipc(pa.py_buffer(data)) if kind == "ipc" else pa.ipc.open_file(
                pa.memory_map(data)).read_all()
        return ("ok", seconds, rows, table)

    def kill(self):
        """End the worker and anything it started (Cirro's server), now."""
        pid = self.info.get("pid") if self.info else None
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(timeout=30)
        self.proc = None
        self.info = {}

    def stop(self):
        if self.proc is None:
            return
        try:
            self.conn.send(("stop",))
            self.proc.join(timeout=60)
        except (BrokenPipeError, OSError):
            pass
        self.kill()
