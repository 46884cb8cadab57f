//! One statement path behind every front end (`tests/interop/statement_path.py`
//! drives `cirro serve` with libpq, psycopg and ADBC): each statement parsed
//! once over the simple and extended protocols and Flight SQL; a prepared
//! point query planned once for 1,000 executions and again after its table
//! is dropped and created anew; parameters never become SQL text; bad
//! parameters refused with their SQLSTATE.

use crate::common::DataDir;
use crate::common::server::{PASSWORD, Server, python_ok};

fn dsn(server: &Server) -> String {
    format!("{} password={PASSWORD}", server.conninfo("cirro"))
}

#[test]
fn every_statement_is_parsed_once_on_every_front_end() {
    let server = Server::start();
    let csv = server.data.path().join("rows.csv");
    std::fs::write(&csv, "10,ten\n11,eleven\n").expect("write csv");
    let uri = format!("grpc://127.0.0.1:{}", server.flight_port);
    python_ok(
        "statement_path.py",
        &[
            "parse_once",
            &dsn(&server),
            &uri,
            PASSWORD,
            csv.to_str().expect("utf8 path"),
        ],
    );
}

#[test]
fn a_prepared_query_is_planned_once_and_again_when_its_table_is_replaced() {
    let server = Server::start();
    python_ok("statement_path.py", &["prepared", &dsn(&server)]);
}

#[test]
fn parameters_never_become_sql_text() {
    let server = Server::start();
    python_ok("statement_path.py", &["injection", &dsn(&server)]);
    let uri = format!("grpc://127.0.0.1:{}", server.flight_port);
    python_ok("statement_path.py", &["flight_prepared", &uri, PASSWORD]);
}

#[test]
fn bad_parameters_get_their_sqlstate_and_the_session_goes_on() {
    let server = Server::start();
    python_ok("statement_path.py", &["bad_parameters", &dsn(&server)]);
}

#[test]
fn prepared_statements_by_key_skip_the_planner_with_the_row_store() {
    let server = Server::start_with(DataDir::new(), &["--row-store", "on"]);
    python_ok("statement_path.py", &["by_key", &dsn(&server)]);
}
