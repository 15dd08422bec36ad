//! Delta bundles (RFC 9842, `Content-Encoding: dcz`): the document the hub sent as the
//! difference from the bundle this agent runs, rebuilt here.
//!
//! The dictionary is the canonical body of the stored bundle (its sha256 is the digest
//! the agent runs and names in `Available-Dictionary`). What this rebuilds is a
//! document like any other: the poller verifies it exactly as a full one. Any failure
//! here only means the next request asks for the full document.

use flotilla_core::bundle::{Digest, MAX_BUNDLE_BYTES};
use flotilla_core::dcz;

/// Why a delta could not be rebuilt.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeltaError {
    #[error("the delta does not start with the dcz header")]
    NotDcz,
    #[error("the delta is against {named}, not the bundle this agent runs ({runs})")]
    OtherBase { named: Digest, runs: String },
    #[error("the stored bundle cannot serve as the delta's base: {0}")]
    NoBase(String),
    #[error(
        "the delta does not say how large its document is, or says more than {MAX_BUNDLE_BYTES} bytes"
    )]
    Size,
    #[error("the delta does not decompress: {0}")]
    Corrupt(String),
}

/// Rebuilds the document a `dcz` body holds, against `dictionary` (the stored
/// bundle's canonical body, whose digest `runs` names). Never more than
/// [`MAX_BUNDLE_BYTES`] is allocated for the result.
pub fn decode(
    body: &[u8],
    runs: Option<&Digest>,
    dictionary: &[u8],
) -> Result<Vec<u8>, DeltaError> {
    let (named, frame) = dcz::split(body).ok_or(DeltaError::NotDcz)?;
    if runs != Some(&named) {
        return Err(DeltaError::OtherBase {
            named,
            runs: runs.map_or_else(|| "none".to_string(), Digest::to_string),
        });
    }
    if Digest::of(dictionary) != named {
        return Err(DeltaError::NoBase(
            "its resources do not hash to its digest".into(),
        ));
    }
    decompress(dictionary, frame)
}

/// One zstd frame, with `dictionary` as its raw-content prefix.
pub fn decompress(dictionary: &[u8], frame: &[u8]) -> Result<Vec<u8>, DeltaError> {
    use zstd_safe::DCtx;
    let corrupt = |code: usize| DeltaError::Corrupt(zstd_safe::get_error_name(code).to_string());
    let size = match zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) if size <= MAX_BUNDLE_BYTES as u64 => size as usize,
        Ok(_) => return Err(DeltaError::Size),
        Err(_) => return Err(DeltaError::Corrupt("not a zstd frame".into())),
    };
    // One frame and nothing after it: a second one would not use the dictionary.
    if zstd_safe::find_frame_compressed_size(frame).map_err(corrupt)? != frame.len() {
        return Err(DeltaError::Corrupt("bytes after the frame".into()));
    }
    let mut context = DCtx::create();
    context.ref_prefix(dictionary).map_err(corrupt)?;
    let mut out = vec![0u8; size];
    let written = context.decompress(&mut out[..], frame).map_err(corrupt)?;
    if written != size {
        return Err(DeltaError::Corrupt(format!(
            "{written} bytes where the frame says {size}"
        )));
    }
    Ok(out)
}
