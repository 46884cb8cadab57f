//! `cirro`: the one binary of Cirro.
//!
//! - `cirro sql` — the SQL shell, or a script runner with `-c` / `-f`;
//! - `cirro load tpch|ssb` — generate and load the benchmark data sets;
//! - `cirro serve` — the PostgreSQL-protocol server;
//! - `cirro bench` — the benchmark suites beside the peers (`bench/`);
//! - `cirro admin` — a running node's status, nodes and statements, and
//!   cancel (through its HTTP API).
//!
//! Every command works on one data location (`--data`, `CIRRO_DATA`, default
//! `./cirro-data`), which holds the catalog and the tables.

mod admin;
mod bench;
mod load;
mod meta;
mod output;
mod shell;

use std::process::ExitCode;

use cirro_common::{CirroError, SqlState};
use cirro_engine::{Engine, EngineConfig, Flag, Node, NodeConfig};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "cirro",
    version,
    about = "Cirro: a SQL analytics engine for data on shared storage"
)]
struct Cli {
    /// Data location: a directory (created if missing) or a file:// URL.
    #[arg(
        long,
        global = true,
        env = "CIRRO_DATA",
        default_value = "./cirro-data"
    )]
    data: String,
    /// Threads for query execution (DataFusion target_partitions); default: all cores.
    #[arg(long, global = true, env = "CIRRO_THREADS")]
    threads: Option<usize>,
    /// Everything the process may hold in memory, the hot-data tier and
    /// the queries together: bytes, with kB/MB/GB, or a share of RAM
    /// (`80%`, the default).
    #[arg(long, global = true, env = "CIRRO_MEMORY_LIMIT", default_value = "80%")]
    memory_limit: String,
    /// A query's memory unless `SET memory_limit` says otherwise: bytes,
    /// with kB/MB/GB, or a share of the queries' memory (`25%`, the
    /// default), which is --memory-limit less the hot-data tier.
    #[arg(long, global = true, env = "CIRRO_QUERY_MEMORY", default_value = "25%")]
    query_memory: String,
    /// Where queries write what does not fit their memory (default: the
    /// system's temporary folder's `cirro-spill`).
    #[arg(long, global = true, env = "CIRRO_SPILL_DIR")]
    spill_dir: Option<std::path::PathBuf>,
    /// Statements that run at once; the rest wait (state `queued`) until
    /// one ends (default: twice the cores, at least 4). A running
    /// statement also reserves its memory limit: those that do not fit
    /// the queries' memory wait too.
    #[arg(long, global = true, env = "CIRRO_MAX_RUNNING_QUERIES")]
    max_running_queries: Option<usize>,
    /// Memory of the hot-data tier (decoded column chunks of hot tables),
    /// part of --memory-limit: bytes, with kB/MB/GB, or a share of the
    /// memory limit (`30%`, the default); 0 turns it off.
    #[arg(long, global = true, env = "CIRRO_CACHE_MEMORY", default_value = "30%")]
    cache_memory: String,
    /// Device memory the GPU operators may use: bytes, with kB/MB/GB
    /// (default 1GB).
    #[arg(long, global = true, env = "CIRRO_GPU_MEMORY", default_value = "1GB")]
    gpu_memory: String,
    /// What leaves device memory first: `cdr` (cost-driven replacement, the
    /// default), `lru`, `mru`, `lfu` or `random` (for comparison).
    #[arg(long, global = true, env = "CIRRO_GPU_POLICY", default_value = "cdr")]
    gpu_policy: String,
    /// What the hot-data tier evicts first: `plan` (priorities from the query
    /// plan, the default) or `lru` (least recently used, for comparison).
    #[arg(
        long,
        global = true,
        env = "CIRRO_CACHE_POLICY",
        default_value = "plan"
    )]
    cache_policy: String,
    /// The local-disk tier: a folder on a fast local disk where blocks of the
    /// data files read from HDFS or S3 are kept (no effect on local data).
    #[arg(long, global = true, env = "CIRRO_CACHE_DIR")]
    cache_dir: Option<std::path::PathBuf>,
    /// How much the disk tier may hold: bytes, with kB/MB/GB/TB, or a share
    /// of its file system (`50%`, the default).
    #[arg(
        long,
        global = true,
        env = "CIRRO_CACHE_DIR_SIZE",
        default_value = "50%"
    )]
    cache_dir_size: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run SQL: an interactive shell, or the statements of -c and -f.
    Sql(SqlArgs),
    /// Generate and load a benchmark data set.
    Load {
        #[command(subcommand)]
        dataset: load::Dataset,
    },
    /// Serve the data location over the PostgreSQL protocol.
    Serve(ServeArgs),
    /// Inspect and control running nodes through any node's HTTP API:
    /// `cirro admin [--url URL] status|nodes|queries|cancel ID|rpc-bench`.
    Admin(admin::AdminArgs),
    /// Benchmark Cirro beside its peers: `cirro bench <tpch|ssb|joins|aggregation|dml|micro>
    /// [--sf N] [--threads T] [--peers a,b,…]` (`cirro bench --help` for all options).
    #[command(disable_help_flag = true)]
    Bench {
        /// The suite and options, passed to the harness in bench/.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "CIRRO_LISTEN", default_value = "127.0.0.1")]
    listen: String,
    /// Port of the PostgreSQL protocol (0 picks a free one, printed at start).
    #[arg(long, env = "CIRRO_PG_PORT", default_value_t = 5433)]
    pg_port: u16,
    /// Port of Arrow Flight SQL (0 picks a free one, printed at start).
    #[arg(long, env = "CIRRO_FLIGHT_PORT", default_value_t = 50051)]
    flight_port: u16,
    /// Port of the web console and HTTP API (0 picks a free one, printed at
    /// start); served over TLS when the server has a certificate.
    #[arg(long, env = "CIRRO_HTTP_PORT", default_value_t = 8080)]
    http_port: u16,
    /// Serve no web console or HTTP API.
    #[arg(long, conflicts_with = "http_port")]
    no_http: bool,
    /// Keep small writes (INSERT of VALUES; UPDATE and DELETE by primary
    /// key) in in-memory row stores behind a write-ahead log, flushed into
    /// the tables' files in the background (see docs/architecture.md).
    /// `auto`: on for a single node whose data is a local directory (unless
    /// another server holds its log), off on a cluster and for remote data.
    #[arg(long, env = "CIRRO_ROW_STORE", default_value = "auto", value_parser = ["auto", "on", "off"])]
    row_store: String,
    /// How often, in seconds, the background flush writes the row stores
    /// into the tables' files (sooner past their memory budget).
    #[arg(long, env = "CIRRO_ROW_STORE_FLUSH", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    row_store_flush: u64,
    /// The write-ahead log's directory (default: `_cirro_wal` in a local
    /// data directory; for remote data, a directory named after it under
    /// `$XDG_STATE_HOME/cirro/wal`, or `~/.local/state/cirro/wal`).
    #[arg(long, env = "CIRRO_WAL_DIR")]
    wal_dir: Option<std::path::PathBuf>,
    /// Statements that take at least this many milliseconds go to the
    /// slow-query log.
    #[arg(long, env = "CIRRO_SLOW_QUERY_MS", default_value_t = 10_000)]
    slow_query_ms: u64,
    /// The slow-query log: a file of JSON lines (default: standard error).
    #[arg(long, env = "CIRRO_SLOW_QUERY_LOG")]
    slow_query_log: Option<std::path::PathBuf>,
    /// TLS certificate chain (PEM); with --tls-key enables TLS on both
    /// protocols and the web console.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<String>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<String>,
    /// Refuse connections that do not use TLS.
    #[arg(long)]
    require_tls: bool,
    /// Join a cluster whose state ZooKeeper keeps:
    /// zk://host:port[,host:port…][/path] (all nodes share --data).
    #[arg(long, env = "CIRRO_CLUSTER")]
    cluster: Option<String>,
    /// This node's name in the cluster (default: its PostgreSQL address).
    #[arg(long, env = "CIRRO_NODE_ID", requires = "cluster")]
    node_id: Option<String>,
    /// The host other nodes and clients reach this node at (default: the
    /// listen address, or the host name when listening on 0.0.0.0).
    #[arg(long, env = "CIRRO_ADVERTISE", requires = "cluster")]
    advertise: Option<String>,
    /// Seconds SIGTERM waits for running statements before the node leaves
    /// the cluster.
    #[arg(long, default_value_t = 30, requires = "cluster")]
    drain_timeout: u64,
    /// Port of the worker service, where other nodes send query stages
    /// (0 picks a free one).
    #[arg(
        long,
        env = "CIRRO_WORKER_PORT",
        default_value_t = 0,
        requires = "cluster"
    )]
    worker_port: u16,
    /// The secret workers require of the nodes that send them tasks (the
    /// same on every node; default: one kept in ZooKeeper).
    #[arg(
        long,
        env = "CIRRO_CLUSTER_SECRET",
        hide_env_values = true,
        requires = "cluster"
    )]
    cluster_secret: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct SqlArgs {
    /// SQL to run (several statements separated by ';'); may be repeated.
    #[arg(short = 'c', long = "command")]
    commands: Vec<String>,
    /// A file of SQL statements to run; may be repeated ('-' reads stdin).
    #[arg(short = 'f', long = "file")]
    files: Vec<String>,
    /// Output format of query results.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Field delimiter for --format csv.
    #[arg(long, default_value = ",")]
    delimiter: String,
    /// Text printed for NULL in csv and table output (default: empty).
    #[arg(long, default_value = "")]
    null: String,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

/// Rust's allocations go to jemalloc, not glibc malloc. With glibc the
/// server's threads shared its arenas (bounded by the cores, see
/// [`limit_malloc_arenas`]), and which threads shared an arena was settled
/// per process: two processes of one binary ran TPC-H SF10 Q20 in 0.28 s
/// or 0.59 s, the slow ones waiting on arena locks (futex waits, a fifth of
/// the CPU in the kernel). jemalloc's per-thread caches and arenas keep the
/// times alike from process to process (4 starts: Q20 0.28–0.30 s, Q18
/// 2.20–2.26 s against glibc's 2.29–2.91 s).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts: a background thread hands
/// freed pages back to the system one second after they are freed (a
/// server's resident memory falls back after a busy moment, as the soak
/// test asks), without waiting for the next allocation.
#[allow(non_upper_case_globals, unsafe_code)] // the symbol jemalloc reads its options from
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// For a long-running server: every few seconds, hand the memory glibc
/// malloc holds free back to the system (`malloc_trim`). Without it the
/// resident memory stays at the high-water mark of the busiest moment,
/// fragmented across arenas.
#[allow(unsafe_code)] // one FFI call to glibc, see SAFETY below
fn trim_malloc_periodically() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    std::thread::spawn(|| {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(5));
            // SAFETY: malloc_trim only releases free memory; 0 keeps no pad.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
}

/// Bound glibc malloc's arenas by the cores (glibc still serves the C
/// libraries' allocations: compression codecs, the Vulkan driver). Its default (8 per core) lets a
/// server whose many threads allocate large query buffers keep freed memory
/// in each arena: in the 32-client soak the resident memory grew ~150 MB every
/// 15 s with the default and ~35 MB with this (mimalloc grew more).
#[allow(unsafe_code)] // one FFI call to glibc, see SAFETY below
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        // SAFETY: mallopt only changes a malloc tunable; M_ARENA_MAX takes a count.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, cores.max(2) as libc::c_int);
        }
    }
}

