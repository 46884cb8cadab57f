"""Differential test of Cirro against PostgreSQL 15: the same generated
statements on both servers, over the wire with psycopg (its extended
protocol: every statement with parameters binds them as PostgreSQL's own
clients do, from Python ints, floats, Decimals and strings), comparing
answers, column names and SQLSTATE classes.

    pg_differential.py CIRRO_DSN PG_DSN SEED COUNT ALLOWLIST [--known FILE] [--plant CONSTRUCT]

Statements come from constructs (an operator, a function, a cast, an
aggregate), each a generator of statements over literals, the columns of a
table made on both servers, and parameters; statement i is drawn from
construct i mod the number of constructs, so every construct gets its share.
ALLOWLIST names the constructs whose differences are deliberate, each with
its reason (at most 30 entries); `CONSTRUCT (scale)` allows a NUMERIC
construct's answers fewer decimals than PostgreSQL's (each must be
PostgreSQL's value rounded to them), and the entry `numeric beyond 38
digits` covers Cirro's 22003 wherever PostgreSQL's answer holds a longer
NUMERIC. The report gives statements per construct,
how many bound parameters, and every difference; the exit status is 1 when
a difference is outside the allowlist, a construct ran fewer than 20
statements, or fewer than 20 % bound parameters.

`--known FILE` names constructs with differences that are bugs not yet
fixed (not deliberate: each goes once fixed); they are reported, counted
apart, and do not fail the run, so that every other construct is held to
PostgreSQL meanwhile.

`--plant CONSTRUCT` changes Cirro's answers of that construct before they are
compared: the harness must then report them (the self-test).

The harness is meant to be reused: `Server` wraps a connection, `Construct`
a generator, `compare` one statement's two outcomes; other statement shapes
(DML sequences) or another engine under test (a cluster's node) plug in the
same way.
"""

import datetime
import decimal
import math
import random
import sys
from dataclasses import dataclass, field

import psycopg

ALLOWLIST_ENTRIES_MAX = 30
BEYOND_38 = "numeric beyond 38 digits"
STATEMENTS_PER_CONSTRUCT_MIN = 20
PARAMETER_SHARE_MIN = 0.20
# Floats computed in another order (sums) may differ in their last bits.
FLOAT_RELATIVE_TOLERANCE = 1e-12

