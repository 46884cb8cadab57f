#!/usr/bin/env bash
# pgbench's select-only (-S) and TPC-B-like scripts against `cirro serve
# --row-store on` and PostgreSQL 15 on the same machine, alternating, each
# run on a fresh server process, then the TPC-B balance invariant checked
# on both: the figures in bench/results/micro-row-store/. `cirro bench
# micro` runs the same scripts beside its other operations (a fresh server
# per start rather than per run).
#
#   bench/pgbench-row-store.sh CIRRO_BINARY [SECONDS] [ROUNDS] [CLIENTS...]
#
# SCALE (default 10, as issue 59 asks) is pgbench's -s for both.
set -euo pipefail
scale=${SCALE:-10}
cirro=${1:?usage: $0 CIRRO_BINARY [SECONDS] [ROUNDS] [CLIENTS...]}
seconds=${2:-10}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
clients=("${@:-1}")
[ ${#clients[@]} -eq 0 ] && clients=(1)
work=$(mktemp -d /tmp/pgbench-row-store.XXXXXX)
chown postgres:postgres "$work"
pg=/usr/lib/postgresql/15/bin
su postgres -c "$pg/initdb -D $work/pg -A trust -U postgres >/dev/null"
su postgres -c "$pg/pg_ctl -D $work/pg -w -l $work/pg.log -o '-p 55432 -k $work -c listen_addresses=127.0.0.1' start >/dev/null"
trap 'su postgres -c "$pg/pg_ctl -D $work/pg -m fast stop" >/dev/null 2>&1 || true; pkill -f "serve --data $work/cirro" || true' EXIT
export PGPASSWORD=pw
start_cirro() {
  CIRRO_PASSWORD=pw "$cirro" serve --data "$work/cirro" --pg-port 55441 --threads 2 \
    --no-http --flight-port 0 --row-store on >>"$work/cirro.log" 2>&1 &
  for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p 55441 && return; sleep 0.2; done
  echo "cirro did not start" >&2; exit 1
}
stop_cirro() { pkill -f "serve --data $work/cirro"; sleep 1; }
pgbench -q -i -s "$scale" -h 127.0.0.1 -p 55432 -U postgres postgres >/dev/null 2>&1
start_cirro
pgbench -q -i -s "$scale" -h 127.0.0.1 -p 55441 -U cirro cirro >/dev/null 2>&1
stop_cirro
run() { # system port user db mode clients
  local flag=""; [ "$4" = select-only ] && flag="-S"
  # -n: no VACUUM and TRUNCATE of pgbench_history before the run, so that
  # the history keeps every run's rows for the invariant at the end.
  local out; out=$(pgbench -n -h 127.0.0.1 -p "$2" -U "$3" -c "$5" -j "$5" -T "$seconds" -M prepared \
    --max-tries 10 $flag "$3" 2>&1)
  local tps failed lat
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
  lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$out")
  failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$out")
  echo "$1 $4 $5 $tps $lat $failed"
}
echo "system mode clients tps latency_ms failed"
for round in $(seq "$rounds"); do
  for n in "${clients[@]}"; do
    for mode in select-only tpcb; do
      start_cirro
      run cirro 55441 cirro "$mode" "$n"
      stop_cirro
      run postgres 55432 postgres "$mode" "$n"
    done
  done
done
invariant="SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(tbalance) FROM pgbench_tellers) AND (SELECT sum(tbalance) FROM pgbench_tellers) = (SELECT sum(bbalance) FROM pgbench_branches) AND (SELECT sum(bbalance) FROM pgbench_branches) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)"
start_cirro
echo "invariant cirro $(psql -tA -h 127.0.0.1 -p 55441 -U cirro cirro -c "$invariant") history $(psql -tA -h 127.0.0.1 -p 55441 -U cirro cirro -c 'SELECT count(*) FROM pgbench_history')"
stop_cirro
echo "invariant postgres $(psql -tA -h 127.0.0.1 -p 55432 -U postgres postgres -c "$invariant") history $(psql -tA -h 127.0.0.1 -p 55432 -U postgres postgres -c 'SELECT count(*) FROM pgbench_history')"
