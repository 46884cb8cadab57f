//! The interactive shell in a real terminal (tmux): multi-line input, and
//! Ctrl-C cancelling a running query without leaving the shell.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{DataDir, cirro_bin};

const WAIT_SECS_MAX: u64 = 60;

struct Tmux {
    session: String,
}

impl Tmux {
    fn start(command: &str) -> Self {
        let session = format!("cirro-shell-test-{}", std::process::id());
        let status = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &session,
                "-x",
                "160",
                "-y",
                "50",
                command,
            ])
            .status()
            .expect("tmux must be installed (Debian package tmux; .ci/run installs it)");
        assert!(status.success(), "tmux new-session failed");
        Self { session }
    }

    /// Type `text` literally. tmux takes an argument ending in ';' as a command
    /// separator, so a trailing space is typed after it.
    fn type_text(&self, text: &str) {
        let text = if text.ends_with(';') {
            format!("{text} ")
        } else {
            text.to_string()
        };
        let status = Command::new("tmux")
            .args(["send-keys", "-l", "-t", &self.session, &text])
            .status()
            .expect("send-keys");
        assert!(status.success());
    }

    fn key(&self, key: &str) {
        let status = Command::new("tmux")
            .args(["send-keys", "-t", &self.session, key])
            .status()
            .expect("send-keys");
        assert!(status.success());
    }

    fn line(&self, text: &str) {
        self.type_text(text);
        self.key("Enter");
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .expect("capture");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait_for(&self, text: &str) -> String {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                started.elapsed() < Duration::from_secs(WAIT_SECS_MAX),
                "'{text}' never appeared; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .status();
    }
}

#[test]
fn ctrl_c_cancels_the_running_query_and_the_shell_carries_on() {
    let data = DataDir::new();
    let command = format!(
        "env HOME={} {} --data {} sql",
        data.path().display(),
        cirro_bin(),
        data.path().display()
    );
    let tmux = Tmux::start(&command);
    tmux.wait_for("cirro=>");
    tmux.line("SELECT sum(value) FROM generate_series(1, 100000000000);");
    std::thread::sleep(Duration::from_millis(1500));
    tmux.key("C-c");
    tmux.wait_for("canceling statement due to user request (SQLSTATE 57014)");
    // Still alive: a statement over two lines runs.
    tmux.line("SELECT 40 + 2");
    tmux.wait_for("cirro->");
    tmux.line("AS answer;");
    let screen = tmux.wait_for("(1 row)");
    assert!(screen.contains("| 42     |"), "{screen}");
    tmux.line("\\q");
    // History was written on exit (poll: the file appears before it is filled).
    let started = Instant::now();
    let history = data.path().join(".cirro_history");
    let mut saved = String::new();
    while !saved.contains("AS answer;") && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        saved = std::fs::read_to_string(&history).unwrap_or_default();
    }
    assert!(saved.contains("AS answer;"), "{saved}");
}
