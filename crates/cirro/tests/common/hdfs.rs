//! A MiniDFSCluster (scripts/minidfs.sh) for the tests of `hdfs://` data
//! locations, stopped on drop.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};

pub struct Hdfs {
    child: Child,
    /// Held open: the cluster stops when it closes.
    _stdin: ChildStdin,
    /// `hdfs://127.0.0.1:PORT`
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Hdfs {
    /// Start a name node and `data_nodes` data nodes.
    pub fn start(data_nodes: usize) -> Self {
        let script = std::env::var("CIRRO_TEST_MINIDFS")
            .expect("CIRRO_TEST_MINIDFS is not set: run the tests with scripts/test.sh");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new("bash")
            .arg(script)
            .arg(dir.path())
            .args(["0", &data_nodes.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the MiniDFSCluster");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let url = stdout
            .lines()
            .map_while(Result::ok)
            .find_map(|line| line.strip_prefix("ready ").map(str::to_string))
            .expect("the MiniDFSCluster did not start");
        Self {
            child,
            _stdin: stdin,
            url,
            _dir: dir,
        }
    }
}

impl Drop for Hdfs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
