//! A cluster started by `scripts/cluster` (ZooKeeper, optionally HDFS, N
//! nodes in network namespaces), stopped when dropped. The tests drive it
//! with psql, as a person reproducing them by hand would.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use super::cirro_bin;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// `host:port` of each node's PostgreSQL protocol (node 1 first).
    pub pg: Vec<String>,
    /// `host:port` of each node's Flight SQL.
    pub flight: Vec<String>,
    /// `host:port` of each node's web console and HTTP API.
    pub http: Vec<String>,
    pub password: String,
    /// Environment variables the nodes were started with (and restarted).
    envs: Vec<(String, String)>,
}

/// `scripts/cluster ARGS --dir DIR`, with this build's binary and `envs`
/// (which the nodes it starts inherit).
fn run_script(dir: &Path, args: &[&str], envs: &[(String, String)]) -> std::io::Result<Output> {
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .env("CIRRO_BIN", cirro_bin())
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .output()
}

impl Cluster {
    /// `scripts/cluster up --nodes N --storage STORAGE`.
    pub fn up(nodes: usize, storage: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("cirro-cluster-")
            .tempdir()
            .expect("tempdir");
        Self::up_in(dir, nodes, storage)
    }

    /// [`Cluster::up`] with environment variables for every node.
    pub fn up_with_env(nodes: usize, storage: &str, envs: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("cirro-cluster-")
            .tempdir()
            .expect("tempdir");
        let envs = envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::start(dir, nodes, storage, envs)
    }

    /// [`Cluster::up`] in `dir` (which may hold a data location, `data/`).
    pub fn up_in(dir: tempfile::TempDir, nodes: usize, storage: &str) -> Self {
        Self::start(dir, nodes, storage, Vec::new())
    }

    fn start(
        dir: tempfile::TempDir,
        nodes: usize,
        storage: &str,
        envs: Vec<(String, String)>,
    ) -> Self {
        let nodes_arg = nodes.to_string();
        let out = run_script(
            dir.path(),
            &["up", "--nodes", &nodes_arg, "--storage", storage],
            &envs,
        )
        .expect("run scripts/cluster");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            // Whatever started (ZooKeeper, HDFS, namespaces) goes again.
            let _ = run_script(dir.path(), &["down"], &[]);
        }
        assert!(
            out.status.success(),
            "scripts/cluster up failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Vec::new();
        let mut flight = Vec::new();
        let mut http = Vec::new();
        for line in stdout.lines().filter(|l| l.starts_with("node")) {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                    .to_string()
            };
            pg.push(field("pg="));
            flight.push(field("flight="));
            http.push(field("http="));
        }
        assert_eq!(pg.len(), nodes, "{stdout}");
        let password = std::fs::read_to_string(dir.path().join("password"))
            .expect("password file")
            .trim()
            .to_string();
        Cluster {
            dir,
            pg,
            flight,
            http,
            password,
            envs,
        }
    }

    /// `scripts/cluster ARGS --dir D`, which must succeed.
    pub fn script(&self, args: &[&str]) -> String {
        let out = run_script(self.dir.path(), args, &self.envs).expect("run scripts/cluster");
        assert!(
            out.status.success(),
            "scripts/cluster {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The variables of `D/state` (ZK_PORT, SUBNET, DATA, …).
    pub fn state(&self) -> HashMap<String, String> {
        std::fs::read_to_string(self.dir.path().join("state"))
            .expect("state")
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect()
    }

    /// `zk://…` as the nodes reach ZooKeeper.
    pub fn zk_url(&self) -> String {
        let state = self.state();
        let host = if state["NETNS"] == "1" {
            format!("10.77.{}.1", state["SUBNET"])
        } else {
            "127.0.0.1".to_string()
        };
        format!("zk://{host}:{}{}", state["ZK_PORT"], state["ZK_PATH"])
    }

    /// The pid of node `i` (from 1).
    pub fn pid(&self, i: usize) -> i32 {
        std::fs::read_to_string(self.dir.path().join(format!("node{i}/pid")))
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid")
    }

    pub fn conninfo(&self, node: usize) -> String {
        let (host, port) = self.pg[node - 1].rsplit_once(':').expect("host:port");
        format!("host={host} port={port} user=cirro dbname=cirro sslmode=disable")
    }

    /// psql against node `node` (from 1) with `args`.
    pub fn psql(&self, node: usize, args: &[&str]) -> Output {
        Command::new("psql")
            .arg(self.conninfo(node))
            .args(["-X", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose"])
            .args(args)
            .env("PGPASSWORD", &self.password)
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("run psql")
    }

    /// Run SQL through node `node`; stdout (unaligned, tuples only).
    pub fn sql(&self, node: usize, sql: &str) -> String {
        let out = self.psql(node, &["-At", "-c", sql]);
        assert!(
            out.status.success(),
            "node{node}: {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Run SQL that must fail through node `node`; its error (verbose).
    pub fn sql_err(&self, node: usize, sql: &str) -> String {
        let out = self.psql(node, &["-At", "-c", sql]);
        assert!(!out.status.success(), "node{node}: {sql} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run_script(self.dir.path(), &["down"], &[]);
        // A failed test shows what its nodes logged (the directory goes).
        if std::thread::panicking() {
            for i in 1..=self.pg.len() {
                let log = self.dir.path().join(format!("node{i}/log"));
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(40)..];
                eprintln!(
                    "--- node{i}/log (last {} lines)\n{}",
                    tail.len(),
                    tail.join("\n")
                );
            }
        }
    }
}
