"""The physical-limit probe: how fast this machine reads memory, and how long
the scan-bound queries' bytes would take at that speed.

Bandwidth: T threads each sum their own slice of a 1 GiB array of float64
(numpy releases the GIL while summing), best of 7 passes; the array is
written once first so its pages are resident. A sum is about as cheap as
touching memory gets, so this is close to what a query can read per second.

Bytes of a query: for each column it reads, rows × the column's width in
Arrow's in-memory form (the form the engines compute on): the type's byte
width for fixed-width types, 4 bytes of offset plus the average length for
strings (measured on the first row group). Compressed Parquet is smaller, but
every engine decodes it to this before computing.
"""

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def memory_bandwidth(threads, size=1 << 30, passes=7):
    """Bytes per second read by `threads` threads."""
    data = np.ones(size // 8, dtype=np.float64)
    slices = np.array_split(data, threads)
    best = float("inf")
    for _ in range(passes):
        barrier = threading.Barrier(threads + 1)

        def work(part):
            barrier.wait()
            part.sum()

        workers = [threading.Thread(target=work, args=(s,)) for s in slices]
        for w in workers:
            w.start()
        start = time.perf_counter()
        barrier.wait()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return data.nbytes / best


def _column_width(files, column):
    meta = pq.ParquetFile(files[0])
    field = meta.schema_arrow.field(column)
    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    try:
        return t.bit_width / 8  # fixed width
    except ValueError:  # strings and binaries
        pass
    sample = meta.read_row_group(0, columns=[column]).column(0)
    if sample.type != t:
        sample = sample.cast(t)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        total = pc.sum(pc.binary_length(sample)).as_py() or 0
        return 4 + total / max(1, len(sample))
    return sample.nbytes / max(1, len(sample))


def query_bytes(tables, reads):
    """Bytes the columns in `reads` ({table: [columns]}) occupy in memory."""
    total = 0
    for table, columns in reads.items():
        files = sorted(Path(tables[table]).glob("*.parquet"))
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        total += sum(rows * _column_width(files, c) for c in columns)
    return int(total)


def run(tables, scan_bound, threads):
    bandwidth = memory_bandwidth(threads)
    single = memory_bandwidth(1) if threads > 1 else bandwidth
    floors = {}
    for query, reads in (scan_bound or {}).items():
        b = query_bytes(tables, reads)
        floors[query] = {"bytes": b, "floor_seconds": b / bandwidth}
    return {"bandwidth_bytes_per_s": bandwidth, "bandwidth_1_thread_bytes_per_s": single,
            "threads": threads, "queries": floors}
