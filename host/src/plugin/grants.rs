//! What a plugin may reach beyond its sandbox: each grant is named in the
//! pipeline file (`capabilities = { dirs, env, http }`), and nothing else is
//! reachable. Folders are WASI preopens; environment variables are copied by
//! name, so the host's other variables (credentials, paths) stay invisible;
//! outgoing HTTP goes through `wasi:http`, where the host checks every
//! request's authority against the plugin's allow-list before connecting.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::Linker;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

use super::error::PluginError;
use super::http_connect;
use super::instance::Sandbox;
use super::state::HostState;

/// One `capabilities.http` entry: a host, and optionally the one port allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGrant {
    /// A host name or IP address, lower case (IPv6 without brackets).
    pub host: String,
    /// `None`: any port of `host`.
    pub port: Option<u16>,
}

impl HttpGrant {
    /// Reads `"host"`, `"host:port"` or `"[v6]:port"`.
    ///
    /// # Errors
    /// A message saying what is wrong with `text`, for the pipeline file's problem list.
    pub fn parse(text: &str) -> Result<Self, String> {
        let not = |why: &str| format!("{text:?} is not a host to allow: {why}");
        if text.contains("://") {
            return Err(not(
                "write the host without a scheme, e.g. \"api.example.com:8080\"",
            ));
        }
        if text.contains(['/', '?', '#', '@']) || text.chars().any(char::is_whitespace) {
            return Err(not("write only the host and an optional port, no path"));
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let Some((host, after)) = rest.split_once(']') else {
                return Err(not("an IPv6 address needs its closing \"]\""));
            };
            match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None if after.is_empty() => (host, None),
                None => return Err(not("expected \":port\" after \"]\"")),
            }
        } else {
            match text.rsplit_once(':') {
                Some((_, _)) if text.matches(':').count() > 1 => {
                    return Err(not("write an IPv6 address as \"[addr]:port\""));
                }
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            }
        };
        if host.is_empty() {
            return Err(not("the host is empty"));
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(not("the port must be a number from 1 to 65535")),
            },
        };
        Ok(Self {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    fn allows(&self, host: &str, port: u16) -> bool {
        self.host.eq_ignore_ascii_case(host) && self.port.is_none_or(|p| p == port)
    }
}

impl std::fmt::Display for HttpGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(port) => write!(f, "{host}:{port}"),
            None => f.write_str(&host),
        }
    }
}

/// The hosts one plugin may send HTTP requests to, and how long a request may take.
#[derive(Debug, Clone, Default)]
pub(crate) struct HttpAllowList {
    grants: Vec<HttpGrant>,
    /// The plugin's per-call time limit: no timeout of a request is much longer.
    timeout: Duration,
    /// Whether loopback, private and link-local addresses may be reached (by a grant of the
    /// address itself; see `http_connect`).
    private_networks: bool,
}

impl HttpAllowList {
    pub(crate) fn new(grants: &[HttpGrant], timeout: Duration, private_networks: bool) -> Self {
        Self {
            grants: grants.to_vec(),
            timeout,
            private_networks,
        }
    }

    /// Why a request to `host:port` is refused, or `None` when it is allowed.
    pub(crate) fn refusal(&self, host: &str, port: u16) -> Option<String> {
        if self.grants.iter().any(|g| g.allows(host, port)) {
            return None;
        }
        Some(if self.grants.is_empty() {
            format!("HTTP to {host}:{port} refused: the plugin has no `capabilities.http` grant")
        } else {
            let allowed: Vec<String> = self.grants.iter().map(ToString::to_string).collect();
            format!(
                "HTTP to {host}:{port} refused: not in its `capabilities.http` allow-list [{}]",
                allowed.join(", ")
            )
        })
    }
}

/// Chooses rustls' crypto provider for the whole process (once; a provider
/// installed earlier is kept), before any plugin sends an HTTPS request.
///
/// wasi:http's TLS client asks rustls for the process default, and rustls
/// picks one by itself only when exactly one is compiled in; this build links
/// two (ring through wasmtime-wasi-http, aws-lc-rs through deltalake), so the
/// first `https` request of a plugin would panic the query's thread instead.
pub(crate) fn install_tls_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Err: another part of the process chose first, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Links wasi:http for every plugin: a guest that imports it can start
/// without a grant, and its requests are refused one by one (with an error
/// naming the host) rather than the whole plugin failing to link.
pub(crate) fn add_http_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi_http::p2::add_only_http_to_linker_sync(linker)
}

