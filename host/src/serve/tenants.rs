//! The tenants file of `weir serve`: who may call the API, with which token, and what each
//! tenant may use (its quotas).
//!
//! Why digests: the file holds the SHA-256 of each bearer token, never the token, so the file
//! can be read by whoever operates the host without handing out tenants' credentials. A
//! request's token is hashed and compared against every tenant's digest in constant time (no
//! early exit, no comparison that stops at the first differing byte), so neither the time of a
//! refusal nor that of an answer tells an attacker how close a guess was or which tenant it
//! came near.

use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::spec::{ByteSize, HumanDuration, Problem, SpecErrors, format_byte_size};

/// One tenant: its name (its folder under `--home`), token digest and quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    digest: [u8; 32],
    /// How many queries it may have (running or not).
    pub max_queries: usize,
    /// The most its queries' plugins may ask for in all (the sum of their `limits.memory`).
    pub memory_bytes: u64,
    /// The longest `limits.timeout` (per call) a plugin of its may ask for.
    pub max_timeout: Duration,
    /// The most `limits.fuel` a plugin of its may ask for; when set, its plugins must be metered.
    pub max_fuel: Option<u64>,
    /// Whether its pipelines may have webhook listeners (`[[listener]] url`).
    pub webhooks: bool,
    /// The most `query.threads` a query of its may use, and what it gets when the pipeline
    /// does not say: one core by default, so that a tenant's batch cannot take every core
    /// of the host from its neighbours.
    pub max_threads: NonZeroUsize,
}

/// Who else may read: the operator's token sees every tenant's metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    pub tenants: Vec<Tenant>,
    operator: Option<[u8; 32]>,
}

/// Who a request's token belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller<'a> {
    Tenant(&'a Tenant),
    Operator,
}

const DEFAULT_MAX_QUERIES: usize = 10;
const DEFAULT_MEMORY: u64 = 2 << 30;
const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tenant: Vec<RawTenant>,
    operator: Option<RawOperator>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOperator {
    token_sha256: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    token_sha256: String,
    max_queries: Option<usize>,
    memory: Option<ByteSize>,
    max_timeout: Option<HumanDuration>,
    max_fuel: Option<u64>,
    #[serde(default)]
    webhooks: bool,
    max_threads: Option<usize>,
}

/// Whether `name` may name a tenant, a query or a plugin: it becomes a folder or file name and
/// a URL segment, so lower-case letters, digits, `_` and `-`, not starting with `-` or `_`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn digest(hex_text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_text.trim()).ok()?;
    bytes.try_into().ok()
}

/// Reads the tenants file at `path`.
///
/// # Errors
/// [`SpecErrors`] naming the file, with every problem found.
pub fn load_tenants(path: &Path) -> Result<Tenants, SpecErrors> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SpecErrors {
        origin: origin.clone(),
        problems: vec![Problem::new(
            "",
            format!("cannot read the tenants file: {e}"),
        )],
    })?;
    parse_tenants(&text, &origin)
}

/// Validates tenants-file text; `origin` names it in errors.
///
/// # Errors
/// [`SpecErrors`] with every problem found.
pub fn parse_tenants(text: &str, origin: &str) -> Result<Tenants, SpecErrors> {
    let fail = |problems: Vec<Problem>| SpecErrors {
        origin: origin.to_owned(),
        problems,
    };
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or_else(String::new, |span| {
            let before = &text[..span.start.min(text.len())];
            format!("line {}", before.matches('\n').count() + 1)
        });
        fail(vec![Problem::new(
            at,
            format!("invalid tenants file: {}", e.message().trim_end()),
        )])
    })?;
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    let mut digests = BTreeSet::new();
    let mut tenants = Vec::new();
    let bad_digest = "must be the 64 hex digits of the SHA-256 of the tenant's token \
                      (printf %s TOKEN | sha256sum)";
    for (i, t) in raw.tenant.into_iter().enumerate() {
        let at = format!("tenant[{i}]");
        if !valid_name(&t.name) {
            problems.push(Problem::new(
                format!("{at}.name"),
                format!(
                    "{:?} is not a tenant name: 1 to 64 lower-case letters, digits, '_' or '-', starting with a letter or digit",
                    t.name
                ),
            ));
        } else if !names.insert(t.name.clone()) {
            problems.push(Problem::new(
                format!("{at}.name"),
                format!("{:?} is named twice", t.name),
            ));
        }
        let Some(d) = digest(&t.token_sha256) else {
            problems.push(Problem::new(format!("{at}.token_sha256"), bad_digest));
            continue;
        };
        if !digests.insert(d) {
            problems.push(Problem::new(
                format!("{at}.token_sha256"),
                "is another tenant's too: each tenant needs its own token",
            ));
        }
        let memory_bytes = t.memory.map_or(DEFAULT_MEMORY, |m| m.0);
        if memory_bytes == 0 {
            problems.push(Problem::new(
                format!("{at}.memory"),
                "must be more than zero",
            ));
        }
        let max_timeout = t.max_timeout.map_or(DEFAULT_MAX_TIMEOUT, Duration::from);
        if max_timeout.is_zero() {
            problems.push(Problem::new(
                format!("{at}.max_timeout"),
                "must be longer than zero",
            ));
        }
        let max_threads = match t.max_threads {
            None => NonZeroUsize::MIN,
            Some(n) => NonZeroUsize::new(n).unwrap_or_else(|| {
                problems.push(Problem::new(
                    format!("{at}.max_threads"),
                    "must be at least 1",
                ));
                NonZeroUsize::MIN
            }),
        };
        tenants.push(Tenant {
            name: t.name,
            digest: d,
            max_queries: t.max_queries.unwrap_or(DEFAULT_MAX_QUERIES),
            memory_bytes,
            max_timeout,
            max_fuel: t.max_fuel,
            webhooks: t.webhooks,
            max_threads,
        });
    }
    let operator = match raw.operator {
        None => None,
        Some(op) => match digest(&op.token_sha256) {
            Some(d) if digests.contains(&d) => {
                problems.push(Problem::new(
                    "operator.token_sha256",
                    "is a tenant's token too: the operator needs its own",
                ));
                None
            }
            Some(d) => Some(d),
            None => {
                problems.push(Problem::new("operator.token_sha256", bad_digest));
                None
            }
        },
    };
    if problems.is_empty() {
        Ok(Tenants { tenants, operator })
    } else {
        Err(fail(problems))
    }
}

