//! A query's `[[listener]]`s, Spark's `StreamingQueryListener`: they hear that the query started,
//! committed a batch (with its progress record), went idle, and ended.
//!
//! Why a thread and a bounded queue: a listener is someone else's code or service, and the query
//! must not wait for it. The batch loop only puts the event in a queue (never blocking: when the
//! queue is full the event is dropped and counted); one thread per query hands each event to
//! each listener in turn. A listener that fails or times out is logged and counted (in the next
//! progress record's `listeners`, Weir's addition), never the query's failure. At the end the
//! query gives its listeners a moment to hear that it terminated, then goes on without them.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::plugin::{QueryEvent, WasmListener, special_address};
use crate::progress::ListenerProgress;

/// Events waiting for the listener thread at most; more are dropped (and counted).
const QUEUE: usize = 1024;
/// How long a webhook may take to connect, and to answer.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a webhook's events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

/// Reads a webhook URL: `http://` or `https://`, a host, an optional port and path.
///
/// # Errors
/// A sentence saying what is wrong with it.
pub fn webhook_target(url: &str) -> Result<WebhookTarget, String> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(format!("{url:?} is not an http:// or https:// URL"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err(format!("{url:?}: credentials in the URL are not taken"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            let port = p
                .parse::<u16>()
                .map_err(|_| format!("{url:?}: {p:?} is not a port"))?;
            (h, port)
        }
        _ => (authority, if tls { 443 } else { 80 }),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{url:?} is not a URL with a host"));
    }
    Ok(WebhookTarget {
        tls,
        host: host.to_owned(),
        port,
        path: path.to_owned(),
    })
}

/// Someone who hears a query's events.
pub(super) enum Hearer {
    Plugin(Box<WasmListener>),
    Webhook {
        target: WebhookTarget,
        /// Whether it may reach loopback, private and link-local addresses.
        private_networks: bool,
    },
}

impl std::fmt::Debug for Hearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Plugin(p) => f.debug_tuple("Plugin").field(&p.name()).finish(),
            Self::Webhook { target, .. } => f.debug_tuple("Webhook").field(target).finish(),
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    events: AtomicU64,
    failures: AtomicU64,
}

/// The listener thread of one query, and its figures.
#[derive(Debug)]
pub(super) struct Listeners {
    queue: Option<SyncSender<QueryEvent>>,
    thread: Option<JoinHandle<()>>,
    names: Vec<String>,
    counts: Arc<Vec<Counts>>,
    dropped: Arc<AtomicU64>,
    /// The query's name, in logs.
    query: String,
}

impl Listeners {
    /// No listeners: every event goes nowhere.
    pub(super) fn none() -> Self {
        Self {
            queue: None,
            thread: None,
            names: Vec::new(),
            counts: Arc::default(),
            dropped: Arc::default(),
            query: String::new(),
        }
    }

    /// Starts the thread that hands events to `hearers` (name, hearer).
    pub(super) fn start(query: &str, hearers: Vec<(String, Hearer)>) -> Self {
        if hearers.is_empty() {
            return Self::none();
        }
        let names: Vec<String> = hearers.iter().map(|(n, _)| n.clone()).collect();
        let counts: Arc<Vec<Counts>> = Arc::new(names.iter().map(|_| Counts::default()).collect());
        let (queue, events) = sync_channel(QUEUE);
        let thread_counts = Arc::clone(&counts);
        let thread_query = query.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("{query}-listeners"))
            .spawn(move || hear(&thread_query, hearers, &events, &thread_counts));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(query = %query, "no thread for the listeners, they hear nothing: {e}");
                None
            }
        };
        Self {
            queue: thread.as_ref().map(|_| queue),
            thread,
            names,
            counts,
            dropped: Arc::default(),
            query: query.to_owned(),
        }
    }

    /// Whether anyone listens (so that an event is worth making).
    pub(super) fn any(&self) -> bool {
        self.queue.is_some()
    }

    /// Queues `event` without waiting: dropped (and counted) when the queue is full.
    pub(super) fn send(&self, event: QueryEvent) {
        let Some(queue) = &self.queue else { return };
        match queue.try_send(event) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(event)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(
                        query = %self.query,
                        "the listeners are {QUEUE} events behind: {} dropped ({n} so far)",
                        event.kind()
                    );
                }
            }
        }
    }

    /// Each listener's figures so far.
    pub(super) fn progress(&self) -> Vec<ListenerProgress> {
        self.names
            .iter()
            .zip(self.counts.iter())
            .map(|(name, c)| ListenerProgress {
                name: name.clone(),
                events: c.events.load(Ordering::Relaxed),
                failures: c.failures.load(Ordering::Relaxed),
                dropped: self.dropped(),
            })
            .collect()
    }

    /// Events dropped because the listeners were too far behind.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Closes the queue and waits up to `wait` for the listeners to hear what it held.
    pub(super) fn finish(&mut self, wait: Duration) {
        self.queue = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + wait;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            tracing::warn!(query = %self.query, "the listeners did not finish in {wait:?}: going on without them");
        }
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        // The thread ends once the queue is closed; nobody waits for it here.
        self.queue = None;
    }
}