/// Without a desktop session (no `XDG_RUNTIME_DIR`, `WAYLAND_DISPLAY` or
/// `DISPLAY`: a server, a container, CI), turn off Mesa's `device_select`
/// Vulkan layer for this process (`NODEVICE_SELECT`). The layer ranks
/// devices by the display they drive; with no display it has nothing to
/// rank, and its probe of Wayland printed "error: XDG_RUNTIME_DIR is
/// invalid or not set in the environment." on stderr whenever the GPU
/// operators opened their device. Set explicitly, the variable is kept.
#[allow(unsafe_code)] // one change of the environment, see SAFETY below
fn headless_vulkan() {
    #[cfg(all(target_os = "linux", feature = "gpu"))]
    {
        let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        if ![
            "XDG_RUNTIME_DIR",
            "WAYLAND_DISPLAY",
            "DISPLAY",
            "NODEVICE_SELECT",
        ]
        .into_iter()
        .any(set)
        {
            // SAFETY: called first thing in `main`, before any other thread
            // exists, so nothing reads the environment concurrently.
            unsafe {
                std::env::set_var("NODEVICE_SELECT", "1");
            }
        }
    }
}

fn main() -> ExitCode {
    headless_vulkan();
    limit_malloc_arenas();
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // Statements are parsed, planned and run on threads whose stack holds the
    // deepest expression the limits allow (cirro_common::limits): the
    // runtime's workers and blocking threads, and this one for the shell.
    let stack = cirro_common::limits::STATEMENT_THREAD_STACK_BYTES;
    let main = std::thread::Builder::new()
        .name("cirro-main".into())
        .stack_size(stack)
        .spawn(move || run_main(cli, stack));
    let code = main.map(|thread| thread.join());
    match code {
        Ok(Ok(code)) => code,
        Ok(Err(_)) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ERROR: cannot start the main thread: {e} (SQLSTATE XX000)");
            ExitCode::FAILURE
        }
    }
}