impl Tenants {
    /// Who `token` belongs to, if anyone. Every digest is compared, in constant time.
    pub fn caller(&self, token: &str) -> Option<Caller<'_>> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for tenant in &self.tenants {
            if bool::from(tenant.digest.ct_eq(&presented)) {
                found = Some(Caller::Tenant(tenant));
            }
        }
        if let Some(op) = &self.operator
            && bool::from(op.ct_eq(&presented))
        {
            found = Some(Caller::Operator);
        }
        found
    }

    pub fn get(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.name == name)
    }
}

impl Tenant {
    /// The quotas in words, for `GET /v1/tenant`.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "max_queries": self.max_queries,
            "memory": format_byte_size(self.memory_bytes),
            "max_timeout": crate::spec::format_duration(self.max_timeout),
            "max_fuel": self.max_fuel,
            "webhooks": self.webhooks,
            "max_threads": self.max_threads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(token: &str) -> String {
        hex::encode(Sha256::digest(token.as_bytes()))
    }

    #[test]
    fn reads_tenants_and_finds_callers_by_token() {
        let text = format!(
            "[[tenant]]\nname = \"acme\"\ntoken_sha256 = \"{}\"\nmax_queries = 3\nmemory = \"512 MiB\"\n\n\
             [[tenant]]\nname = \"zeta\"\ntoken_sha256 = \"{}\"\nmax_fuel = 1000000\nmax_threads = 4\n\n\
             [operator]\ntoken_sha256 = \"{}\"\n",
            sha("a-token"),
            sha("z-token"),
            sha("op-token")
        );
        let t = parse_tenants(&text, "tenants.toml").unwrap();
        assert_eq!(t.tenants.len(), 2);
        assert_eq!(t.tenants[0].max_queries, 3);
        assert_eq!(t.tenants[0].memory_bytes, 512 << 20);
        assert_eq!(t.tenants[1].max_queries, DEFAULT_MAX_QUERIES);
        assert_eq!(t.tenants[1].max_fuel, Some(1_000_000));
        assert_eq!(t.tenants[0].max_threads.get(), 1);
        assert_eq!(t.tenants[1].max_threads.get(), 4);
        assert!(matches!(t.caller("a-token"), Some(Caller::Tenant(x)) if x.name == "acme"));
        assert!(matches!(t.caller("z-token"), Some(Caller::Tenant(x)) if x.name == "zeta"));
        assert_eq!(t.caller("op-token"), Some(Caller::Operator));
        assert_eq!(t.caller("a-token "), None);
        assert_eq!(t.caller(""), None);
    }

    #[test]
    fn reports_every_problem() {
        let text = format!(
            "[[tenant]]\nname = \"Acme\"\ntoken_sha256 = \"xyz\"\n\n\
             [[tenant]]\nname = \"b\"\ntoken_sha256 = \"{0}\"\nmemory = \"0 B\"\nmax_threads = 0\n\n\
             [[tenant]]\nname = \"b\"\ntoken_sha256 = \"{0}\"\n",
            sha("t")
        );
        let e = parse_tenants(&text, "tenants.toml").unwrap_err();
        let got: Vec<&str> = e.problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            got,
            [
                "tenant[0].name",
                "tenant[0].token_sha256",
                "tenant[1].memory",
                "tenant[1].max_threads",
                "tenant[2].name",
                "tenant[2].token_sha256"
            ],
            "{e}"
        );
        let unknown = parse_tenants("[[tenant]]\nname = \"a\"\ntoken = \"x\"\n", "t.toml");
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `token`")
        );
    }
}
