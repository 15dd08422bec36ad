//! minijinja templates (`*.j2` manifests) in strict mode: an undefined variable is an
//! error, never an empty string.

use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::Serialize;

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::snapshot::FleetSnapshot;

/// Every template of the fleet, compiled once per render and shared by all threads.
pub struct Templates {
    env: Environment<'static>,
}

/// What a template sees.
#[derive(Serialize)]
pub struct Context<'a> {
    pub cluster: ClusterContext<'a>,
    pub workload: WorkloadContext<'a>,
    pub vars: &'a flotilla_core::model::Vars,
}

#[derive(Serialize)]
pub struct ClusterContext<'a> {
    pub name: &'a str,
    pub labels: &'a std::collections::BTreeMap<String, String>,
    pub vars: &'a flotilla_core::model::Vars,
}

#[derive(Serialize)]
pub struct WorkloadContext<'a> {
    pub name: &'a str,
    pub namespace: Option<&'a str>,
}

impl Templates {
    /// Compiles the given template files; syntax errors become diagnostics.
    pub fn compile<'a>(
        snapshot: &FleetSnapshot,
        paths: impl IntoIterator<Item = &'a String>,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Templates {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_keep_trailing_newline(true);
        for path in paths {
            let Some(source) = snapshot.files.get(path) else {
                continue;
            };
            if let Err(err) = env.add_template_owned(path.clone(), source.to_string()) {
                diagnostics.push(describe(&err, path, Some(source)));
            }
        }
        Templates { env }
    }

    /// Renders one template; `None` if it failed to compile (already reported).
    pub fn render(&self, path: &str, context: &Context<'_>) -> Option<Result<String, Diagnostic>> {
        let template = self.env.get_template(path).ok()?;
        Some(
            template
                .render(context)
                .map_err(|err| describe(&err, path, template.source().into())),
        )
    }
}

fn describe(err: &minijinja::Error, path: &str, source: Option<&str>) -> Diagnostic {
    let mut message = match err.detail() {
        Some(detail) => format!("template error: {}: {detail}", err.kind()),
        None => format!("template error: {}", err.kind()),
    };
    // The offending expression, when minijinja knows it, is the most useful hint
    // ("undefined value `vars.replicas`").
    if let (Some(range), Some(source)) = (err.range(), source)
        && let Some(snippet) = source.get(range)
        && !snippet.contains('\n')
        && snippet.len() < 120
    {
        message.push_str(&format!(" in `{}`", snippet.trim()));
    }
    Diagnostic::error(message)
        .in_file(path)
        .at_line(err.line().map(|line| line as u64))
}
