//! `flotilla-agent`: the edge agent on its own, a small binary for the clusters. It
//! takes the same flags as `flotilla agent`.

use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "flotilla-agent",
    version,
    about = "flotilla's edge agent: pull this cluster's bundle, verify, keep, apply, prune, report"
)]
struct Cli {
    #[command(flatten)]
    agent: flotilla_agent::cli::AgentArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match flotilla_agent::cli::run_agent(&cli.agent) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", flotilla_agent::logging::error_line(&err));
            ExitCode::from(2)
        }
    }
}
