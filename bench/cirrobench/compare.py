"""Value-by-value comparison of two query results (pyarrow Tables).

Engines name columns differently and disagree on types (DECIMAL against
DOUBLE, INT against BIGINT, padded CHAR), so columns are compared by position
after normalising: integers are compared exactly (an integer against a
DECIMAL or DOUBLE as a number), other numbers become float64 and are compared within 1e-6
relative or 1e-5 absolute (the tolerance of ../shared/tpch/README.md), text is
compared exactly after trimming trailing blanks, dates and times by value,
NULL equals only NULL. Rows are compared as multisets: both sides are sorted
by every column first (exact columns before numeric ones), since engines may
order ties differently; the order of ORDER BY results is checked by the
engine's own tests against the reference answers, not here.

Everything is vectorised with pyarrow compute, and only sort orders are made
(not sorted copies), so results of tens of millions of rows compare in
seconds and in a few GB.
"""

import pyarrow as pa
import pyarrow.compute as pc

REL = 1e-6
ABS = 1e-5


class Mismatch(Exception):
    """The two results differ; the message says where."""


def _normalise(col):
    """(kind, array): "int" arrays are kept as they are (no copy), other
    numbers become float64, text is trimmed, dates become timestamps."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = col.type
    if pa.types.is_dictionary(t):
        col = col.dictionary_decode()
        t = col.type
    if pa.types.is_integer(t):
        return "int", col
    if pa.types.is_decimal(t) or pa.types.is_floating(t):
        return "num", pc.cast(col, pa.float64())
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "text", pc.utf8_rtrim(pc.cast(col, pa.string()), characters=" ")
    if pa.types.is_timestamp(t):
        # a date computed as a timestamp at midnight by one engine equals the date of another
        return "time", pc.cast(col, pa.timestamp("us"))
    if pa.types.is_date(t):
        return "time", pc.cast(pc.cast(col, pa.date32()), pa.timestamp("us"))
    if pa.types.is_boolean(t):
        return "bool", col
    return "text", pc.cast(col, pa.string())


def compare(got, expected, what="result"):
    """Raise Mismatch if `got` differs from `expected`; return the row count."""
    if got.num_columns != expected.num_columns:
        raise Mismatch(f"{what}: {got.num_columns} columns, expected {expected.num_columns} "
                       f"({got.column_names} vs {expected.column_names})")
    if got.num_rows != expected.num_rows:
        raise Mismatch(f"{what}: {got.num_rows} rows, expected {expected.num_rows}")
    if got.num_rows == 0:
        return 0
    kinds, a_cols, b_cols = [], [], []
    for j in range(got.num_columns):
        a, b = got.column(j), expected.column(j)
        # A column of only NULLs from a client that infers types from the
        # values (the PostgreSQL protocol's rows) has Arrow's null type:
        # it takes the other side's, and then NULL equals only NULL.
        if pa.types.is_null(a.type) != pa.types.is_null(b.type):
            if pa.types.is_null(a.type):
                a = pc.cast(a, b.type)
            else:
                b = pc.cast(b, a.type)
        ka, a = _normalise(a)
        kb, b = _normalise(b)
        if {ka, kb} == {"int", "num"}:  # e.g. BIGINT against DECIMAL: compare as numbers
            ka = kb = "num"
            a, b = pc.cast(a, pa.float64()), pc.cast(b, pa.float64())
        if ka != kb:
            raise Mismatch(f"{what}: column {j + 1} is {got.schema.field(j).type}, "
                           f"expected {expected.schema.field(j).type}")
        kinds.append(ka)
        a_cols.append(a)
        b_cols.append(b)
    names = [f"c{j}" for j in range(len(kinds))]
    order = [j for j, k in enumerate(kinds) if k != "num"] + [j for j, k in enumerate(kinds) if k == "num"]
    keys = [(names[j], "ascending") for j in order]
    # Sort orders only (not sorted copies of whole tables), then one column
    # at a time: results of tens of millions of rows stay within memory.
    ia = pc.sort_indices(pa.table(a_cols, names=names), sort_keys=keys)
    ib = pc.sort_indices(pa.table(b_cols, names=names), sort_keys=keys)
    for j, kind in enumerate(kinds):
        x, y = pc.take(a_cols[j], ia), pc.take(b_cols[j], ib)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        if kind == "num":
            diff = pc.abs(pc.subtract(x, y))
            limit = pc.max_element_wise(pc.multiply(pc.abs(y), REL), pa.scalar(ABS))
            same = pc.or_(pc.less_equal(diff, limit), pc.and_(pc.is_nan(x), pc.is_nan(y)))
        else:
            same = pc.equal(x, y)
        ok = pc.or_kleene(both_null, pc.fill_null(same, False))
        if not pc.all(ok).as_py():
            i = pc.index(ok, False).as_py()
            row_a = tuple(a_cols[k][ia[i].as_py()].as_py() for k in range(len(kinds)))
            row_b = tuple(b_cols[k][ib[i].as_py()].as_py() for k in range(len(kinds)))
            raise Mismatch(f"{what}: column {j + 1} ({got.column_names[j]}) differs in row {i + 1} of the "
                           f"sorted rows: {row_a} vs expected {row_b}")
        del x, y, same, ok, both_null
    return got.num_rows
