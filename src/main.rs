//! The `flotilla` binary: everything happens in [`cli`].

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
