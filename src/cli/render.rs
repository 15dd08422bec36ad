//! `flotilla render`, `flotilla validate` and the hidden `flotilla schemas`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{
    EXIT_FINDINGS, EXIT_OK, OutputFormat, RenderArgs, RenderFormat, SchemasArgs, ValidateArgs,
};
use flotilla_core::bundle::Bundle;
use flotilla_render::{RenderOptions, RenderOutput, render_with};

/// A progress bar on a terminal, shown only once a render has taken more than a moment.
struct Progress {
    bar: ProgressBar,
    started: Instant,
    interactive: bool,
}

impl Progress {
    fn new() -> Progress {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} rendering {pos}/{len} clusters {wide_bar} {eta}",
        ) {
            bar.set_style(style);
        }
        Progress {
            bar,
            started: Instant::now(),
            interactive: std::io::stderr().is_terminal(),
        }
    }

    fn update(&self, done: usize, total: usize) {
        if !self.interactive {
            return;
        }
        if self.bar.is_hidden() && self.started.elapsed() > Duration::from_millis(300) {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
    }
}

fn render_fleet(
    source: &super::SourceArgs,
    command: &str,
    clusters: &[String],
    (limits_args, decryption): (&super::LimitArgs, &super::DecryptionArgs),
    digests_only: bool,
) -> anyhow::Result<RenderOutput> {
    let limits = limits_args.limits();
    let snapshot = super::source::read(source, command, &limits)?;
    let progress = Progress::new();
    let capped = super::memory::cap(limits_args.render_memory)?;
    let callback = |done: usize, total: usize| progress.update(done, total);
    let options = RenderOptions {
        clusters: clusters.iter().cloned().collect(),
        progress: Some(&callback),
        limits,
        cancel: None,
        digests_only,
        helm_seed: None,
        sops: decryption.review()?,
        helm_without_stencils: false,
    };
    let output = render_with(&snapshot, &options);
    drop(capped);
    progress.bar.finish_and_clear();
    Ok(output)
}

fn print_diagnostics(output: &RenderOutput) {
    for diagnostic in output.warnings().chain(output.errors()) {
        eprintln!("{diagnostic}");
    }
}

pub fn run_render(args: &RenderArgs) -> anyhow::Result<u8> {
    let output = render_fleet(
        &args.source,
        "render",
        &args.clusters,
        (&args.limits, &args.decryption),
        false,
    )?;
    print_diagnostics(&output);
    if !output.is_clean() {
        let count = output.errors().count();
        eprintln!(
            "render failed with {count} error{}; nothing was written",
            plural(count)
        );
        return Ok(EXIT_FINDINGS);
    }
    match (args.format, &args.out) {
        (RenderFormat::Bundle, Some(dir)) => write_bundles(dir, &output)?,
        (RenderFormat::Bundle, None) => print_bundles(&output, args.output)?,
        (RenderFormat::Flux, Some(dir)) => return write_flux_layers(dir, &output),
        (RenderFormat::Flux, None) => {
            anyhow::bail!(
                "--format flux writes one DIR/<cluster>.tar.gz per cluster: give --out DIR"
            )
        }
        (RenderFormat::Manifestwork, out) => {
            return write_manifest_works(args, out.as_deref(), &output);
        }
    }
    Ok(EXIT_OK)
}

