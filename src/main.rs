//! The `flotilla` binary: everything happens in [`cli`].

mod cli;

/// jemalloc rather than the system's malloc: rendering a fleet allocates millions of
/// small, short-lived objects across threads, where glibc's arenas fragment (a render of
/// 4,000 clusters with per-cluster templates peaked 30% higher with it) and keep freed
/// memory from the hub after a render. The standalone `flotilla-agent` keeps the
/// system allocator, for its size.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
