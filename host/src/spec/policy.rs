//! The operator's policy: what any pipeline run by this host may ask for.
//!
//! A pipeline file is written by a tenant; the policy is written by whoever runs the host
//! (`weir run --policy FILE`, `weir validate --policy FILE`). It confines what grants can name:
//! the folders a pipeline's paths and directory grants may lie under, the host variables a
//! pipeline may hand to a plugin, the ceilings of every plugin's limits, and whether plugins may
//! reach loopback, private and link-local addresses at all. Its checks are problems of the
//! pipeline (with the pipeline's key paths), so `weir validate` and `weir run` refuse the same
//! files for the same reasons.
//!
//! Some confinement holds with no policy at all: a writable grant may never overlap the
//! query's checkpoint or the compiled-plugin cache (a plugin that can write either can forge
//! offsets or native code), see [`confinement_problems`].

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::duration::{HumanDuration, format_duration};
use super::size::{ByteSize, format_byte_size};
use super::{
    Capabilities, ListenerKind, Pipeline, PluginLimits, Problem, SinkSpec, SourceKind, SpecErrors,
    TableKind,
};

/// A validated policy file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    /// The file it was read from (named in problems); empty for a policy built in code.
    pub origin: String,
    /// Every path of a pipeline must lie under one of these (canonical); empty: anywhere.
    pub roots: Option<Vec<PathBuf>>,
    /// The host variables a pipeline may grant; `None`: any.
    pub env: Option<Vec<String>>,
    /// Ceiling of `limits.memory`.
    pub max_memory: Option<u64>,
    /// Ceiling of `limits.timeout`.
    pub max_timeout: Option<Duration>,
    /// Ceiling of `limits.fuel` (and every plugin must then be metered).
    pub max_fuel: Option<u64>,
    /// Whether plugins may reach loopback, private and link-local addresses (only ever by a
    /// grant of the address itself, see `plugin::http_connect`).
    pub private_networks: bool,
    /// Whether `[[listener]] url` (a webhook) is allowed.
    pub webhooks: bool,
}