fn run_main(cli: Cli, stack: usize) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(stack)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ERROR: cannot start the runtime: {e} (SQLSTATE XX000)");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            output::print_error(&e);
            ExitCode::FAILURE
        }
    }
}

/// The row stores' set-up from `--row-store` and `--wal-dir`.
fn row_store_config(
    data: &str,
    args: &ServeArgs,
) -> Result<Option<cirro_catalog::rows::RowStoreConfig>, CirroError> {
    let local = match data.strip_prefix("file://") {
        Some(path) => Some(std::path::PathBuf::from(path)),
        None => (!data.contains("://")).then(|| std::path::PathBuf::from(data)),
    };
    let on = match args.row_store.as_str() {
        "on" => true,
        // The log of a cluster's writes is not kept yet (one owner per
        // table, replicated: to come), and remote data's log would sit on
        // one machine's disk: both are asked for by name.
        "auto" => args.cluster.is_none() && local.is_some(),
        _ => false,
    };
    if !on {
        return Ok(None);
    }
    let wal_dir = match (&args.wal_dir, local) {
        (Some(dir), _) => dir.clone(),
        (None, Some(dir)) => dir.join("_cirro_wal"),
        (None, None) => remote_wal_dir(data)?,
    };
    Ok(Some(cirro_catalog::rows::RowStoreConfig {
        wal_dir,
        budget: 256 << 20,
        flush_every: std::time::Duration::from_secs(args.row_store_flush),
    }))
}

