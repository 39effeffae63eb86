//! The HTTP control API on loopback (axum on its own thread): list vDisks with their
//! state and counters, Prometheus `/metrics`, and mutating calls — add a vDisk
//! (`POST /vdisks`) or remove one (`DELETE /vdisks/NAME`), resize a partition,
//! change a write policy, start a destage job for one vDisk or all (progress at
//! `GET /destage`), prewarm from a snapshot directory (`POST /prewarm`, progress at
//! `GET /prewarm`), switch the allocator — that need
//! `Authorization: Bearer
//! TOKEN`. Without a configured token a random one is written, readable by the owner
//! only, to `api-token` in the metadata directory.

use crate::daemon::{Daemon, StartError};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Clone)]
struct Api {
    daemon: Arc<Daemon>,
    token: Arc<String>,
}

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

impl Api {
    fn authorize(&self, h: &HeaderMap) -> Result<(), Response> {
        let ok = h
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t == self.token.as_str());
        if ok {
            Ok(())
        } else {
            Err(err(StatusCode::UNAUTHORIZED, "mutating calls need `Authorization: Bearer TOKEN`"))
        }
    }

    fn vdisk(&self, name: &str) -> Result<u32, Response> {
        self.daemon.vdisk(name).ok_or_else(|| err(StatusCode::NOT_FOUND, format!("no vDisk named `{name}`")))
    }
}

async fn list(State(a): State<Api>) -> Response {
    Json(a.daemon.status()).into_response()
}

async fn metrics(State(a): State<Api>) -> Response {
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], a.daemon.render_metrics())
        .into_response()
}