impl Policy {
    /// What holds without a policy file: no roots, any variable, no ceilings, and private
    /// addresses reachable when granted by address.
    pub fn permissive() -> Self {
        Self {
            private_networks: true,
            webhooks: true,
            ..Self::default()
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    paths: Option<RawPaths>,
    #[serde(default)]
    grants: Option<RawGrants>,
    #[serde(default)]
    limits: Option<RawLimits>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPaths {
    roots: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrants {
    env: Option<Vec<String>>,
    #[serde(default)]
    private_networks: bool,
    #[serde(default)]
    webhooks: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    memory: Option<ByteSize>,
    timeout: Option<HumanDuration>,
    fuel: Option<u64>,
}

/// Reads and validates the policy file at `path`; relative roots resolve against its folder.
///
/// # Errors
/// [`SpecErrors`] naming the file, with every problem found.
pub fn load_policy(path: &Path) -> Result<Policy, SpecErrors> {
    let origin = path.display().to_string();
    let fail = |problems: Vec<Problem>| SpecErrors {
        origin: origin.clone(),
        problems,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(vec![Problem::new(
            "",
            format!("cannot read the policy file: {e}"),
        )])
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse_policy(&text, base, &origin)
}

/// Validates policy text; `base` is the folder relative roots resolve against.
///
/// # Errors
/// [`SpecErrors`] with every problem found.
pub fn parse_policy(text: &str, base: &Path, origin: &str) -> Result<Policy, SpecErrors> {
    let fail = |problems: Vec<Problem>| SpecErrors {
        origin: origin.to_owned(),
        problems,
    };
    let raw: RawPolicy = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or_else(String::new, |span| {
            let before = &text[..span.start.min(text.len())];
            format!("line {}", before.matches('\n').count() + 1)
        });
        fail(vec![Problem::new(
            at,
            format!("invalid policy: {}", e.message().trim_end()),
        )])
    })?;
    let mut problems = Vec::new();
    let mut policy = Policy {
        origin: origin.to_owned(),
        ..Policy::default()
    };
    if let Some(paths) = raw.paths {
        let mut roots = Vec::new();
        for (i, root) in paths.roots.iter().enumerate() {
            let key = format!("paths.roots[{i}]");
            match std::fs::canonicalize(base.join(root)) {
                Ok(dir) if dir.is_dir() => roots.push(dir),
                Ok(_) => problems.push(Problem::new(key, format!("{root} is not a folder"))),
                Err(e) => problems.push(Problem::new(key, format!("{root}: {e}"))),
            }
        }
        if paths.roots.is_empty() {
            problems.push(Problem::new(
                "paths.roots",
                "is empty: list the folders pipelines may use, or leave [paths] out",
            ));
        }
        policy.roots = Some(roots);
    }
    if let Some(grants) = raw.grants {
        if let Some(env) = &grants.env {
            for (i, name) in env.iter().enumerate() {
                let valid = !name.is_empty()
                    && !name.starts_with(|c: char| c.is_ascii_digit())
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    problems.push(Problem::new(
                        format!("grants.env[{i}]"),
                        format!("{name:?} is not an environment variable name"),
                    ));
                }
            }
        }
        policy.env = grants.env;
        policy.private_networks = grants.private_networks;
        policy.webhooks = grants.webhooks;
    }
    if let Some(limits) = raw.limits {
        policy.max_memory = limits.memory.map(|m| m.0);
        policy.max_timeout = limits.timeout.map(Duration::from);
        policy.max_fuel = limits.fuel;
        if policy.max_memory == Some(0) {
            problems.push(Problem::new("limits.memory", "must be more than zero"));
        }
        if policy.max_timeout == Some(Duration::ZERO) {
            problems.push(Problem::new("limits.timeout", "must be longer than zero"));
        }
    }
    if problems.is_empty() {
        Ok(policy)
    } else {
        Err(fail(problems))
    }
}

/// What confines a pipeline on this host: the operator's policy (if any) and the folders the
/// host itself owns.
#[derive(Debug, Clone, Copy)]
pub struct Confinement<'a> {
    pub policy: Option<&'a Policy>,
    /// The compiled-plugin cache.
    pub cache_dir: Option<&'a Path>,
}

/// Every way `pipeline` leaves its confinement, with the pipeline's key paths.
pub fn confinement_problems(pipeline: &Pipeline, confinement: Confinement<'_>) -> Vec<Problem> {
    let mut c = Check {
        policy: confinement.policy,
        cache: confinement.cache_dir.map(resolved),
        checkpoint: resolved(&pipeline.query.checkpoint),
        problems: Vec::new(),
    };
    c.path("query.checkpoint", &pipeline.query.checkpoint);
    for source in &pipeline.sources {
        let at = format!("source.{}", source.name);
        match &source.kind {
            SourceKind::Files(files) => {
                c.path(&format!("{at}.path"), &files.path);
                if let Some(dead) = &files.dead_letter_path {
                    c.path(&format!("{at}.dead_letter_path"), dead);
                }
            }
            SourceKind::Delta(delta) => c.path(&format!("{at}.path"), &delta.path),
            SourceKind::Kafka(_) => {}
        }
    }
    for table in &pipeline.tables {
        let path = match &table.kind {
            TableKind::Files { path, .. } | TableKind::Delta { path, .. } => path,
        };
        c.path(&format!("table.{}.path", table.name), path);
    }
    for (i, t) in pipeline.transforms.iter().enumerate() {
        let Some(w) = t.wasm() else { continue };
        let at = format!("transform[{i}]");
        c.path(&format!("{at}.plugin"), &w.plugin);
        c.limits(&at, &w.limits);
        c.capabilities(&at, &w.capabilities);
    }
    for (i, f) in pipeline.functions.iter().enumerate() {
        let at = format!("function[{i}]");
        c.path(&format!("{at}.plugin"), &f.plugin.plugin);
        c.limits(&at, &f.plugin.limits);
        c.capabilities(&at, &f.plugin.capabilities);
    }
    for l in &pipeline.listeners {
        let at = format!("listener.{}", l.name);
        match &l.kind {
            ListenerKind::Plugin(p) => {
                c.path(&format!("{at}.plugin"), &p.plugin);
                c.limits(&at, &p.limits);
                c.capabilities(&at, &p.capabilities);
            }
            ListenerKind::Webhook { .. } => {
                if let Some(policy) = c.policy
                    && !policy.webhooks
                {
                    let by = c.by_policy();
                    c.push(
                        format!("{at}.url"),
                        format!("{by} allows no webhooks (grants.webhooks)"),
                    );
                }
            }
        }
    }
    match &pipeline.sink {
        SinkSpec::Files { path, .. } => c.path("sink.path", path),
        SinkSpec::Delta(delta) => c.path("sink.path", &delta.path),
        SinkSpec::DeltaMerge(merge) => c.path("sink.path", &merge.path),
        SinkSpec::Plugin(p) => {
            c.path("sink.plugin", &p.plugin);
            c.limits("sink", &p.limits);
            c.capabilities("sink", &p.capabilities);
        }
        SinkSpec::Console { .. } | SinkSpec::Memory | SinkSpec::Kafka(_) => {}
    }
    c.problems
}

struct Check<'a> {
    policy: Option<&'a Policy>,
    cache: Option<PathBuf>,
    checkpoint: PathBuf,
    problems: Vec<Problem>,
}

