//! `flotilla completions SHELL` and `flotilla man`: generated from the same clap
//! definitions that parse the command line, so they cannot drift from it.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, CommandFactory as _};

use super::{Cli, EXIT_OK};

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for. Install, for example: `flotilla completions bash >
    /// ~/.local/share/bash-completion/completions/flotilla`, `flotilla completions zsh >
    /// "${fpath[1]}/_flotilla"`, `flotilla completions fish >
    /// ~/.config/fish/completions/flotilla.fish`.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write flotilla.1 and one page per subcommand (flotilla-render.1, …) into this
    /// folder, instead of printing flotilla.1 on stdout.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn run_completions(args: &CompletionsArgs) -> anyhow::Result<u8> {
    let mut command = Cli::command();
    // clap_complete panics when its writer fails, so the script is made in memory and
    // written here: a closed pipe (`flotilla completions bash | head`) is then the
    // reader's choice, as for every other command, not a panic.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "flotilla", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script)?;
    stdout.flush()?;
    Ok(EXIT_OK)
}

pub fn run_man(args: &ManArgs) -> anyhow::Result<u8> {
    let command = Cli::command();
    match &args.out {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(command, dir)
                .with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            println!("wrote the man pages into {}", dir.display());
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            clap_mangen::Man::new(command).render(&mut stdout)?;
            stdout.flush()?;
        }
    }
    Ok(EXIT_OK)
}