/// The local directory of the write-ahead log of remote data `data` (an
/// `hdfs://` or `s3://` URL): named after the URL, under the user's state
/// directory, so that the same data finds its log again.
fn remote_wal_dir(data: &str) -> Result<std::path::PathBuf, CirroError> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".local/state")))
        .ok_or_else(|| {
            CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                "--row-store on with remote data needs --wal-dir (a local directory): \
                 neither XDG_STATE_HOME nor HOME is set",
            )
        })?;
    let name: String = data
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Ok(state.join("cirro/wal").join(name))
}

/// The local-disk tier in `dir` (`--cache-dir`), sized by `size`
/// (`--cache-dir-size`).
fn open_disk_tier(
    dir: &std::path::Path,
    size: &str,
    data: &str,
) -> Result<std::sync::Arc<cirro_storage::cache::disk::DiskTier>, CirroError> {
    use cirro_storage::cache::disk;
    let bad = |e: String| CirroError::new(cirro_common::SqlState::INVALID_PARAMETER_VALUE, e);
    std::fs::create_dir_all(dir)
        .map_err(|e| bad(format!("--cache-dir: cannot create {}: {e}", dir.display())))?;
    let disk_size = disk::file_system_size(dir).unwrap_or(0);
    let budget = cirro_common::limits::parse_size(size, disk_size)
        .map_err(|e| bad(format!("--cache-dir-size: {e}")))?;
    let tier = disk::DiskTier::open(dir, budget).map_err(|e| bad(format!("--cache-dir: {e}")))?;
    let remote = ["s3://", "s3a://", "hdfs://"]
        .iter()
        .any(|scheme| data.starts_with(scheme));
    if !remote {
        log::warn!(
            "--cache-dir keeps blocks of data read from HDFS or S3; the data location {data} is local, so it holds nothing"
        );
    }
    Ok(std::sync::Arc::new(tier))
}