impl Check<'_> {
    fn push(&mut self, path: String, message: String) {
        self.problems.push(Problem::new(path, message));
    }

    fn by_policy(&self) -> String {
        match self.policy {
            Some(p) if !p.origin.is_empty() => format!("the operator's policy ({})", p.origin),
            _ => "the operator's policy".to_owned(),
        }
    }

    /// `path` lies under one of the policy's roots.
    fn path(&mut self, key: &str, path: &Path) {
        let Some(roots) = self.policy.and_then(|p| p.roots.as_ref()) else {
            return;
        };
        let real = resolved(path);
        if !roots.iter().any(|root| real.starts_with(root)) {
            let list: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
            let message = format!(
                "{} is outside the folders {} allows: {}",
                real.display(),
                self.by_policy(),
                list.join(", ")
            );
            self.push(key.to_owned(), message);
        }
    }

    fn limits(&mut self, at: &str, limits: &PluginLimits) {
        let Some(policy) = self.policy else { return };
        let by = self.by_policy();
        if let Some(max) = policy.max_memory
            && limits.memory_bytes > max
        {
            self.push(
                format!("{at}.limits.memory"),
                format!(
                    "{} is over the ceiling of {} that {by} sets (the default is 256 MiB: set a lower one)",
                    format_byte_size(limits.memory_bytes),
                    format_byte_size(max)
                ),
            );
        }
        if let Some(max) = policy.max_timeout
            && limits.timeout > max
        {
            self.push(
                format!("{at}.limits.timeout"),
                format!(
                    "{} is over the ceiling of {} that {by} sets (the default is 30s: set a shorter one)",
                    format_duration(limits.timeout),
                    format_duration(max)
                ),
            );
        }
        if let Some(max) = policy.max_fuel {
            match limits.fuel {
                Some(fuel) if fuel > max => self.push(
                    format!("{at}.limits.fuel"),
                    format!("{fuel} is over the ceiling of {max} that {by} sets"),
                ),
                Some(_) => {}
                None => self.push(
                    format!("{at}.limits.fuel"),
                    format!("{by} meters every plugin: set limits.fuel to at most {max}"),
                ),
            }
        }
    }

    fn capabilities(&mut self, at: &str, caps: &Capabilities) {
        for (i, dir) in caps.dirs.iter().enumerate() {
            let key = format!("{at}.capabilities.dirs[{i}].host");
            self.path(&key, &dir.host);
            if dir.writable {
                let real = resolved(&dir.host);
                let mut owned = vec![("the query's checkpoint", self.checkpoint.clone())];
                if let Some(cache) = &self.cache {
                    owned.push(("the compiled-plugin cache", cache.clone()));
                }
                for (what, folder) in owned {
                    if real.starts_with(&folder) || folder.starts_with(&real) {
                        self.push(
                            key.clone(),
                            format!(
                                "a writable grant of {} overlaps {what} ({}): a plugin could rewrite it",
                                real.display(),
                                folder.display()
                            ),
                        );
                    }
                }
            }
        }
        for (name, table) in &caps.delta_merge {
            self.path(
                &format!("{at}.capabilities.delta_merge.{name}.path"),
                &table.path,
            );
        }
        if let Some(allowed) = self.policy.and_then(|p| p.env.as_ref()) {
            for (i, name) in caps.env.iter().enumerate() {
                if !allowed.contains(name) {
                    let message = if allowed.is_empty() {
                        format!(
                            "{name:?} may not be granted: {} grants no variables",
                            self.by_policy()
                        )
                    } else {
                        format!(
                            "{name:?} may not be granted: {} allows only {}",
                            self.by_policy(),
                            allowed.join(", ")
                        )
                    };
                    self.push(format!("{at}.capabilities.env[{i}]"), message);
                }
            }
        }
        if self.policy.is_some_and(|p| !p.private_networks) {
            for (i, grant) in caps.http.iter().enumerate() {
                if let Ok(ip) = grant.host.parse::<std::net::IpAddr>()
                    && let Some(class) = crate::plugin::special_address(ip)
                {
                    self.push(
                        format!("{at}.capabilities.http[{i}]"),
                        format!(
                            "{ip} is a {class} address, and {} lets plugins reach public addresses only",
                            self.by_policy()
                        ),
                    );
                }
            }
        }
    }
}

