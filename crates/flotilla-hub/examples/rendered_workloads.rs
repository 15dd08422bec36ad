//! What the hub keeps of a render for the web page's workload column
//! (`recorder::workloads`): the fleet at FOLDER rendered, each bundle's list of its
//! resources' workloads made as an install makes it, and its size printed. Digests
//! of an older render that a rollout holds add at most as much again.
//!
//! ```text
//! cargo run --release --example gen_fleet -- --clusters 10000 --workloads 20 --resources 5 /tmp/f10k
//! cargo run --release -p flotilla-hub --example rendered_workloads -- /tmp/f10k
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use flotilla_hub::recorder::workloads::RenderedWorkloads;

fn main() -> ExitCode {
    let Some(folder) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: rendered_workloads FOLDER");
        return ExitCode::from(2);
    };
    let snapshot = match flotilla_hub::source::from_folder(&folder, "") {
        Ok(snapshot) => snapshot,
        Err(err) => {
            eprintln!("{}: {err}", folder.display());
            return ExitCode::FAILURE;
        }
    };
    let output = flotilla_render::render(&snapshot);
    if !output.is_clean() {
        eprintln!("{}: the fleet does not render", folder.display());
        return ExitCode::FAILURE;
    }
    let resources: usize = output.bundles.values().map(|b| b.resources.len()).sum();
    let with_meta = output.bundles.values().filter(|b| b.meta.is_some()).count();
    let making = Instant::now();
    let known = RenderedWorkloads::default().with_render(&output);
    let made_in = making.elapsed();
    let pruning = Instant::now();
    let kept = known.pruned(&output, output.bundles.values().map(|b| &b.digest));
    let pruned_in = pruning.elapsed();
    println!(
        "{} clusters ({with_meta} with metadata), {resources} resources: {} digests listed, \
         about {} bytes; made in {made_in:?}, pruned in {pruned_in:?}",
        output.bundles.len(),
        kept.len(),
        kept.weight(),
    );
    ExitCode::SUCCESS
}