/// The flags of this process, as read-only settings (`SHOW cirro.*`).
fn flags(cli: &Cli, node: &Node) -> Vec<Flag> {
    let flag = |name, value: String, description| Flag {
        name,
        value,
        description,
    };
    let mut flags = vec![
        flag(
            "cirro.data",
            cli.data.clone(),
            "data location (--data, CIRRO_DATA)",
        ),
        flag(
            "cirro.memory_limit",
            cli.memory_limit.clone(),
            "memory of the process: hot-data tier and queries (--memory-limit, CIRRO_MEMORY_LIMIT)",
        ),
        flag(
            "cirro.query_memory",
            cli.query_memory.clone(),
            "a query's memory unless SET memory_limit says otherwise (--query-memory, CIRRO_QUERY_MEMORY)",
        ),
        flag(
            "cirro.spill_dir",
            node.resources().config().spill_dir.display().to_string(),
            "where queries spill (--spill-dir, CIRRO_SPILL_DIR)",
        ),
        flag(
            "cirro.max_running_queries",
            node.resources().admission().max_running().to_string(),
            "statements that run at once; the rest are queued (--max-running-queries, CIRRO_MAX_RUNNING_QUERIES)",
        ),
        flag(
            "cirro.cache_memory",
            cli.cache_memory.clone(),
            "memory of the hot-data tier (--cache-memory, CIRRO_CACHE_MEMORY)",
        ),
        flag(
            "cirro.cache_policy",
            cli.cache_policy.clone(),
            "eviction policy of the hot-data tier: plan or lru (--cache-policy)",
        ),
        flag(
            "cirro.cache_dir",
            cli.cache_dir
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            "folder of the local-disk tier for HDFS/S3 data (--cache-dir, CIRRO_CACHE_DIR); empty: none",
        ),
        flag(
            "cirro.cache_dir_size",
            cli.cache_dir_size.clone(),
            "what the local-disk tier may hold (--cache-dir-size, CIRRO_CACHE_DIR_SIZE)",
        ),
        flag(
            "cirro.gpu_memory",
            cli.gpu_memory.clone(),
            "device memory of the GPU operators (--gpu-memory, CIRRO_GPU_MEMORY)",
        ),
        flag(
            "cirro.gpu_policy",
            cli.gpu_policy.clone(),
            "what leaves device memory first (--gpu-policy, CIRRO_GPU_POLICY)",
        ),
        flag(
            "cirro.threads",
            cli.threads
                .map(|t| t.to_string())
                .unwrap_or_else(|| "all cores".into()),
            "threads for query execution (--threads, CIRRO_THREADS)",
        ),
    ];
    if let Command::Serve(args) = &cli.command {
        flags.extend([
            flag(
                "cirro.listen",
                args.listen.clone(),
                "address the server listens on (--listen, CIRRO_LISTEN)",
            ),
            flag(
                "cirro.pg_port",
                args.pg_port.to_string(),
                "PostgreSQL protocol port (--pg-port, CIRRO_PG_PORT)",
            ),
            flag(
                "cirro.flight_port",
                args.flight_port.to_string(),
                "Arrow Flight SQL port (--flight-port, CIRRO_FLIGHT_PORT)",
            ),
            flag(
                "cirro.http_port",
                if args.no_http {
                    "off".to_string()
                } else {
                    args.http_port.to_string()
                },
                "web console and HTTP API port (--http-port, CIRRO_HTTP_PORT; --no-http: off)",
            ),
            flag(
                "cirro.slow_query_ms",
                args.slow_query_ms.to_string(),
                "statements at least this slow go to the slow-query log (--slow-query-ms, --slow-query-log)",
            ),
            flag(
                "cirro.tls",
                (args.tls_cert.is_some()).to_string(),
                "TLS with --tls-cert and --tls-key",
            ),
            flag(
                "cirro.cluster",
                args.cluster.clone().unwrap_or_default(),
                "the cluster's ZooKeeper (--cluster, CIRRO_CLUSTER); empty on a single node",
            ),
            flag(
                "cirro.require_tls",
                args.require_tls.to_string(),
                "refuse connections without TLS (--require-tls)",
            ),
        ]);
    }
    flags
}

