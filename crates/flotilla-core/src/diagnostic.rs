//! Diagnostics: what went wrong (or looks wrong), where, and for whom.
//!
//! Every error flotilla reports about a fleet names the file, the line where it can
//! be known, and the cluster and workload it concerns, in one line a person can act
//! on: `clusters/edge-7.yaml:4: unknown field "lables" (did you mean "labels"?)`.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// The file, relative to the fleet root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// 1-based line in `file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    pub message: String,
}

impl Diagnostic {
    pub fn error(message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            file: None,
            line: None,
            cluster: None,
            workload: None,
            message: message.into(),
        }
    }

    pub fn warning(message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(message)
        }
    }

    pub fn in_file(mut self, file: impl Into<String>) -> Diagnostic {
        self.file = Some(file.into());
        self
    }

    pub fn at_line(mut self, line: Option<u64>) -> Diagnostic {
        self.line = line.filter(|&l| l > 0);
        self
    }

    pub fn for_cluster(mut self, cluster: impl Into<String>) -> Diagnostic {
        self.cluster = Some(cluster.into());
        self
    }

    pub fn for_workload(mut self, workload: impl Into<String>) -> Diagnostic {
        self.workload = Some(workload.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{file}:{line}: ")?,
            (Some(file), None) => write!(f, "{file}: ")?,
            _ => {}
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.message)?;
        match (&self.cluster, &self.workload) {
            (Some(cluster), Some(workload)) => {
                write!(f, " (cluster {cluster}, workload {workload})")
            }
            (Some(cluster), None) => write!(f, " (cluster {cluster})"),
            (None, Some(workload)) => write!(f, " (workload {workload})"),
            (None, None) => Ok(()),
        }
    }
}

/// Suggests the closest of `candidates` to a misspelt `word`, if one is close enough
/// to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (strsim::jaro_winkler(word, candidate), candidate))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}
