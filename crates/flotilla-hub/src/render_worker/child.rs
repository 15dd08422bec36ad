//! The render process's loop: it caps its own memory, then reads request after
//! request, renders each since what it names, and writes the answer, keeping its
//! last render between them.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Read, Write};
use std::path::Path;

use flotilla_core::bundle::Bundle;
use flotilla_core::rollout::RolloutPlan;
use flotilla_render::{RenderOptions, RenderOutput, render_since_fetching};

use super::WARNING;
use super::codec::{
    Known, Since, decode_input, encode_output, invalid, read_output, write_request,
};
use super::headers::KeptHeaders;

/// How often the render process looks at what its threads render.
const SLOW_WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// A template that takes this long for one cluster is told on stderr: real ones
/// take well under a millisecond, and one that builds a list until the memory limit
/// (as fast as memory can be filled) takes a few times this to get there.
const SLOW_TEMPLATE: std::time::Duration = std::time::Duration::from_millis(20);

/// The child's side: caps its own memory, then renders request after request until
/// its input ends: each is the snapshot and limits read from `input`, its render
/// written to `output`. Between requests it keeps its last render (digests and
/// provenance) and that render's parse of the cluster files, so the next commit can
/// be rendered since it without the hub sending it again, and unchanged cluster
/// files are not parsed again. Rendering runs out of memory by aborting the process,
/// which the parent recognises.
///
/// With `sealing_headers`, the file of age headers kept in the hub's state folder
/// ([`KeptHeaders`]): read before the first render, written after a render that
/// worked out new ones (a file that cannot be read or written is told on stderr,
/// and the headers are worked out instead).
pub fn run_worker(
    memory_limit: Option<u64>,
    sealing_headers: Option<&Path>,
    input: impl Read,
    output: impl Write,
) -> io::Result<()> {
    // Dies with the hub, whatever way the hub ends.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(io::Error::from)?;
    if let Some(limit) = memory_limit {
        rustix::process::setrlimit(
            rustix::process::Resource::Data,
            rustix::process::Rlimit {
                current: Some(limit),
                maximum: Some(limit),
            },
        )
        .map_err(io::Error::from)?;
    }
    // A template render that takes long is told on stderr: should the process then
    // run out of memory or be abandoned, the hub names the file it was on.
    flotilla_render::progress::watch(SLOW_WATCH_EVERY, SLOW_TEMPLATE, |line| {
        eprintln!("{line}");
    });
    let mut input = io::BufReader::new(input);
    let mut output = io::BufWriter::new(output);
    let mut kept: Option<RenderOutput> = None;
    let mut headers = sealing_headers.map(KeptHeaders::new);
    let told = |result: Result<(), String>| {
        if let Err(err) = result {
            eprintln!("{WARNING}{err}; the agents' headers are worked out again");
        }
    };
    if let Some(headers) = &mut headers {
        told(headers.offer());
    }
    // A request starts with its header; the end of the input, between requests,
    // ends the worker.
    while !input.fill_buf()?.is_empty() {
        let (rendered, seed, secret) = render_request(&mut input, &mut output, kept.take())?;
        kept = Some(kept_for_next(rendered));
        if let (Some(headers), Some(seed)) = (&mut headers, seed) {
            told(headers.keep(&seed, secret.as_ref()));
        }
    }
    Ok(())
}

/// A key of 32 bytes, if there is one (a seed, a secret).
type Key = Option<[u8; 32]>;

/// Reads one request, renders it (since the render it names, and with the parse of
/// `kept`, the last render), and writes the answer; returns the render, the seed it
/// was rendered with and the hub's sealing secret (from its decryption keys).
fn render_request(
    input: &mut impl BufRead,
    output: &mut impl Write,
    kept: Option<RenderOutput>,
) -> io::Result<(RenderOutput, Key, Key)> {
    let (settings, snapshot, since) = decode_input(&mut *input)?;
    let secret = settings.decryption.sealing_secret();
    // What the process tells of slow templates from here on is this render's.
    eprintln!("{}", flotilla_render::progress::RENDER_STARTED);
    let parsed = kept.as_ref().and_then(|k| k.parsed.clone());
    let previous =
        match since {
            Since::Nothing => None,
            Since::Given(mut previous) => {
                previous.parsed = parsed.clone();
                Some(previous)
            }
            Since::Kept => Some(kept.ok_or_else(|| {
                invalid("asked to render since a render this process does not keep")
            })?),
        };
    let options = RenderOptions {
        limits: settings.limits,
        helm_seed: settings.helm_seed,
        sops: flotilla_render::sops::SopsKeys::Open(settings.decryption),
        ..RenderOptions::default()
    };
    // The clusters rendered in part, asked for once: their previous bundles are read
    // back from the hub. Asked or not, the request is written before the render.
    let mut asked: Option<Vec<String>> = None;
    let mut fetch = |names: &[String]| -> Option<Vec<Bundle>> {
        asked = Some(names.to_vec());
        write_request(output, names).ok()?;
        let answer = read_output(&mut *input, Known::Nothing).ok()?;
        names
            .iter()
            .map(|n| answer.bundles.get(n).cloned())
            .collect()
    };
    let rendered = match &previous {
        Some(previous) => render_since_fetching(previous, &snapshot, &options, &mut fetch),
        // Nothing to render since, but the last render's parse of the cluster files
        // can still be taken.
        None => {
            let parse_only = RenderOutput {
                parsed,
                ..RenderOutput::default()
            };
            render_since_fetching(&parse_only, &snapshot, &options, &mut fetch)
        }
    };
    drop(snapshot);
    if asked.is_none() {
        write_request(output, &[])?;
    }
    let known = previous.as_ref().map_or(Known::Nothing, Known::Render);
    encode_output(&rendered, known, output)?;
    output.flush()?;
    Ok((rendered, settings.helm_seed, secret))
}

/// What the worker keeps of a render for the next request: what a hub sends of a
/// render to render since it (its bundles' digests, its diagnostics and
/// provenance) and its parse of the cluster files.
fn kept_for_next(mut rendered: RenderOutput) -> RenderOutput {
    for bundle in rendered.bundles.values_mut() {
        bundle.resources = Vec::new();
    }
    RenderOutput {
        memberships: BTreeMap::new(),
        labels: BTreeMap::new(),
        rollouts: RolloutPlan::default(),
        ..rendered
    }
}