/// The node the flags describe: memory, tiers, GPU.
fn node(cli: &Cli) -> Result<Node, CirroError> {
    let memory = cirro_storage::cache::physical_memory().unwrap_or(4 << 30);
    let bad = |e: String| CirroError::new(cirro_common::SqlState::INVALID_PARAMETER_VALUE, e);
    let memory_limit = cirro_common::limits::parse_size(&cli.memory_limit, memory)
        .map_err(|e| bad(format!("--memory-limit: {e}")))?;
    let cache_memory = cirro_common::limits::parse_size(&cli.cache_memory, memory_limit)
        .map_err(|e| bad(format!("--cache-memory: {e}")))?;
    let queries = memory_limit.saturating_sub(cache_memory);
    let query_memory = cirro_common::limits::parse_size(&cli.query_memory, queries)
        .map_err(|e| bad(format!("--query-memory: {e}")))?;
    let mut resources = cirro_exec::resources::ResourceConfig::defaults(cache_memory as usize);
    resources.memory_limit = memory_limit as usize;
    resources.query_memory =
        (query_memory as usize).max(cirro_exec::resources::QUERY_MEMORY_MIN_BYTES);
    if let Some(dir) = &cli.spill_dir {
        resources.spill_dir = dir.clone();
    }
    if let Some(n) = cli.max_running_queries {
        if n == 0 {
            return Err(bad("--max-running-queries: at least 1".into()));
        }
        resources.max_running = n;
    }
    let cache_policy: cirro_storage::cache::Policy = cli
        .cache_policy
        .parse()
        .map_err(|e: String| bad(format!("--cache-policy: {e}")))?;
    let gpu_memory = cirro_common::limits::parse_size(&cli.gpu_memory, u64::MAX)
        .map_err(|e| bad(format!("--gpu-memory: {e}")))?;
    let disk = match &cli.cache_dir {
        Some(dir) => Some(open_disk_tier(dir, &cli.cache_dir_size, &cli.data)?),
        None => None,
    };
    Node::new(NodeConfig {
        resources,
        cache_policy,
        disk,
        gpu_memory,
        gpu_policy: cli.gpu_policy.clone(),
    })
}

async fn run(cli: Cli) -> Result<ExitCode, CirroError> {
    let node = std::sync::Arc::new(node(&cli)?);
    let config = EngineConfig {
        target_partitions: cli.threads,
        flags: std::sync::Arc::new(flags(&cli, &node)),
        node: std::sync::Arc::clone(&node),
        ..Default::default()
    };
    let code = run_with(cli, config).await;
    // The node's spill folder (its files are gone with their queries).
    node.close();
    code
}

