//! Processes a test starts (the real `flotilla` binary running a hub or an agent) and
//! waits on: each killed, by its own id, when the test ends.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port nothing listens on now, for a hub started with `--listen`.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A process the test started, killed (by its own id) when the test ends.
pub struct Background {
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Background {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Waits (up to a minute) until `done`, failing with the background commands' logs
/// when one of them ends or the time is up.
pub fn wait_for(what: &str, background: &mut [Background], mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        for process in background.iter_mut() {
            if let Ok(Some(status)) = process.child.try_wait() {
                panic!(
                    "waiting for {what}, a background command ended with {status}:\n{}",
                    process.log()
                );
            }
        }
        let logs: Vec<String> = background.iter().map(Background::log).collect();
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; the background commands said:\n{}",
            logs.join("\n---\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The status of `GET path` on 127.0.0.1:`port`, `None` while nothing answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    http_status_as(port, path, None)
}

/// [`http_status`] with a bearer token.
pub fn http_status_as(port: u16, path: &str, token: Option<&str>) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{authorization}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

/// Starts the real `flotilla` with `args` in `work`, its output to `work/log`,
/// without the environment a developer's shell may set (state dir, decryption key).
pub fn start_flotilla(work: &Path, args: &[&str], log: &str) -> Background {
    let log = work.join(log);
    let file = std::fs::File::create(&log).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .current_dir(work)
        .env_remove("FLOTILLA_STATE_DIR")
        .env_remove("FLOTILLA_DECRYPTION_KEY")
        // The tests read what the commands log at their default level.
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .expect("flotilla starts");
    Background { child, log }
}
