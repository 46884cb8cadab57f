//! `cirro admin status|nodes|queries|cancel ID|rpc-bench`: any node's HTTP API, read
//! as a user (the password from `CIRRO_PASSWORD`), printed as tables.

use std::process::ExitCode;

use cirro_common::{CirroError, SqlState};
use cirro_server::{AdminCall, AdminTarget};
use clap::Subcommand;
use serde_json::Value;

#[derive(clap::Args, Debug)]
pub struct AdminArgs {
    /// Any node's web console (its `--http-port`).
    #[arg(long, env = "CIRRO_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The user to act as (a superuser may cancel every statement); the
    /// password comes from CIRRO_PASSWORD.
    #[arg(long, short = 'U', env = "CIRRO_USER", default_value = "cirro")]
    user: String,
    /// For an https:// URL: the PEM file of the certificates to trust.
    #[arg(long, env = "CIRRO_CA_CERT")]
    ca_cert: Option<String>,
    /// Print the node's JSON answer instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand, Debug)]
enum AdminCommand {
    /// The node answering: version, statements running and queued, memory.
    Status,
    /// The cluster's nodes and their load.
    Nodes,
    /// Queued and running statements of the whole cluster (--all: also the
    /// ended ones the nodes keep).
    Queries {
        #[arg(long)]
        all: bool,
    },
    /// Cancel a queued or running statement (its id from `queries`).
    Cancel { id: i64 },
    /// Measure the worker RPC from the node to every other node (a
    /// superuser's action; seconds per message size and node): the median
    /// round trip of a message echoed, and the throughput of messages sent
    /// 4 at a time.
    RpcBench {
        /// Message sizes in bytes, comma-separated (default: 1 KB to 16 MB,
        /// by factors of 4).
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
    },
}

pub async fn run(args: AdminArgs) -> Result<ExitCode, CirroError> {
    let password = std::env::var("CIRRO_PASSWORD").map_err(|_| {
        CirroError::new(
            SqlState::INVALID_PASSWORD,
            format!(
                "cirro admin needs the password of \"{}\" in CIRRO_PASSWORD",
                args.user
            ),
        )
    })?;
    let target = AdminTarget {
        url: args.url,
        user: args.user,
        password,
        ca_cert: args.ca_cert,
    };
    let call = match &args.command {
        AdminCommand::Status => AdminCall::Status,
        AdminCommand::Nodes => AdminCall::Nodes,
        AdminCommand::Queries { .. } => AdminCall::Queries,
        AdminCommand::Cancel { id } => AdminCall::Cancel(*id),
        AdminCommand::RpcBench { sizes } => AdminCall::RpcBench(sizes.clone()),
    };
    let answer = cirro_server::admin(&target, call).await?;
    if args.json {
        emit(format!("{answer:#}"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = match &args.command {
        AdminCommand::Status => status(&answer),
        AdminCommand::Nodes => nodes(&answer),
        AdminCommand::Queries { all } => queries(&answer, *all),
        AdminCommand::Cancel { id } => format!("cancelled query {id}"),
        AdminCommand::RpcBench { .. } => rpc_bench(&answer),
    };
    emit(text)?;
    Ok(ExitCode::SUCCESS)
}

/// `text` and a newline on stdout. A reader that went away (`cirro admin
/// queries | head -1`) ends the output quietly, as it ends a C tool's
/// (`println!` panicked there).
fn emit(text: String) -> Result<(), CirroError> {
    use std::io::Write;
    match writeln!(std::io::stdout().lock(), "{text}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.map_err(|e| CirroError::io(format!("cannot write output: {e}"))),
    }
}

fn status(s: &Value) -> String {
    let sample = &s["sample"];
    [
        ("node", text(&s["node"])),
        ("version", text(&s["version"])),
        ("cluster", text(&s["cluster"])),
        ("user", text(&s["user"])),
        ("superuser", text(&s["superuser"])),
        (
            "running",
            format!("{} (at most {})", s["running"], s["max_running"]),
        ),
        ("queued", text(&s["queued"])),
        (
            "query memory",
            format!(
                "{} of {}",
                bytes(&sample["memory_used"]),
                bytes(&sample["memory_limit"])
            ),
        ),
        ("resident memory", bytes(&sample["rss"])),
        ("cache", bytes(&sample["cache_bytes"])),
        (
            "cpu",
            format!(
                "{:.1} %",
                sample["cpu_permille"].as_f64().unwrap_or(0.0) / 10.0
            ),
        ),
        ("spill disk free", bytes(&sample["disk_free"])),
    ]
    .iter()
    .map(|(k, v)| format!("{k:>16}: {v}"))
    .collect::<Vec<_>>()
    .join("\n")
}

fn nodes(list: &Value) -> String {
    table(
        &[
            "node",
            "state",
            "cpu",
            "memory",
            "disk free",
            "cache",
            "running",
            "address",
        ],
        list.as_array().into_iter().flatten().map(|n| {
            vec![
                text(&n["id"]),
                text(&n["state"]),
                format!("{:.1} %", n["cpu_percent"].as_f64().unwrap_or(0.0)),
                format!(
                    "{} of {}",
                    bytes(&n["memory_used"]),
                    bytes(&n["memory_bytes"])
                ),
                bytes(&n["disk_free"]),
                bytes(&n["cache_bytes"]),
                text(&n["queries"]),
                text(&n["pg"]),
            ]
        }),
    )
}

fn queries(list: &Value, all: bool) -> String {
    let live = |q: &&Value| matches!(q["state"].as_str(), Some("queued" | "running"));
    table(
        &[
            "id", "pid", "user", "state", "progress", "elapsed", "memory", "spilled", "rows",
            "query",
        ],
        list.as_array()
            .into_iter()
            .flatten()
            .filter(|q| all || live(q))
            .map(|q| {
                let mut query: String = text(&q["query"])
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                if query.chars().count() > 60 {
                    query = query.chars().take(59).collect::<String>() + "…";
                }
                vec![
                    text(&q["id"]),
                    text(&q["pid"]),
                    text(&q["user"]),
                    text(&q["state"]),
                    q["progress"]
                        .as_f64()
                        .map(|p| format!("{:.0} %", p * 100.0))
                        .unwrap_or_default(),
                    format!("{:.1} s", q["elapsed_ms"].as_f64().unwrap_or(0.0) / 1000.0),
                    bytes(&q["memory"]),
                    bytes(&q["spilled_bytes"]),
                    text(&q["rows"]),
                    query,
                ]
            }),
    )
}

fn rpc_bench(answer: &Value) -> String {
    let from = text(&answer["from"]);
    let rows = answer["to"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|peer| {
            let to = text(&peer["node"]);
            let from = from.clone();
            peer["sizes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |f| {
                    vec![
                        format!("{from} → {to}"),
                        bytes(&f["bytes"]),
                        format!("{:.0} µs", f["round_trip_us"].as_f64().unwrap_or(0.0)),
                        format!("{:.1} MB/s", f["mb_per_s"].as_f64().unwrap_or(0.0)),
                    ]
                })
        });
    table(&["link", "message", "round trip", "throughput"], rows)
}

fn table(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut table = comfy_table::Table::new();
    table.load_preset("||--+-++|    ++++++");
    table.set_header(header.iter().copied());
    for row in rows {
        table.add_row(row);
    }
    table.to_string()
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn bytes(v: &Value) -> String {
    v.as_u64()
        .map(|b| cirro_exec::resources::format_bytes(b as usize))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_live_statements_unless_all() {
        let list = serde_json::json!([
            {"id": 1, "pid": 7, "user": "a", "state": "running", "progress": 0.5,
             "elapsed_ms": 1500, "memory": 1048576, "spilled_bytes": 0, "rows": 3,
             "query": "SELECT  1"},
            {"id": 2, "pid": 7, "user": "a", "state": "finished", "progress": 1.0,
             "elapsed_ms": 10, "memory": 0, "spilled_bytes": 0, "rows": 1,
             "query": "SELECT 2"},
        ]);
        let live = queries(&list, false);
        assert!(live.contains("SELECT 1") && live.contains("50 %"), "{live}");
        assert!(!live.contains("SELECT 2"), "{live}");
        assert!(queries(&list, true).contains("SELECT 2"));
    }
}
