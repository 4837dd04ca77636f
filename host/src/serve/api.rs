//! The HTTP API of `weir serve` (DESIGN.md §9): routes, bearer tokens, and JSON errors.
//!
//! Why every handler hands its work to a blocking thread: the host's calls touch files and may
//! wait for a query's batch to end (a stop, a plugin upload); the API's own threads stay free,
//! so one tenant's slow request never delays another's. Another tenant's query or plugin is
//! answered exactly as one that does not exist (404), so names do not leak across tenants.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;

use super::host::{Host, ServeError};
use super::tenants::Caller;
use crate::progress::METRICS_CONTENT_TYPE;

/// The dashboard, embedded: it holds no data (it reads the API with the token it is given), so
/// it is served to anyone.
const DASHBOARD_HTML: &str = include_str!("dashboard/index.html");
const DASHBOARD_JS: &str = include_str!("dashboard/dashboard.js");
const DASHBOARD_CSS: &str = include_str!("dashboard/dashboard.css");

/// Progress records one `progress` request returns at most.
const PROGRESS_LIMIT: usize = 1000;

/// The routes of the API over `host`.
pub fn router(host: Arc<Host>) -> Router {
    let limit = usize::try_from(host.max_upload_bytes).unwrap_or(usize::MAX);
    Router::new()
        .route("/v1/tenant", get(tenant_info))
        .route("/v1/plugins", get(list_plugins))
        .route("/v1/plugins/{name}", put(put_plugin))
        .route("/v1/queries", get(list_queries))
        .route(
            "/v1/queries/{name}",
            put(create_query).get(show_query).delete(delete_query),
        )
        .route("/v1/queries/{name}/validate", post(validate_query))
        .route("/v1/queries/{name}/progress", get(query_progress))
        .route("/v1/queries/{name}/stop", post(stop_query))
        .route("/v1/queries/{name}/start", post(start_query))
        .route("/metrics", get(metrics))
        .route(
            "/",
            get(|| asset("text/html; charset=utf-8", DASHBOARD_HTML)),
        )
        .route(
            "/dashboard.js",
            get(|| asset("text/javascript; charset=utf-8", DASHBOARD_JS)),
        )
        .route(
            "/dashboard.css",
            get(|| asset("text/css; charset=utf-8", DASHBOARD_CSS)),
        )
        .layer(DefaultBodyLimit::max(limit))
        .with_state(host)
}

/// An error answer: a status and a JSON body with at least `error`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: serde_json::Value,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            body: serde_json::json!({ "error": message.into() }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<ServeError> for ApiError {
    fn from(e: ServeError) -> Self {
        let message = e.to_string();
        match e {
            ServeError::NotFound { .. } => Self::new(StatusCode::NOT_FOUND, message),
            ServeError::Invalid(errors) => {
                let problems: Vec<serde_json::Value> = errors
                    .problems
                    .iter()
                    .map(|p| serde_json::json!({"key": p.path, "message": p.message}))
                    .collect();
                Self {
                    status: StatusCode::BAD_REQUEST,
                    body: serde_json::json!({
                        "error": format!("{}: {} problem(s)", errors.origin, errors.problems.len()),
                        "problems": problems,
                    }),
                }
            }
            ServeError::BadRequest { .. } => Self::new(StatusCode::BAD_REQUEST, message),
            ServeError::Quota { quota, .. } => Self {
                status: StatusCode::FORBIDDEN,
                body: serde_json::json!({"error": message, "quota": quota}),
            },
            ServeError::Conflict { .. } => Self::new(StatusCode::CONFLICT, message),
            ServeError::Backoff { retry_after, .. } => Self {
                status: StatusCode::TOO_MANY_REQUESTS,
                body: serde_json::json!({
                    "error": message,
                    "retry_after_seconds": retry_after.as_secs().max(1),
                }),
            },
            ServeError::Refused { reasons, .. } => Self {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                body: serde_json::json!({"error": message, "refused": reasons}),
            },
            ServeError::Io { .. } => {
                tracing::error!("{message}");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
            }
        }
    }
}

type Answer = Result<Response, ApiError>;

/// Who sent the request: 401 without a known bearer token.
fn caller<'h>(host: &'h Host, headers: &HeaderMap) -> Result<Caller<'h>, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "send the tenant's token: Authorization: Bearer <token>",
        ));
    };
    host.tenants
        .caller(token)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unknown token"))
}

