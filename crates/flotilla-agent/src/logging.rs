//! Logs on standard error, as text lines (coloured only on a terminal) or JSON objects,
//! filtered by `RUST_LOG` (default `info`). Used by the agent, and by `flotilla serve`
//! so that both long-running commands log alike.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Sets the process's log subscriber once; a later call (or one already set by an
/// embedding program) changes nothing.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
