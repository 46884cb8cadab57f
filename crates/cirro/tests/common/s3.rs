//! A local S3 server (moto's, from the test venv) for the tests of `s3://`
//! data locations, stopped on drop.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::server::python;

pub struct S3Server {
    child: Child,
    pub port: u16,
    endpoint: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One HTTP/1.1 request to the server; returns the status line.
fn request(port: u16, method: &str, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply.lines().next().unwrap_or_default().to_string())
}

impl S3Server {
    /// Start the server; it answers within 30 s or the test fails.
    pub fn start() -> Self {
        let port = free_port();
        let child = Command::new(python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto's S3 server (tests/interop/requirements.txt)");
        let server = Self {
            child,
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        while request(port, "GET", "/").is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the S3 server did not answer in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// Create bucket `name`.
    pub fn bucket(&self, name: &str) {
        let status = request(self.port, "PUT", &format!("/{name}")).expect("create bucket");
        assert!(status.contains(" 200"), "create bucket {name}: {status}");
    }

    /// How many objects the bucket holds under `prefix`.
    pub fn count(&self, bucket: &str, prefix: &str) -> usize {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        write!(
            stream,
            "GET /{bucket}?list-type=2&prefix={prefix} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        )
        .expect("write");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).expect("read");
        reply.matches("<Key>").count()
    }

    /// The environment a `cirro` process needs to reach the server.
    pub fn envs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "test".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "test".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
