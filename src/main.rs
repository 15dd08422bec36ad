//! The `flotilla` binary: everything happens in [`flotilla::cli`].

fn main() -> std::process::ExitCode {
    flotilla::cli::main()
}
