//! A fleet repository in a temporary folder for the examples that start a hub in
//! process (`rollout_scale`, and `poll_load`'s test), and waiting on that hub.

use std::path::Path;
use std::process::Command;

/// Runs `git args` in `dir` as a bench committer, ignoring the user's Git settings.
pub fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@flotilla.invalid")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@flotilla.invalid")
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

/// Writes `text` to `dir/file`, making the folders on the way.
pub fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// Waits until the hub at `base` holds at least `count` long-polls (its
/// `flotilla_long_polls_held` metric).
pub async fn until_long_polls_held(client: &reqwest::Client, base: &str, count: usize) {
    loop {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        let held = text
            .lines()
            .find_map(|l| l.strip_prefix("flotilla_long_polls_held "))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if held >= count {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