TABLE = "pgdiff"
SETUP = [
    f"DROP TABLE IF EXISTS {TABLE}",
    f"""CREATE TABLE {TABLE} (
        id INT, i2 SMALLINT, i4 INT, i8 BIGINT,
        n52 NUMERIC(5,2), n1510 NUMERIC(15,10), n380 NUMERIC(38,0),
        f4 REAL, f8 DOUBLE PRECISION, t TEXT, v VARCHAR(12), b BOOLEAN,
        d DATE, ts TIMESTAMP)""",
    f"""INSERT INTO {TABLE} VALUES
        (1, 1, 10, 100, 1.25, 0.1234567890, 1234567890123456789, 1.5, 2.25,
         'abc', 'abc', true, DATE '2024-02-29', TIMESTAMP '2024-02-29 13:14:15.123456'),
        (2, -5, -20, -9000000000, -99.99, -1.0000000001, -1, -0.5, -10000000000,
         'Hello World', 'Hello', false, DATE '1970-01-01', TIMESTAMP '1970-01-01 00:00:00'),
        (3, 0, 0, 0, 0.00, 0, 0, 0, 0, '', '', NULL, DATE '2000-12-31',
         TIMESTAMP '1999-12-31 23:59:59.999999'),
        (4, 32767, 2147483647, 9223372036854775807, 999.99, 99999.9999999999,
         99999999999999999999, 0.25, 1e300, ' pad ', 'x y', true,
         DATE '1900-03-01', TIMESTAMP '2100-06-15 06:30:00'),
        (5, 7, 3, -3, 2.50, 0.5000000000, 7, 2.5, -2.5, 'ünïcødé', 'ünï', false,
         DATE '2024-12-31', TIMESTAMP '2024-12-31 23:59:59'),
        (6, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
]

# Operands of each type: literals, the table's columns, parameter values.
LITERALS = {
    # Literals that fit int4 are int4 in PostgreSQL and bigint in Cirro, so
    # their overflow (2147483647 + 1) has a construct of its own.
    "int": ["0", "1", "-1", "7", "42", "-17", "3", "100000", "-3000000000",
            "9223372036854775807", "NULL::int"],
    "numeric": ["0.1", "0.2", "0.3", "1.5", "-2.25", "0.06", "0.07", "12345.678", "1e3",
                "1.5e-3", "0.000001", "99.995", "2.5", "-0.5", "NULL::numeric", "100.00"],
    "float": ["1.5::float8", "(-0.25)::float8", "1e300::float8", "0.1::float8", "3::float4",
              "2.5::real", "NULL::float8", "'-0'::float8"],
    "text": ["'abc'", "''", "'Hello World'", "' pad '", "'ünï'", "'a_b%c'", "NULL::text",
             "'ABC'"],
    "date": ["DATE '2024-02-29'", "DATE '1970-01-01'", "DATE '2000-12-31'",
             "DATE '1999-01-31'", "NULL::date"],
    "timestamp": ["TIMESTAMP '2024-05-17 10:11:12.123456'", "TIMESTAMP '1999-12-31 23:59:59'",
                  "TIMESTAMP '2000-01-01 00:00:00'", "NULL::timestamp"],
    "bool": ["true", "false", "NULL::boolean"],
}
COLUMNS = {
    "int": ["i2", "i4", "i8"],
    "numeric": ["n52", "n1510", "n380"],
    "float": ["f4", "f8"],
    "text": ["t", "v"],
    "date": ["d"],
    "timestamp": ["ts"],
    "bool": ["b"],
}
PARAMETERS = {
    "int": [0, 1, -3, 42, 2**31 - 1, 10**12],
    "numeric": [decimal.Decimal(v) for v in ["0.06", "2.50", "-1.005", "12345.678", "0.1", "7"]],
    "float": [0.5, -1.25, 2.9, 0.1, 1e10, 0.4],
    "text": ["abc", "Hello", " x ", "", "ünï"],
}


@dataclass
class Statement:
    construct: str
    sql: str
    params: list = field(default_factory=list)


class Draw:
    """One statement's draws: operands as literals, columns or parameters."""

    def __init__(self, rng, construct):
        self.rng = rng
        self.construct = construct
        self.params = []
        self.table = False
        self.param_share = 0.3

    def pick(self, items):
        return self.rng.choice(items)

    def operand(self, kind, allow_param=True):
        roll = self.rng.random()
        if allow_param and kind in PARAMETERS and roll < self.param_share:
            self.params.append(self.pick(PARAMETERS[kind]))
            return "%s"
        if roll < 0.65:
            return self.pick(LITERALS[kind])
        self.table = True
        return self.pick(COLUMNS[kind])

    def done(self, expression):
        if self.table:
            sql = f"SELECT {expression} FROM {TABLE} ORDER BY id"
        else:
            sql = f"SELECT {expression}"
        return Statement(self.construct, sql, self.params)


def int4_literal_overflow(d):
    return d.done(f"{d.pick(['2147483647', '-2147483648', '65536'])} "
                  f"{d.pick(['+', '-', '*'])} {d.pick(['1', '2', '65536'])}")


def numeric_beyond_38(d):
    big = d.pick(["99999999999999999999999999999999999999", "-99999999999999999999999999999999999999"])
    return d.done(f"{big} {d.pick(['+', '-', '*'])} {d.pick(['1', '10', '0.5'])}")


def binary(op, kinds):
    def make(d):
        a, b = d.pick(kinds)
        return d.done(f"{d.operand(a)} {op} {d.operand(b)}")
    return make


def call(name, *argument_kinds):
    def make(d):
        args = []
        for kind in argument_kinds:
            if isinstance(kind, list):
                args.append(d.pick(kind))
            else:
                args.append(d.operand(kind))
        return d.done(f"{name}({', '.join(args)})")
    return make


def cast(kind, targets):
    def make(d):
        return d.done(f"CAST({d.operand(kind)} AS {d.pick(targets)})")
    return make


def aggregate(name, kinds):
    def make(d):
        column = d.pick([c for k in kinds for c in COLUMNS[k]])
        extra = ""
        if d.rng.random() < 0.3:
            extra = f" WHERE i4 > {d.operand('int')}"
        return Statement(d.construct, f"SELECT {name}({column}) FROM {TABLE}{extra}", d.params)
    return make


INT_PAIRS = [("int", "int")]
NUM_PAIRS = [("numeric", "numeric"), ("numeric", "int"), ("int", "numeric")]
FLOAT_PAIRS = [("float", "float"), ("float", "int"), ("numeric", "float"), ("float", "numeric")]
ANY_COMPARABLE = [("int", "int"), ("numeric", "numeric"), ("int", "numeric"), ("float", "float"),
                  ("numeric", "float"), ("text", "text"), ("date", "date"),
                  ("timestamp", "timestamp"), ("bool", "bool")]


def text_pattern(d):
    return d.done(f"{d.operand('text')} {d.pick(['LIKE', 'NOT LIKE', 'ILIKE'])} "
                  f"{d.pick(['%b%', 'a_c', 'H%', '%', ''])!r}")


def case_when(d):
    return d.done(f"CASE WHEN {d.operand('int')} > {d.operand('int')} THEN {d.operand('numeric')} "
                  f"ELSE {d.operand('numeric')} END")


def date_arithmetic(d):
    form = d.pick(["{d} + {i}", "{d} - {i}", "{d} - {d2}"])
    i = d.pick(["1", "30", "-365", "0"])
    return d.done(form.format(d=d.operand("date"), i=i, d2=d.operand("date")))


def timestamp_interval(d):
    interval = d.pick(["INTERVAL '1 day'", "INTERVAL '2 hours'", "INTERVAL '90 minutes'",
                       "INTERVAL '1 month'"])
    return d.done(f"{d.operand('timestamp')} {d.pick(['+', '-'])} {interval}")


def extract(d):
    part = d.pick(["YEAR", "MONTH", "DAY", "DOW", "DOY", "QUARTER"])
    source = d.operand(d.pick(["date", "timestamp"]))
    return d.done(f"EXTRACT({part} FROM {source})")


def date_trunc(d):
    unit = d.pick(["'year'", "'month'", "'day'", "'hour'"])
    return d.done(f"date_trunc({unit}, {d.operand('timestamp')})")


def substring(d):
    return d.done(f"substr({d.operand('text')}, {d.pick(['1', '2', '0', '-1', '5'])}"
                  f"{d.pick(['', ', 2', ', 0', ', 10'])})")


def in_list(d):
    kind = d.pick(["int", "numeric", "text"])
    items = ", ".join(d.operand(kind) for _ in range(d.rng.randint(1, 4)))
    return d.done(f"{d.operand(kind)} {d.pick(['IN', 'NOT IN'])} ({items})")


def between(d):
    kind = d.pick(["int", "numeric", "date"])
    return d.done(f"{d.operand(kind)} BETWEEN {d.operand(kind)} AND {d.operand(kind)}")


def boolean_logic(d):
    return d.done(f"({d.operand('bool')} {d.pick(['AND', 'OR'])} {d.operand('bool')}) "
                  f"{d.pick(['', 'IS NULL', 'IS NOT TRUE', '= false'])}")


def is_distinct(d):
    a, b = d.pick(ANY_COMPARABLE)
    return d.done(f"{d.operand(a)} IS {d.pick(['', 'NOT '])}DISTINCT FROM {d.operand(b)}")


def coalesce_nullif(d):
    kind = d.pick(["int", "numeric", "text"])
    name = d.pick(["coalesce", "nullif"])
    return d.done(f"{name}({d.operand(kind)}, {d.operand(kind)})")


def rounding(d):
    name = d.pick(["round", "trunc"])
    digits = d.pick(["", ", 0", ", 1", ", 2", ", -1"])
    return d.done(f"{name}({d.operand('numeric')}{digits})")


def greatest_least(d):
    kind = d.pick(["int", "numeric", "text", "date"])
    return d.done(f"{d.pick(['greatest', 'least'])}({d.operand(kind)}, {d.operand(kind)})")


def text_to_int(d):
    text = d.pick(["42", " 7 ", "x", "2.5", "-0", "99999999999"])
    if d.rng.random() < d.param_share:
        d.params.append(text)
        return d.done("CAST(%s AS INT)")
    return d.done(f"CAST({text!r} AS INT)")


def pad(d):
    fill = d.pick(["", ", '*'", ", 'xy'"])
    return d.done(f"{d.pick(['lpad', 'rpad'])}({d.operand('text')}, {d.pick(['0', '2', '6'])}{fill})")


CONSTRUCTS = {
    "int4 literal overflow": int4_literal_overflow,
    "numeric beyond 38 digits": numeric_beyond_38,
    "int +": binary("+", INT_PAIRS),
    "int -": binary("-", INT_PAIRS),
    "int *": binary("*", INT_PAIRS),
    "int /": binary("/", INT_PAIRS),
    "int %": binary("%", INT_PAIRS),
    "numeric +": binary("+", NUM_PAIRS),
    "numeric -": binary("-", NUM_PAIRS),
    "numeric *": binary("*", NUM_PAIRS),
    "numeric /": binary("/", NUM_PAIRS),
    "float + -": binary("+", FLOAT_PAIRS),
    "float *": binary("*", FLOAT_PAIRS),
    "float /": binary("/", FLOAT_PAIRS),
    "unary -": lambda d: d.done(f"-({d.operand(d.pick(['int', 'numeric', 'float']))})"),
    "comparison": lambda d: binary(d.pick(["=", "<", "<>", ">="]), ANY_COMPARABLE)(d),
    "abs": call("abs", ["1.5", "-2", "-0.25"]),
    "round trunc": rounding,
    "floor ceil": lambda d: d.done(f"{d.pick(['floor', 'ceil'])}({d.operand(d.pick(['numeric', 'float']))})"),
    "sqrt power": lambda d: d.done(f"{d.pick(['sqrt', 'cbrt'])}({d.operand('float')})"),
    "mod": lambda d: d.done(f"mod({d.operand('int')}, {d.operand('int')})"),
    "greatest least": greatest_least,
    "cast numeric->int": cast("numeric", ["INT", "BIGINT", "SMALLINT"]),
    "cast float->int": cast("float", ["INT", "BIGINT"]),
    "cast text->int": text_to_int,
    "cast numeric(p,s)": cast("numeric", ["NUMERIC(5,2)", "NUMERIC(10,4)", "NUMERIC(3,0)", "DECIMAL(38,10)"]),
    "cast ->float": cast("numeric", ["FLOAT", "DOUBLE PRECISION", "REAL", "FLOAT(24)", "FLOAT(53)"]),
    "cast ->text": lambda d: d.done(f"CAST({d.operand(d.pick(['int', 'numeric', 'date', 'bool']))} AS TEXT)"),
    "cast text->date": lambda d: d.done(f"CAST({d.pick([repr(v) for v in ['2024-02-29', '1999-01-31', '2023-02-30', 'nope']])} AS DATE)"),
    "cast ->varchar(n)": lambda d: d.done(f"CAST({d.operand('text')} AS VARCHAR({d.pick(['1', '3', '20'])}))"),
    "||": lambda d: d.done(f"{d.operand('text')} || {d.operand(d.pick(['text', 'int']))}"),
    "upper lower": lambda d: d.done(f"{d.pick(['upper', 'lower', 'initcap'])}({d.operand('text')})"),
    "length": lambda d: d.done(f"{d.pick(['length', 'char_length', 'octet_length'])}({d.operand('text')})"),
    "substr": substring,
    "position strpos": lambda d: d.done(f"strpos({d.operand('text')}, {d.pick([repr(v) for v in ['b', 'l', '', 'ï']])})"),
    "replace": lambda d: d.done(f"replace({d.operand('text')}, {d.pick([repr(v) for v in ['b', 'l', 'Hello']])}, 'Z')"),
    "trim": lambda d: d.done(f"{d.pick(['trim', 'ltrim', 'rtrim'])}({d.operand('text')})"),
    "left right": lambda d: d.done(f"{d.pick(['left', 'right'])}({d.operand('text')}, {d.pick(['1', '2', '-1', '0'])})"),
    "lpad rpad": pad,
    "like": text_pattern,
    "date +- int": date_arithmetic,
    "timestamp +- interval": timestamp_interval,
    "extract": extract,
    "date_trunc": date_trunc,
    "in list": in_list,
    "between": between,
    "and or": boolean_logic,
    "is distinct from": is_distinct,
    "case": case_when,
    "coalesce nullif": coalesce_nullif,
    "count": aggregate("count", ["int", "numeric", "text", "date"]),
    "sum": aggregate("sum", ["int", "numeric", "float"]),
    "avg": aggregate("avg", ["int", "numeric"]),
    "avg float": aggregate("avg", ["float"]),
    "min max": lambda d: aggregate(d.pick(["min", "max"]), ["int", "numeric", "float", "text", "date", "timestamp"])(d),
}


class Server:
    """One server under comparison, through psycopg in autocommit."""

    def __init__(self, dsn):
        self.conn = psycopg.connect(dsn, autocommit=True)

    def run(self, statement):
        """(column names, rows) or ("error", SQLSTATE)."""
        try:
            with self.conn.cursor() as cur:
                cur.execute(statement.sql, statement.params or None)
                names = [c.name for c in cur.description] if cur.description else []
                rows = cur.fetchall() if cur.description else []
                return ("rows", names, rows)
        except psycopg.Error as e:
            return ("error", getattr(e, "sqlstate", None) or "?????", str(e).splitlines()[0])

    def setup(self):
        for sql in SETUP:
            with self.conn.cursor() as cur:
                cur.execute(sql)


# Constructs whose NUMERIC results have one scale by their operands' types in
# both engines: there the scale must agree too (psql would show it). Elsewhere
# a PostgreSQL NUMERIC value keeps its own scale (`coalesce(0.1, 100.00)` is
# 0.1) where an Arrow decimal column has one (0.10): values must agree.
SCALE_STRICT = {"numeric +", "numeric -", "numeric *", "numeric /", "cast numeric(p,s)"}


def same_value(a, b, strict_scale=True):
    """Whether Cirro's value `a` is PostgreSQL's `b`. `strict_scale`: True
    (the scale must agree), False (the value must), or "rounded" (a NUMERIC
    may have fewer decimals than PostgreSQL's if it is PostgreSQL's value
    rounded half away from zero to them: a column's one scale)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return a == b or abs(a - b) <= FLOAT_RELATIVE_TOLERANCE * max(abs(a), abs(b))
    if type(a) is not type(b):
        return False
    if isinstance(a, decimal.Decimal):
        if strict_scale == "rounded" and a.is_finite() and b.is_finite():
            exponent = a.as_tuple().exponent
            if exponent > b.as_tuple().exponent:
                with decimal.localcontext() as context:
                    context.prec = 100
                    b = b.quantize(decimal.Decimal(1).scaleb(exponent),
                                   rounding=decimal.ROUND_HALF_UP)
            return a == b
        return a == b and (strict_scale is not True
                           or a.as_tuple().exponent == b.as_tuple().exponent)
    return a == b


def digits_beyond(rows, limit=38):
    """Whether a NUMERIC value of `rows` has more than `limit` digits."""
    return any(isinstance(v, decimal.Decimal) and v.is_finite()
               and len(v.as_tuple().digits) > limit
               for row in rows for v in row)


def compare(cirro, postgres, strict_scale=True):
    """None when the two outcomes agree, else what differs."""
    if cirro[0] == "error" or postgres[0] == "error":
        if cirro[0] == postgres[0] == "error":
            if cirro[1][:2] == postgres[1][:2]:
                return None
            return f"SQLSTATE class: cirro {cirro[1]} ({cirro[2]}), postgres {postgres[1]} ({postgres[2]})"
        if cirro[0] == "error":
            return f"cirro failed {cirro[1]} ({cirro[2]}), postgres answered {postgres[2][:3]!r}"
        return f"postgres failed {postgres[1]} ({postgres[2]}), cirro answered {cirro[2][:3]!r}"
    _, c_names, c_rows = cirro
    _, p_names, p_rows = postgres
    if c_names != p_names:
        return f"column names: cirro {c_names}, postgres {p_names}"
    if len(c_rows) != len(p_rows):
        return f"rows: cirro {len(c_rows)}, postgres {len(p_rows)}"
    for i, (c, p) in enumerate(zip(c_rows, p_rows)):
        if len(c) != len(p) or not all(same_value(x, y, strict_scale) for x, y in zip(c, p)):
            return f"row {i}: cirro {c!r}, postgres {p!r}"
    return None


def plant(outcome):
    """A changed answer: the self-test's planted difference."""
    if outcome[0] != "rows":
        return ("rows", ["planted"], [("planted",)])
    _, names, rows = outcome
    if not rows:
        return ("rows", names, [tuple(None for _ in names)])
    first = list(rows[0])
    first[0] = "planted" if not isinstance(first[0], str) else first[0] + "!"
    return ("rows", names, [tuple(first)] + rows[1:])


def read_allowlist(path, limit=ALLOWLIST_ENTRIES_MAX):
    allowed = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            construct, _, reason = line.partition(" | ")
            construct, reason = construct.strip(), reason.strip()
            base = construct.removesuffix(" (scale)")
            if base != construct and base not in SCALE_STRICT:
                raise SystemExit(f"allowlist: {base!r} has no scale to allow")
            if base not in CONSTRUCTS:
                raise SystemExit(f"allowlist: unknown construct {construct!r}")
            if not reason:
                raise SystemExit(f"allowlist: {construct!r} has no reason")
            allowed[construct] = reason
    if len(allowed) > limit:
        raise SystemExit(f"{path}: {len(allowed)} entries, at most {limit}")
    return allowed


def generate(seed, count):
    rng = random.Random(seed)
    names = sorted(CONSTRUCTS)
    for i in range(count):
        construct = names[i % len(names)]
        yield CONSTRUCTS[construct](Draw(rng, construct))


def main(argv):
    cirro_dsn, pg_dsn, seed, count, allowlist_path = argv[:5]
    options = dict(zip(argv[5::2], argv[6::2]))
    planted = options.get("--plant")
    seed, count = int(seed), int(count)
    allowed = read_allowlist(allowlist_path)
    known = read_allowlist(options["--known"], len(CONSTRUCTS)) if "--known" in options else {}
    cirro, postgres = Server(cirro_dsn), Server(pg_dsn)
    cirro.setup()
    postgres.setup()
    # statements, params, diffs, allowed, known
    per_construct = {name: [0, 0, 0, 0, 0] for name in CONSTRUCTS}
    failures = []
    total = with_params = 0
    for statement in generate(seed, count):
        total += 1
        counts = per_construct[statement.construct]
        counts[0] += 1
        if statement.params:
            with_params += 1
            counts[1] += 1
        c_outcome = cirro.run(statement)
        if statement.construct == planted:
            c_outcome = plant(c_outcome)
        p_outcome = postgres.run(statement)
        strict = statement.construct in SCALE_STRICT
        if f"{statement.construct} (scale)" in allowed:
            strict = "rounded"
        difference = compare(c_outcome, p_outcome, strict)
        if difference is None:
            continue
        # NUMERIC holds 38 digits: Cirro's 22003 where PostgreSQL's answer
        # has a longer value is that allowlist entry's, whatever construct.
        beyond = (BEYOND_38 in allowed and c_outcome[0] == "error" and c_outcome[1] == "22003"
                  and p_outcome[0] == "rows" and digits_beyond(p_outcome[2]))
        if statement.construct in allowed or beyond:
            counts[3] += 1
            continue
        if statement.construct in known:
            counts[4] += 1
            if counts[4] <= 2:
                print(f"KNOWN [{statement.construct}] {statement.sql} params={statement.params!r}: {difference}")
            continue
        counts[2] += 1
        failures.append((statement, difference))
    print(f"{'construct':<26} {'statements':>10} {'params':>7} {'differ':>7} {'allowed':>8} {'known':>6}")
    for name in sorted(per_construct):
        s, p, d, a, k = per_construct[name]
        print(f"{name:<26} {s:>10} {p:>7} {d:>7} {a:>8} {k:>6}")
    share = with_params / total if total else 0.0
    differences = len(failures)
    print(f"seed {seed}: statements {total}, with parameters {with_params} ({share:.0%}), "
          f"differences {differences}, allowed {sum(c[3] for c in per_construct.values())}, "
          f"known bugs {sum(c[4] for c in per_construct.values())}")
    for statement, difference in failures[:200]:
        print(f"DIFFERENCE [{statement.construct}] {statement.sql} params={statement.params!r}: "
              f"{difference}")
    few = [n for n, c in per_construct.items() if c[0] < STATEMENTS_PER_CONSTRUCT_MIN]
    ok = differences == 0
    if total >= STATEMENTS_PER_CONSTRUCT_MIN * len(CONSTRUCTS) and few:
        print(f"too few statements for: {few}")
        ok = False
    if share < PARAMETER_SHARE_MIN:
        print(f"only {share:.0%} of the statements bound parameters")
        ok = False
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
