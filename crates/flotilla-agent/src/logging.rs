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

/// An error and its causes as one line for standard error, each cause said once.
/// Many libraries repeat their source's text in their own message, so anyhow's
/// `{:#}` would print the innermost cause as often as the chain is deep; a cause
/// whose text is already in the line is left out.
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let message = cause.to_string();
        let message = message.trim();
        if message.is_empty() || line.contains(message) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(message);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect: {0}; set KUBECONFIG")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("failed to read kubeconfig: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = anyhow::Error::new(Outer(Middle(io))).context("cannot start the agent");
        assert_eq!(
            error_line(&err),
            "cannot start the agent: cannot connect: failed to read kubeconfig: no such file; set KUBECONFIG"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_line(&plain), "outer: inner");
    }
}