/// The tenant the request acts for (the operator's token reads metrics only).
fn tenant(host: &Host, headers: &HeaderMap) -> Result<String, ApiError> {
    match caller(host, headers)? {
        Caller::Tenant(t) => Ok(t.name.clone()),
        Caller::Operator => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the operator's token reads /metrics only; a tenant's token acts for that tenant",
        )),
    }
}

/// Runs `work` on a blocking thread and answers its JSON with `status`.
async fn blocking<T: serde::Serialize + Send + 'static>(
    status: StatusCode,
    work: impl FnOnce() -> Result<T, ServeError> + Send + 'static,
) -> Answer {
    let done = tokio::task::spawn_blocking(work).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the request's work failed: {e}"),
        )
    })?;
    Ok((status, Json(done?)).into_response())
}

fn utf8(body: &Bytes) -> Result<String, ApiError> {
    String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "the pipeline is not UTF-8 text"))
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn tenant_info(State(host): State<Arc<Host>>, headers: HeaderMap) -> Answer {
    let name = tenant(&host, &headers)?;
    let info = host
        .tenants
        .get(&name)
        .map(super::tenants::Tenant::describe);
    Ok(Json(info).into_response())
}

async fn list_plugins(State(host): State<Arc<Host>>, headers: HeaderMap) -> Answer {
    let tenant = tenant(&host, &headers)?;
    blocking(StatusCode::OK, move || host.plugins(&tenant)).await
}

async fn put_plugin(
    State(host): State<Arc<Host>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let tenant = tenant(&host, &headers)?;
    blocking(StatusCode::OK, move || {
        host.put_plugin(&tenant, &name, &body)
    })
    .await
}

async fn list_queries(State(host): State<Arc<Host>>, headers: HeaderMap) -> Answer {
    let tenant = tenant(&host, &headers)?;
    blocking(StatusCode::OK, move || {
        let queries = host.queries(&tenant)?;
        Ok(queries
            .iter()
            .map(|q| q.describe(false))
            .collect::<Vec<_>>())
    })
    .await
}

async fn create_query(
    State(host): State<Arc<Host>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let tenant = tenant(&host, &headers)?;
    let text = utf8(&body)?;
    blocking(StatusCode::CREATED, move || {
        Ok(host.create(&tenant, &name, &text)?.describe(false))
    })
    .await
}

async fn validate_query(
    State(host): State<Arc<Host>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let tenant = tenant(&host, &headers)?;
    let text = utf8(&body)?;
    blocking(StatusCode::OK, move || {
        let warnings = host.validate(&tenant, &name, &text)?;
        Ok(serde_json::json!({"ok": true, "warnings": warnings}))
    })
    .await
}

async fn show_query(
    State(host): State<Arc<Host>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let tenant = tenant(&host, &headers)?;
    blocking(StatusCode::OK, move || {
        Ok(host.query(&tenant, &name)?.describe(true))
    })
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressParams {
    after: Option<u64>,
    limit: Option<usize>,
}

async fn query_progress(
    State(host): State<Arc<Host>>,
    Path(name): Path<String>,
    Query(params): Query<ProgressParams>,
    headers: HeaderMap,
) -> Answer {
    let tenant = tenant(&host, &headers)?;
    let limit = params.limit.unwrap_or(PROGRESS_LIMIT).min(PROGRESS_LIMIT);
    blocking(StatusCode::OK, move || {
        Ok(host
            .query(&tenant, &name)?
            .progress_after(params.after, limit))
    })
    .await
}

async fn stop_query(
    State(host): State<Arc<Host>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let tenant = tenant(&host, &headers)?;
    blocking(StatusCode::OK, move || {
        host.stop(&tenant, &name)?;
        Ok(host.query(&tenant, &name)?.describe(false))
    })
    .await
}

async fn start_query(
    State(host): State<Arc<Host>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let tenant = tenant(&host, &headers)?;
    blocking(StatusCode::OK, move || {
        Ok(host.start(&tenant, &name)?.describe(false))
    })
    .await
}

async fn delete_query(
    State(host): State<Arc<Host>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let tenant = tenant(&host, &headers)?;
    blocking(StatusCode::OK, move || {
        host.delete(&tenant, &name)?;
        Ok(serde_json::json!({"name": name, "deleted": true}))
    })
    .await
}

async fn metrics(State(host): State<Arc<Host>>, headers: HeaderMap) -> Answer {
    let text = match caller(&host, &headers)? {
        Caller::Tenant(t) => host.metrics.render(Some(&t.name)),
        Caller::Operator => host.metrics.render(None),
    };
    Ok(([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response())
}