/// Run the command over the node of `config`.
async fn run_with(cli: Cli, config: EngineConfig) -> Result<ExitCode, CirroError> {
    if let Command::Bench { args } = &cli.command {
        return bench::run(args, cli.threads);
    }
    if let Command::Admin(args) = cli.command {
        return admin::run(args).await;
    }
    if let Command::Serve(args) = cli.command {
        trim_malloc_periodically();
        let row_store = row_store_config(&cli.data, &args)?;
        cirro_server::serve(cirro_server::ServerConfig {
            data: cli.data,
            listen: args.listen,
            pg_port: args.pg_port,
            flight_port: args.flight_port,
            http_port: (!args.no_http).then_some(args.http_port),
            slow_query: std::time::Duration::from_millis(args.slow_query_ms),
            slow_query_log: args.slow_query_log,
            tls: args.tls_cert.zip(args.tls_key),
            require_tls: args.require_tls,
            engine: config,
            row_store,
            row_store_optional: args.row_store == "auto",
            cluster: args.cluster.map(|url| cirro_server::ClusterOptions {
                url,
                node_id: args.node_id,
                advertise: args.advertise,
                drain_timeout: std::time::Duration::from_secs(args.drain_timeout),
                worker_port: args.worker_port,
                secret: args.cluster_secret,
            }),
        })
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    let engine = Engine::open(&cli.data, config).await?;
    match cli.command {
        Command::Sql(args) => shell::run(&engine, args).await,
        Command::Load { dataset } => load::run(&engine, dataset)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Serve(_) | Command::Bench { .. } | Command::Admin(_) => Ok(ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `--row-store`'s set-up for `cirro --data DATA serve ARGS…`.
    fn row_store(data: &str, args: &[&str]) -> Result<Option<std::path::PathBuf>, CirroError> {
        let cli = Cli::try_parse_from(
            ["cirro", "--data", data, "serve"]
                .iter()
                .chain(args)
                .copied(),
        )
        .expect("arguments");
        let Command::Serve(serve) = cli.command else {
            panic!("not serve");
        };
        Ok(row_store_config(data, &serve)?.map(|c| c.wal_dir))
    }

    /// `--row-store auto`, the default, is on for a single node with local
    /// data, its log in the data directory; off on a cluster and for remote
    /// data, whose log goes to a local directory when asked for.
    #[test]
    fn the_row_store_is_on_for_a_local_single_node() {
        let wal = |data: &str, args: &[&str]| row_store(data, args).unwrap();
        let auto = |data: &str, more: &[&str]| {
            let mut args = vec!["--row-store", "auto"];
            args.extend_from_slice(more);
            wal(data, &args)
        };
        assert_eq!(
            wal("/d", &[]),
            Some(std::path::PathBuf::from("/d/_cirro_wal")),
            "auto by default"
        );
        assert_eq!(wal("/d", &["--row-store", "off"]), None);
        assert_eq!(
            auto("/d", &[]),
            Some(std::path::PathBuf::from("/d/_cirro_wal"))
        );
        assert_eq!(
            auto("file:///d", &[]),
            Some(std::path::PathBuf::from("/d/_cirro_wal"))
        );
        assert_eq!(auto("hdfs://nn:8020/w", &[]), None);
        assert_eq!(auto("/d", &["--cluster", "zk://127.0.0.1:2181"]), None);
        assert_eq!(
            wal("/d", &["--row-store", "on", "--wal-dir", "/l"]),
            Some(std::path::PathBuf::from("/l"))
        );
        let remote = wal("hdfs://nn:8020/w", &["--row-store", "on"]).expect("on");
        assert!(
            remote.ends_with("cirro/wal/hdfs___nn_8020_w"),
            "{}",
            remote.display()
        );
    }
}
