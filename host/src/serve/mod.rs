//! `weir serve`: many tenants' queries in one process, behind an HTTP API (DESIGN.md §9).
//!
//! Why one process: a host that runs each tenant's query as its own `weir run` pays a process,
//! a Wasm engine and a compiled-plugin cache per query, and has no one place that sees them
//! all. Here the tenants file says who may call and what each may use ([`tenants`]), the host
//! keeps every tenant's queries, each on its own thread and confined to the tenant's folder
//! ([`host`]), and the API on tokio answers for them ([`api`]). `weir run --metrics` serves the
//! same Prometheus figures for a single query ([`serve_metrics`]).

mod api;
mod host;
mod tenants;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use host::{Host, HostOptions, Hosted, ServeError, Status};
pub use tenants::{Caller, Tenant, Tenants, load_tenants, parse_tenants, valid_name};

use axum::http::header;

use crate::progress::{METRICS_CONTENT_TYPE, Metrics};
use crate::spec::SpecErrors;

/// How often a stopping server looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// What `weir serve` needs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `--listen`: the API's address (port 0: any free port).
    pub listen: String,
    /// `--tenants`: the tenants file.
    pub tenants: PathBuf,
    pub host: HostOptions,
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Tenants(SpecErrors),
    #[error(transparent)]
    Host(#[from] ServeError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("the API's runtime: {0}")]
    Runtime(std::io::Error),
}

fn runtime() -> Result<tokio::runtime::Runtime, StartError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("weir-api")
        .enable_all()
        .build()
        .map_err(StartError::Runtime)
}

async fn bind(addr: &str) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen {
            addr: addr.to_owned(),
            source,
        })
}

async fn until(stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(STOP_POLL).await;
    }
}

/// Runs the server until `stop` is set: resumes the saved queries, then answers the API;
/// `bound` is told the address it listens on. On stop, every query finishes its batch and the
/// ones that were running resume with the next start.
///
/// # Errors
/// A bad tenants file, a `--home` that cannot be set up, an address that cannot be bound.
pub fn serve(
    options: &ServeOptions,
    stop: Arc<AtomicBool>,
    bound: impl FnOnce(SocketAddr),
) -> Result<(), StartError> {
    let tenants = load_tenants(&options.tenants).map_err(StartError::Tenants)?;
    let rt = runtime()?;
    let listener = rt.block_on(bind(&options.listen))?;
    let addr = listener.local_addr().map_err(|source| StartError::Listen {
        addr: options.listen.clone(),
        source,
    })?;
    let host = Host::open(tenants, &options.host, Metrics::new())?;
    bound(addr);
    let app = api::router(Arc::clone(&host));
    let served = rt.block_on(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(until(stop))
            .await
    });
    host.shutdown();
    served.map_err(|source| StartError::Listen {
        addr: addr.to_string(),
        source,
    })
}

/// Serves `GET /metrics` for `metrics` on `addr` from a thread of its own, for as long as the
/// process runs (`weir run --metrics`). Answers the address it bound.
///
/// # Errors
/// When the address cannot be bound.
pub fn serve_metrics(addr: &str, metrics: Arc<Metrics>) -> Result<SocketAddr, StartError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    let listener = rt.block_on(bind(addr))?;
    let local = listener.local_addr().map_err(|source| StartError::Listen {
        addr: addr.to_owned(),
        source,
    })?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = metrics.render(None);
            async move { ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text) }
        }),
    );
    std::thread::Builder::new()
        .name("weir-metrics".into())
        .spawn(move || {
            if let Err(e) = rt.block_on(async move { axum::serve(listener, app).await }) {
                tracing::warn!("the metrics endpoint stopped: {e}");
            }
        })
        .map_err(StartError::Runtime)?;
    Ok(local)
}