/// `path` as the kernel would find it: each component that exists canonicalised as it is
/// reached (symlinks followed), `..` taken from what was reached, so neither a symlink nor a
/// `..` after one can lead the check astray; parts that do not exist yet are kept as written.
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => {
                out.push(other.as_os_str());
                if let Ok(real) = std::fs::canonicalize(&out) {
                    out = real;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_file_parses_and_reports_every_problem() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tenant")).unwrap();
        let good = r#"
[paths]
roots = ["tenant"]
[grants]
env = ["API_TOKEN"]
private_networks = false
[limits]
memory = "64 MiB"
timeout = "5s"
fuel = 1000
"#;
        let p = parse_policy(good, dir.path(), "policy.toml").unwrap();
        assert_eq!(
            p.roots,
            Some(vec![
                std::fs::canonicalize(dir.path().join("tenant")).unwrap()
            ])
        );
        assert_eq!(p.env, Some(vec!["API_TOKEN".to_owned()]));
        assert_eq!(p.max_memory, Some(64 << 20));
        assert_eq!(p.max_timeout, Some(Duration::from_secs(5)));
        assert_eq!(p.max_fuel, Some(1000));
        assert!(!p.private_networks);

        let bad =
            "[paths]\nroots = [\"nowhere\"]\n[grants]\nenv = [\"A=B\"]\n[limits]\nmemory = 0\n";
        let e = parse_policy(bad, dir.path(), "policy.toml").unwrap_err();
        let paths: Vec<&str> = e.problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["paths.roots[0]", "grants.env[0]", "limits.memory"]);

        let unknown = parse_policy("[grants]\nnet = true\n", dir.path(), "p").unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `net`"),
            "{unknown}"
        );
    }

    #[test]
    fn resolved_paths_follow_symlinks_and_dot_dots() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(real.join("inside")).unwrap();
        std::os::unix::fs::symlink("/etc", real.join("inside/link")).unwrap();
        assert_eq!(resolved(&real.join("inside/link/x")), Path::new("/etc/x"));
        // `..` after a symlink leaves the folder the link points to, as the kernel does.
        assert_eq!(resolved(&real.join("inside/link/../x")), Path::new("/x"));
        assert_eq!(
            resolved(&real.join("inside/not-yet/../../y")),
            real.join("y")
        );
        assert_eq!(
            resolved(&real.join("inside/../inside/new")),
            real.join("inside/new")
        );
    }
}