/// Each cluster's formatted output, or every cluster's error (printed) and `None`.
fn each_cluster<T, E: std::fmt::Display>(
    output: &RenderOutput,
    mut make: impl FnMut(&Bundle) -> Result<T, E>,
) -> Option<Vec<(&str, T)>> {
    let mut made = Vec::new();
    let mut failed = 0;
    for (cluster, bundle) in &output.bundles {
        match make(bundle) {
            Ok(value) => made.push((cluster.as_str(), value)),
            Err(err) => {
                eprintln!("{err}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        refused(failed);
        return None;
    }
    Some(made)
}

fn refused(clusters: usize) {
    eprintln!(
        "{clusters} cluster{} cannot be written in this format; nothing was written",
        plural(clusters)
    );
}

/// `--format flux`: DIR/<cluster>.tar.gz, the layer of each cluster's Flux artifact.
fn write_flux_layers(dir: &std::path::Path, output: &RenderOutput) -> anyhow::Result<u8> {
    use flotilla_render::formats::flux;
    // A fresh seed each run: each SOPS document gets data keys nobody can recompute.
    let seed: [u8; 32] = rand::random();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let sops = flotilla_render::sops::SopsWriter::new(seed, now);
    let layers = match flux::flux_layers(output, &sops) {
        Ok(layers) => layers,
        Err(errors) => {
            for err in &errors {
                eprintln!("{err}");
            }
            refused(errors.len());
            return Ok(EXIT_FINDINGS);
        }
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut stdout = std::io::stdout().lock();
    let width = layers.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    for (cluster, layer) in &layers {
        let path = dir.join(format!("{cluster}.tar.gz"));
        std::fs::write(&path, layer).with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(
            stdout,
            "{cluster:width$}  {}  {} bytes  {}",
            flotilla_core::bundle::Digest::of(layer),
            layer.len(),
            flux::LAYER_MEDIA_TYPE
        )?;
    }
    Ok(EXIT_OK)
}

/// `--format manifestwork`: each cluster's ManifestWorks, printed or in DIR/<cluster>.yaml.
fn write_manifest_works(
    args: &RenderArgs,
    out: Option<&std::path::Path>,
    output: &RenderOutput,
) -> anyhow::Result<u8> {
    use flotilla_render::formats::manifestwork::{ManifestWorkOptions, manifest_works};
    let options = ManifestWorkOptions {
        max_bytes: usize::try_from(args.manifestwork_max_bytes).unwrap_or(usize::MAX),
        allow_plain_secrets: args.allow_plain_secrets,
    };
    let Some(works) = each_cluster(output, |bundle| {
        manifest_works(bundle, &output.revision, &options)
    }) else {
        return Ok(EXIT_FINDINGS);
    };
    let stream = |works: &[serde_json::Value]| -> anyhow::Result<String> {
        let mut text = String::new();
        for work in works {
            text.push_str("---\n");
            text.push_str(&serde_saphyr::to_string(work)?);
        }
        Ok(text)
    };
    let mut stdout = std::io::stdout().lock();
    match out {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let width = works.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
            for (cluster, works) in &works {
                let path = dir.join(format!("{cluster}.yaml"));
                std::fs::write(&path, stream(works)?)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                let resources: usize = works
                    .iter()
                    .map(|w| {
                        w["spec"]["workload"]["manifests"]
                            .as_array()
                            .map_or(0, Vec::len)
                    })
                    .sum();
                writeln!(
                    stdout,
                    "{cluster:width$}  {} ManifestWork{}  {resources} resource{}",
                    works.len(),
                    plural(works.len()),
                    plural(resources)
                )?;
            }
        }
        None if args.output == OutputFormat::Json => {
            let all: Vec<&serde_json::Value> = works.iter().flat_map(|(_, w)| w).collect();
            serde_json::to_writer_pretty(&mut stdout, &all)?;
            writeln!(stdout)?;
        }
        None => {
            for (_, works) in &works {
                write!(stdout, "{}", stream(works)?)?;
            }
        }
    }
    Ok(EXIT_OK)
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

fn write_bundles(dir: &std::path::Path, output: &RenderOutput) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut stdout = std::io::stdout().lock();
    let width = output.bundles.keys().map(String::len).max().unwrap_or(0);
    for (cluster, bundle) in &output.bundles {
        let path = dir.join(format!("{cluster}.json"));
        std::fs::write(&path, bundle.document(&output.revision))
            .with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(
            stdout,
            "{cluster:width$}  {}  {} resource{}",
            bundle.digest,
            bundle.resources.len(),
            plural(bundle.resources.len())
        )?;
    }
    Ok(())
}

fn print_bundles(output: &RenderOutput, format: OutputFormat) -> anyhow::Result<()> {
    let documents: Vec<serde_json::Value> = output
        .bundles
        .values()
        .map(|bundle| document_value(bundle, &output.revision))
        .collect::<Result<_, _>>()?;
    let mut stdout = std::io::stdout().lock();
    match format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut stdout, &documents)?;
            writeln!(stdout)?;
        }
        OutputFormat::Yaml => {
            for document in &documents {
                writeln!(stdout, "---")?;
                write!(stdout, "{}", serde_saphyr::to_string(document)?)?;
            }
        }
    }
    Ok(())
}

/// The bundle document as the hub serves it and `--out` writes it, `meta` included
/// (the digest covers it).
fn document_value(bundle: &Bundle, revision: &str) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_slice(&bundle.document(revision))?)
}

pub fn run_validate(args: &ValidateArgs) -> anyhow::Result<u8> {
    // It reports problems and counts bundles: it keeps no resources.
    let output = render_fleet(
        &args.source,
        "validate",
        &[],
        (&args.limits, &args.decryption),
        true,
    )?;
    print_diagnostics(&output);
    let errors = output.errors().count();
    let warnings = output.warnings().count();
    if errors > 0 {
        eprintln!(
            "{errors} error{}, {warnings} warning{}: the fleet is invalid",
            plural(errors),
            plural(warnings)
        );
        return Ok(EXIT_FINDINGS);
    }
    if args.strict && warnings > 0 {
        eprintln!(
            "{warnings} warning{}, which --strict counts as errors: the fleet is invalid",
            plural(warnings)
        );
        return Ok(EXIT_FINDINGS);
    }
    println!(
        "valid: {} cluster{} rendered ({}), {warnings} warning{}",
        output.bundles.len(),
        plural(output.bundles.len()),
        output.revision,
        plural(warnings)
    );
    for (workload, chart) in &output.charts {
        println!("  Helm chart {chart}: workload {workload}");
    }
    for file in &output.sops_files {
        println!(
            "  SOPS file {file}: the name suffix kustomize gives an object generated or patched from its values, and every digest \
             (sha256sum, sha1sum, sha512sum, adler32sum) of a Helm release whose values hold its values, is an HMAC keyed by the file's \
             data key, not the plain hash kustomize and Helm write, so that it lets nobody test a guess of them"
        );
    }
    Ok(EXIT_OK)
}

pub fn run_schemas(args: &SchemasArgs) -> anyhow::Result<u8> {
    std::fs::create_dir_all(&args.out)?;
    for (name, schema) in flotilla_core::model::schemas() {
        let path = args.out.join(name);
        let mut text = serde_json::to_string_pretty(&schema)?;
        text.push('\n');
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(EXIT_OK)
}