/// What wasi:http's `send_request` hook resolves to: the response and the
/// future that finishes its connection.
type SendResult = Result<
    (
        http::Response<WasiBody>,
        Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ),
    HttpError,
>;

/// The store's wasi:http hooks: the allow-list, and the refusal of the call
/// in progress (hooks are a field of their own, so they cannot reach the rest
/// of the store).
pub(crate) struct HttpGuard {
    allow: Arc<HttpAllowList>,
    plugin: Arc<str>,
    /// The first refused request of the current call. Shared: a refusal by
    /// address is found while the request runs, after the hook returned.
    denied: Arc<Denied>,
    /// The deadline of the current call (see `deadline`): a request sent
    /// during the call ends there, whether or not the guest waits for it.
    pub(crate) deadline: Option<Instant>,
}

/// The first refusal of a call, tagged with the call, so that a request
/// still resolving when its call ended cannot fail the next one.
#[derive(Debug, Default)]
struct Denied {
    call: std::sync::atomic::AtomicU64,
    reason: std::sync::Mutex<Option<(u64, String)>>,
}

impl Denied {
    fn record(&self, call: u64, reason: String) {
        if let Ok(mut first) = self.reason.lock()
            && first.is_none()
            && self.call.load(std::sync::atomic::Ordering::SeqCst) == call
        {
            *first = Some((call, reason));
        }
    }
}

impl HttpGuard {
    pub(crate) fn new(allow: Arc<HttpAllowList>, plugin: Arc<str>) -> Self {
        Self {
            allow,
            plugin,
            denied: Arc::default(),
            deadline: None,
        }
    }

    /// Starts a new call: refusals of earlier calls no longer count.
    pub(crate) fn begin_call(&mut self) {
        self.denied
            .call
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut first) = self.denied.reason.lock() {
            *first = None;
        }
    }

    /// The first request the current call had refused.
    pub(crate) fn take_denied(&mut self) -> Option<String> {
        let call = self.denied.call.load(std::sync::atomic::Ordering::SeqCst);
        let mut first = self.denied.reason.lock().ok()?;
        match first.take() {
            Some((at, reason)) if at == call => Some(reason),
            _ => None,
        }
    }

    fn deny(&self, reason: String) {
        tracing::warn!(plugin = &*self.plugin, "{reason}");
        let call = self.denied.call.load(std::sync::atomic::Ordering::SeqCst);
        self.denied.record(call, reason);
    }
}

impl WasiHttpHooks for HttpGuard {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let uri = request.uri();
        let host = uri.host().unwrap_or_default();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let tls = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        if let Some(reason) = self.allow.refusal(host, port) {
            self.deny(reason);
            let refused: SendResult = Err(HttpError::HttpRequestDenied);
            return Box::new(async move { refused });
        }
        let target = http_connect::Target {
            host: host.to_owned(),
            port,
            tls,
        };
        // The guest's own waits end at the call's deadline (`deadline`), but
        // the request runs as a task of its own: it must end soon after, and
        // its per-step timeouts (connect, first byte, between body chunks) are
        // capped. The step wasmtime does not time (the TLS handshake) is
        // bounded by the deadline on the whole exchange below. Both come a
        // grace period after the deadline, so that a stalled request always
        // fails the call with the time-limit error, never with a timeout the
        // guest sees first and reports as something else.
        let limit = self.allow.timeout.saturating_add(REQUEST_GRACE);
        let options = options.unwrap_or_default();
        let cap = |t: Option<Duration>| Some(t.map_or(limit, |t| t.min(limit)));
        let options = RequestOptions {
            connect_timeout: cap(options.connect_timeout),
            first_byte_timeout: cap(options.first_byte_timeout),
            between_bytes_timeout: cap(options.between_bytes_timeout),
        };
        // Resolved, checked and connected to the checked address, under the capped timeouts.
        drop(fut);
        let grants = self.allow.grants.clone();
        let private_networks = self.allow.private_networks;
        let denied = Arc::clone(&self.denied);
        let call = denied.call.load(std::sync::atomic::Ordering::SeqCst);
        let plugin = Arc::clone(&self.plugin);
        let send = async move {
            match http_connect::send(request, options, target, grants, private_networks).await {
                Ok(sent) => Ok(sent),
                Err(Ok(reason)) => {
                    tracing::warn!(plugin = &*plugin, "{reason}");
                    denied.record(call, reason);
                    Err(HttpError::DestinationIpProhibited)
                }
                Err(Err(e)) => Err(e),
            }
        };
        let Some(deadline) = self.deadline.and_then(|d| d.checked_add(REQUEST_GRACE)) else {
            return Box::new(send);
        };
        Box::new(async move {
            let deadline = tokio::time::Instant::from_std(deadline);
            match tokio::time::timeout_at(deadline, send).await {
                Ok(sent) => sent,
                Err(_) => Err(HttpError::ConnectionTimeout),
            }
        })
    }
}