/// The common path of every mutating call: the token, the vDisk (when named), the change
/// on a blocking thread (it does file I/O), then the new listing.
async fn mutate(
    a: Api,
    h: &HeaderMap,
    name: Option<&str>,
    f: impl FnOnce(&Daemon, Option<u32>) -> Result<(), String> + Send + 'static,
) -> Response {
    if let Err(r) = a.authorize(h) {
        return r;
    }
    let vm = match name.map(|n| a.vdisk(n)).transpose() {
        Ok(v) => v,
        Err(r) => return r,
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || f(&d, vm)).await {
        Ok(Ok(())) => list(State(a)).await,
        Ok(Err(e)) => err(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resize {
    /// New target in cache blocks, or
    blocks: Option<u64>,
    /// in bytes with a unit (`64MiB`).
    size: Option<String>,
}

async fn resize(State(a): State<Api>, h: HeaderMap, Path(name): Path<String>, Json(body): Json<Resize>) -> Response {
    let blocks = match (body.blocks, body.size) {
        (Some(b), None) => b,
        (None, Some(s)) => match cachevisor_trace::units::parse_size(&s) {
            Ok(bytes) => bytes / a.daemon.block_size(),
            Err(e) => return err(StatusCode::BAD_REQUEST, format!("size: {e}")),
        },
        _ => return err(StatusCode::BAD_REQUEST, "give exactly one of `blocks` or `size`"),
    };
    mutate(a, &h, Some(&name), move |d, vm| d.resize(vm.expect("named"), blocks).map_err(|e| e.to_string())).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyBody {
    policy: String,
}

async fn write_policy(
    State(a): State<Api>,
    h: HeaderMap,
    Path(name): Path<String>,
    Json(body): Json<PolicyBody>,
) -> Response {
    let p = match body.policy.parse::<cachevisor_engine::WritePolicy>() {
        Ok(p) => p,
        Err(e) => return err(StatusCode::BAD_REQUEST, e),
    };
    mutate(a, &h, Some(&name), move |d, vm| d.set_write_policy(vm.expect("named"), p).map_err(|e| e.to_string())).await
}

/// Starts a destage job for `vm` (or every vDisk): 202 with its progress, 409 when one
/// is already running.
async fn start_destage(a: Api, h: &HeaderMap, name: Option<&str>) -> Response {
    if let Err(r) = a.authorize(h) {
        return r;
    }
    let vm = match name.map(|n| a.vdisk(n)).transpose() {
        Ok(v) => v,
        Err(r) => return r,
    };
    match a.daemon.start_destage(vm) {
        Ok(p) => (StatusCode::ACCEPTED, Json(p)).into_response(),
        Err(p) => (StatusCode::CONFLICT, Json(p)).into_response(),
    }
}

async fn destage_one(State(a): State<Api>, h: HeaderMap, Path(name): Path<String>) -> Response {
    start_destage(a, &h, Some(&name)).await
}

async fn destage_all(State(a): State<Api>, h: HeaderMap) -> Response {
    start_destage(a, &h, None).await
}

fn change_err(e: crate::daemon::ChangeError) -> Response {
    use crate::daemon::ChangeError as C;
    let code = match &e {
        C::Invalid(_) => StatusCode::BAD_REQUEST,
        C::Conflict(_) => StatusCode::CONFLICT,
        C::NotFound(_) => StatusCode::NOT_FOUND,
        C::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    err(code, e.to_string())
}

/// `POST /vdisks` with a `[[vdisk]]` table as JSON: 201 with the new listing.
async fn add_vdisk(
    State(a): State<Api>,
    h: HeaderMap,
    body: Result<Json<crate::config::VdiskConfig>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if let Err(r) = a.authorize(&h) {
        return r;
    }
    let Json(v) = match body {
        Ok(v) => v,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.add_vdisk(v)).await {
        Ok(Ok(_)) => (StatusCode::CREATED, Json(a.daemon.status())).into_response(),
        Ok(Err(e)) => change_err(e),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `DELETE /vdisks/NAME`: writes its dirty blocks back, then removes it.
async fn remove_vdisk(State(a): State<Api>, h: HeaderMap, Path(name): Path<String>) -> Response {
    if let Err(r) = a.authorize(&h) {
        return r;
    }
    let vm = match a.vdisk(&name) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.remove_vdisk(vm)).await {
        Ok(Ok(())) => list(State(a)).await,
        Ok(Err(e)) => change_err(e),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn destage_progress(State(a): State<Api>) -> Response {
    Json(a.daemon.destage_job().progress()).into_response()
}

async fn prewarm_progress(State(a): State<Api>) -> Response {
    Json(a.daemon.prewarm_job().progress()).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrewarmBody {
    /// A snapshot directory readable by this daemon.
    from: std::path::PathBuf,
    /// Only this vDisk (default: every vDisk the snapshots name).
    #[serde(default)]
    vdisk: Option<String>,
}

/// `POST /prewarm` with `{"from": DIR}` (and `"vdisk": NAME` for one vDisk): 202 with
/// the progress, 409 when one runs, 400 when the snapshots cannot be read (the message
/// names the file) or the vDisk is not served.
async fn start_prewarm(
    State(a): State<Api>,
    h: HeaderMap,
    body: Result<Json<PrewarmBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if let Err(r) = a.authorize(&h) {
        return r;
    }
    let Json(b) = match body {
        Ok(v) => v,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.start_prewarm_of(&b.from, b.vdisk.as_deref())).await {
        Ok(Ok(p)) => (StatusCode::ACCEPTED, Json(p)).into_response(),
        Ok(Err(p)) if p.running => (StatusCode::CONFLICT, Json(p)).into_response(),
        Ok(Err(p)) => err(StatusCode::BAD_REQUEST, p.error.unwrap_or_default()),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllocatorBody {
    name: String,
    #[serde(default)]
    params: cachevisor_policy::params::Params,
}

async fn get_allocator(State(a): State<Api>) -> Response {
    Json(serde_json::json!({ "name": a.daemon.allocator_name() })).into_response()
}

async fn set_allocator(State(a): State<Api>, h: HeaderMap, Json(body): Json<AllocatorBody>) -> Response {
    if let Err(e) = cachevisor_policy::registry::build_with(&body.name, &body.params) {
        return err(StatusCode::BAD_REQUEST, e);
    }
    mutate(a, &h, None, move |d, _| d.set_allocator(&body.name, &body.params)).await
}

/// Starts the API on `addr` (port 0 = any); returns the bound address and the token.
pub fn start(daemon: Arc<Daemon>, addr: SocketAddr, token: String) -> Result<SocketAddr, StartError> {
    let l = std::net::TcpListener::bind(addr)
        .map_err(|source| StartError::File { path: format!("api.listen {addr}"), error: source })?;
    let bound =
        l.local_addr().map_err(|source| StartError::File { path: format!("api.listen {addr}"), error: source })?;
    l.set_nonblocking(true).map_err(|source| StartError::File { path: format!("api.listen {addr}"), error: source })?;
    let app = Router::new()
        .route("/vdisks", get(list).post(add_vdisk))
        .route("/vdisks/{name}", axum::routing::delete(remove_vdisk))
        .route("/metrics", get(metrics))
        .route("/vdisks/{name}/resize", post(resize))
        .route("/vdisks/{name}/write-policy", post(write_policy))
        .route("/vdisks/{name}/destage", post(destage_one))
        .route("/destage", get(destage_progress).post(destage_all))
        .route("/prewarm", get(prewarm_progress).post(start_prewarm))
        .route("/allocator", get(get_allocator).post(set_allocator))
        .with_state(Api { daemon, token: Arc::new(token) });
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).expect("listener");
            if let Err(e) = axum::serve(l, app).await {
                tracing::error!(%e, "API server stopped");
            }
        });
    });
    Ok(bound)
}

/// A fresh random token (hex).
pub fn random_token() -> String {
    use rand::Rng;
    let mut r = rand::thread_rng();
    (0..16).map(|_| format!("{:02x}", r.gen::<u8>())).collect()
}