fn hear(
    query: &str,
    mut hearers: Vec<(String, Hearer)>,
    events: &Receiver<QueryEvent>,
    counts: &[Counts],
) {
    while let Ok(event) = events.recv() {
        for ((name, hearer), count) in hearers.iter_mut().zip(counts) {
            let result = match hearer {
                Hearer::Plugin(plugin) => plugin.notify(&event).map_err(|e| e.to_string()),
                Hearer::Webhook {
                    target,
                    private_networks,
                } => post(target, *private_networks, &event),
            };
            match result {
                Ok(()) => {
                    count.events.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    count.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(query = %query, listener = %name, "listener {name} failed on {}: {e}", event.kind());
                }
            }
        }
    }
}

/// The JSON a webhook receives for `event`.
pub(super) fn event_json(event: &QueryEvent) -> serde_json::Value {
    match event {
        QueryEvent::Started { id, run_id, name } => {
            serde_json::json!({"event": event.kind(), "id": id, "runId": run_id, "name": name})
        }
        QueryEvent::Progress { json, .. } => {
            let progress: serde_json::Value =
                serde_json::from_str(json).unwrap_or(serde_json::Value::Null);
            serde_json::json!({"event": event.kind(), "progress": progress})
        }
        QueryEvent::Idle {
            id,
            run_id,
            timestamp,
        } => {
            serde_json::json!({"event": event.kind(), "id": id, "runId": run_id, "timestamp": timestamp})
        }
        QueryEvent::Terminated { id, run_id, error } => {
            serde_json::json!({"event": event.kind(), "id": id, "runId": run_id, "exception": error})
        }
    }
}

/// POSTs `event` to the webhook; an answer other than 2xx is a failure.
fn post(target: &WebhookTarget, private_networks: bool, event: &QueryEvent) -> Result<(), String> {
    let addrs: Vec<SocketAddr> = (target.host.as_str(), target.port)
        .to_socket_addrs()
        .map_err(|e| format!("{}: {e}", target.host))?
        .collect();
    if !private_networks
        && let Some((ip, kind)) = addrs
            .iter()
            .map(SocketAddr::ip)
            .find_map(|ip: IpAddr| special_address(ip).map(|k| (ip, k)))
    {
        return Err(format!(
            "{} is {ip}, a {kind} address, which the operator's policy does not let webhooks reach",
            target.host
        ));
    }
    let addr = addrs
        .first()
        .ok_or_else(|| format!("{}: no address", target.host))?;
    let tcp =
        TcpStream::connect_timeout(addr, WEBHOOK_TIMEOUT).map_err(|e| format!("{addr}: {e}"))?;
    tcp.set_read_timeout(Some(WEBHOOK_TIMEOUT))
        .and_then(|()| tcp.set_write_timeout(Some(WEBHOOK_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let body = event_json(event).to_string();
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: weir\r\n\r\n{body}",
        target.path,
        target.host,
        body.len()
    );
    let status = if target.tls {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.into(),
        };
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| format!("{}: {e}", target.host))?;
        let conn = rustls::ClientConnection::new(Arc::new(config), name)
            .map_err(|e| format!("{}: {e}", target.host))?;
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        exchange(&mut stream, &request)?
    } else {
        let mut stream = tcp;
        exchange(&mut stream, &request)?
    };
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(format!("the webhook answered {status}"))
    }
}

/// Writes `request` and reads the status code of the answer.
fn exchange(stream: &mut (impl Read + Write), request: &str) -> Result<u16, String> {
    stream
        .write_all(request.as_bytes())
        .and_then(|()| stream.flush())
        .map_err(|e| format!("sending: {e}"))?;
    let mut head = [0u8; 32];
    let mut read = 0;
    while read < 12 {
        match stream.read(&mut head[read..]) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&head[..read]);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_webhook_urls() {
        let t = webhook_target("https://hooks.example.com/weir?x=1").unwrap();
        assert_eq!(
            t,
            WebhookTarget {
                tls: true,
                host: "hooks.example.com".into(),
                port: 443,
                path: "/weir?x=1".into()
            }
        );
        let t = webhook_target("http://127.0.0.1:8080").unwrap();
        assert_eq!((t.port, t.path.as_str(), t.tls), (8080, "/", false));
        let t = webhook_target("http://[::1]:9/h").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9));
        for bad in [
            "ftp://x",
            "http://",
            "http://u:p@x/",
            "http://x:99999/",
            "x",
        ] {
            assert!(webhook_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        // A webhook nobody answers on a port that refuses: every event fails, quickly.
        let l = Listeners::start(
            "q",
            vec![(
                "hook".into(),
                Hearer::Webhook {
                    target: webhook_target("http://127.0.0.1:9/").unwrap(),
                    private_networks: false,
                },
            )],
        );
        let started = Instant::now();
        for i in 0..(QUEUE as u64 * 3) {
            l.send(QueryEvent::Progress {
                batch_id: i,
                json: "{}".into(),
            });
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "send never waits"
        );
        let mut l = l;
        l.finish(Duration::from_secs(10));
        let p = l.progress();
        assert_eq!(p[0].events, 0);
        assert_eq!(p[0].failures + l.dropped(), QUEUE as u64 * 3, "{p:?}");
        assert!(l.dropped() > 0);
    }
}