/// How long after the call's deadline a request it sent is abandoned (see
/// `send_request`).
const REQUEST_GRACE: Duration = Duration::from_secs(1);

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_guard,
        }
    }
}

/// Preopens the granted folders and copies the granted variables into `wasi`.
///
/// # Errors
/// [`PluginError::Grant`] when a folder cannot be opened.
pub(crate) fn apply(
    plugin: &str,
    sandbox: &Sandbox,
    wasi: &mut WasiCtxBuilder,
) -> Result<(), PluginError> {
    for grant in &sandbox.dirs {
        let perms = if grant.writable {
            FsPerms::ReadWrite
        } else {
            FsPerms::ReadOnly
        };
        wasi.preopened_dir(&grant.host, &grant.guest, perms)
            .map_err(|e| PluginError::Grant {
                plugin: plugin.to_owned(),
                host: grant.host.clone(),
                reason: format!("{e:#}"),
            })?;
    }
    for (name, value) in &sandbox.env {
        wasi.env(name, value);
    }
    Ok(())
}

/// The values of the granted variables `names`, read from the host's
/// environment when the plugin starts.
///
/// # Errors
/// [`PluginError::EnvNotSet`] for the first name the host does not have (a
/// grant of a missing variable is a deployment mistake, better found at start
/// than as a plugin that silently sees nothing).
pub fn env_from_host(plugin: &str, names: &[String]) -> Result<Vec<(String, String)>, PluginError> {
    names
        .iter()
        .map(|name| match std::env::var(name) {
            Ok(value) => Ok((name.clone(), value)),
            Err(_) => Err(PluginError::EnvNotSet {
                plugin: plugin.to_owned(),
                name: name.clone(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_grants_parse_and_match() {
        let g = HttpGrant::parse("API.example.com:8080").unwrap();
        assert_eq!(g.host, "api.example.com");
        assert_eq!(g.port, Some(8080));
        assert!(g.allows("api.example.com", 8080));
        assert!(!g.allows("api.example.com", 80));
        let any = HttpGrant::parse("127.0.0.1").unwrap();
        assert!(any.allows("127.0.0.1", 1234));
        assert!(!any.allows("127.0.0.2", 1234));
        let v6 = HttpGrant::parse("[::1]:99").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", Some(99)));
        assert_eq!(v6.to_string(), "[::1]:99");
        for bad in ["http://x", "x/y", "", ":80", "x:0", "x:y", "::1", "[::1"] {
            assert!(HttpGrant::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn the_allow_list_says_why_it_refuses() {
        let none = HttpAllowList::new(&[], Duration::from_secs(1), true);
        let why = none.refusal("127.0.0.1", 80).unwrap();
        assert!(why.contains("no `capabilities.http` grant"), "{why}");
        let list = HttpAllowList::new(
            &[HttpGrant::parse("a.test:1").unwrap()],
            Duration::from_secs(1),
            true,
        );
        assert!(list.refusal("a.test", 1).is_none());
        let why = list.refusal("b.test", 1).unwrap();
        assert!(why.contains("HTTP to b.test:1 refused"), "{why}");
        assert!(why.contains("[a.test:1]"), "{why}");
    }
}
