//! The HTTP control API on loopback (axum on its own thread): list vDisks with their
//! state and counters, Prometheus `/metrics`, and mutating calls — add a vDisk
//! (`POST /vdisks`) or remove one (`DELETE /vdisks/NAME`), resize a partition,
//! change a write policy, start a destage job for one vDisk or all (progress at
//! `GET /destage`), prewarm from a snapshot directory (`POST /prewarm`, progress at
//! `GET /prewarm`), switch the allocator, set a vSSD's target (`api/vssd_routes.rs`), detach
//! the cache SSD and attach a new one (`POST /cache/detach`, `/cache/attach`; state at
//! `GET /cache`), take one of several cache devices out (`api/device_routes.rs`) — that need
//! `Authorization: Bearer
//! TOKEN`. Without a configured token a random one is written, readable by the owner
//! only, to `api-token` in the metadata directory. Inside: the token check (`auth.rs`),
//! its connections' limits (`conns.rs`) and TLS (`tls.rs`), what a vDisk's status says
//! (`status.rs`) and the Prometheus rendering (`metrics.rs`).

pub(crate) mod auth;
pub(crate) mod conns;
mod device_routes;
pub(crate) mod tls;
mod vssd_routes;

use crate::daemon::{Daemon, StartError};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The handlers' shared state.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) daemon: Arc<Daemon>,
}

pub(crate) fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

impl Api {
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

/// Every call but a read passes the token check first (`api_auth.rs`): nothing of an
/// anonymous request — its body, its vDisk's name — is looked at or answered.
async fn require_token(
    State(guard): State<Arc<crate::api::auth::Guard>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use crate::api::auth::Refusal;
    if req.method() == axum::http::Method::GET || req.method() == axum::http::Method::HEAD {
        return next.run(req).await;
    }
    let header = req.headers().get("authorization").map(|v| v.as_bytes());
    match guard.check(header, std::time::Instant::now()) {
        Ok(()) => next.run(req).await,
        Err(Refusal::Unauthorized) => {
            err(StatusCode::UNAUTHORIZED, "mutating calls need `Authorization: Bearer TOKEN`")
        }
        Err(Refusal::LockedOut(wait)) => {
            // A guess during a lockout is answered only after a pause.
            tokio::time::sleep(wait.min(std::time::Duration::from_secs(1))).await;
            let secs = wait.as_secs_f64().ceil() as u64;
            let mut r = err(
                StatusCode::TOO_MANY_REQUESTS,
                format!("too many wrong tokens: wrong ones are refused for {secs} s (the right one is not)"),
            );
            r.headers_mut().insert("retry-after", secs.into());
            r
        }
    }
}

/// The common path of every mutating call (the token was checked by `require_token`):
/// the vDisk (when named), the change on a blocking thread (it does file I/O), then the
/// new listing.
async fn mutate(
    a: Api,
    name: Option<&str>,
    f: impl FnOnce(&Daemon, Option<u32>) -> Result<(), Response> + Send + 'static,
) -> Response {
    let vm = match name.map(|n| a.vdisk(n)).transpose() {
        Ok(v) => v,
        Err(r) => return r,
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || f(&d, vm)).await {
        Ok(Ok(())) => list(State(a)).await,
        Ok(Err(r)) => r,
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// An operation's error as a response: a request that is not valid is 400.
fn op_err(e: crate::daemon::OpError) -> Response {
    let code = match e {
        crate::daemon::OpError::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    err(code, e.to_string())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resize {
    /// New target in cache blocks, or
    blocks: Option<u64>,
    /// in bytes with a unit (`64MiB`).
    size: Option<String>,
}

async fn resize(State(a): State<Api>, Path(name): Path<String>, Json(body): Json<Resize>) -> Response {
    let blocks = match (body.blocks, body.size) {
        (Some(b), None) => b,
        (None, Some(s)) => match cachevisor_trace::units::parse_size(&s) {
            Ok(bytes) => bytes / a.daemon.block_size(),
            Err(e) => return err(StatusCode::BAD_REQUEST, format!("size: {e}")),
        },
        _ => return err(StatusCode::BAD_REQUEST, "give exactly one of `blocks` or `size`"),
    };
    mutate(a, Some(&name), move |d, vm| d.resize(vm.expect("named"), blocks).map_err(op_err)).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyBody {
    policy: String,
}

async fn write_policy(State(a): State<Api>, Path(name): Path<String>, Json(body): Json<PolicyBody>) -> Response {
    let p = match body.policy.parse::<cachevisor_engine::WritePolicy>() {
        Ok(p) => p,
        Err(e) => return err(StatusCode::BAD_REQUEST, e),
    };
    mutate(a, Some(&name), move |d, vm| d.set_write_policy(vm.expect("named"), p).map_err(op_err)).await
}

/// `POST /vdisks/{name}/share` with `{"weight": w}`, `{"ratio": r}` or both.
async fn share(
    State(a): State<Api>,
    Path(name): Path<String>,
    Json(body): Json<crate::vdisk_overlay::Share>,
) -> Response {
    mutate(a, Some(&name), move |d, vm| d.set_share(vm.expect("named"), body).map_err(op_err)).await
}

/// Starts a destage job for `vm` (or every vDisk): 202 with its progress, 409 when one
/// is already running.
async fn start_destage(a: Api, name: Option<&str>) -> Response {
    let vm = match name.map(|n| a.vdisk(n)).transpose() {
        Ok(v) => v,
        Err(r) => return r,
    };
    match a.daemon.start_destage(vm) {
        Ok(p) => (StatusCode::ACCEPTED, Json(p)).into_response(),
        Err(p) => (StatusCode::CONFLICT, Json(p)).into_response(),
    }
}

async fn destage_one(State(a): State<Api>, Path(name): Path<String>) -> Response {
    start_destage(a, Some(&name)).await
}

async fn destage_all(State(a): State<Api>) -> Response {
    start_destage(a, None).await
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
    query: Result<axum::extract::Query<AddQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Json<crate::config::VdiskConfig>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(v) = match body {
        Ok(v) => v,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let force = match query {
        Ok(q) => q.force,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.add_vdisk_forced(v, force)).await {
        Ok(Ok(_)) => (StatusCode::CREATED, Json(a.daemon.status())).into_response(),
        Ok(Err(e)) => change_err(e),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `POST /vdisks?force=true`: on a cluster node, serve a vDisk the map homes elsewhere.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddQuery {
    #[serde(default)]
    force: bool,
}

/// `DELETE /vdisks/NAME`: writes its dirty blocks back, then removes it.
async fn remove_vdisk(State(a): State<Api>, Path(name): Path<String>) -> Response {
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
    body: Result<Json<PrewarmBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(b) = match body {
        Ok(v) => v,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.start_prewarm_of(&b.from, b.vdisk.map(|v| vec![v]).as_deref())).await {
        Ok(Ok(p)) => (StatusCode::ACCEPTED, Json(p)).into_response(),
        Ok(Err(p)) if p.running => (StatusCode::CONFLICT, Json(p)).into_response(),
        Ok(Err(p)) => err(StatusCode::BAD_REQUEST, p.error.unwrap_or_default()),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /cache`: the cache file's state (attached, detaching, detached, attaching), its
/// cached and dirty blocks, the last swap's figures or error.
async fn cache_state(State(a): State<Api>) -> Response {
    Json(a.daemon.cache_report()).into_response()
}

/// `POST /cache/detach`: empties the cache and lets go of its file (every vDisk passes
/// through meanwhile and after). 200 with the state once detached; 202 while it still
/// writes back (follow `GET /cache`: `detached`, or `attached` with `error`); 400 when
/// refused (vSSDs, a cluster node, not attached).
async fn detach_cache(State(a): State<Api>) -> Response {
    let d = a.daemon.clone();
    cache_op_in_background(&a, "cache-detach", move || {
        let mut logged = std::time::Instant::now();
        d.detach_cache(&mut |cached, dirty| {
            if logged.elapsed() > Duration::from_secs(5) {
                tracing::info!(cached, dirty, "detaching the cache: emptying it");
                logged = std::time::Instant::now();
            }
        })
        .map(drop)
    })
    .await
}

/// Runs `op` (a cache operation that may take long: a detach, a device removal) on a
/// thread named `name`: 200 with the cache's state when it is done within 300 ms, its
/// error, or 202 with the state while it still runs (the caller follows `GET /cache`).
pub(crate) async fn cache_op_in_background(
    a: &Api,
    name: &str,
    op: impl FnOnce() -> Result<(), crate::daemon::OpError> + Send + 'static,
) -> Response {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = tx.send(op());
        })
        .expect("spawning a cache operation's thread");
    match tokio::time::timeout(Duration::from_millis(300), rx).await {
        Ok(Ok(Ok(()))) => Json(a.daemon.cache_report()).into_response(),
        Ok(Ok(Err(e))) => op_err(e),
        Ok(Err(e)) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(_) => (StatusCode::ACCEPTED, Json(a.daemon.cache_report())).into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AttachBody {
    /// Prewarm the new cache from the newest snapshot (default: yes).
    #[serde(default = "yes")]
    prewarm: bool,
    /// The snapshot directory to prewarm from (default: the daemon's).
    from: Option<std::path::PathBuf>,
}

fn yes() -> bool {
    true
}

/// `POST /cache/attach`: opens `cache.path` anew (a new, empty file or device) and
/// caches again; 200 with the state and what the prewarm does; 400 when refused (not
/// detached, the file cannot be opened or locked).
async fn attach_cache(State(a): State<Api>, body: axum::body::Bytes) -> Response {
    let b = if body.iter().all(u8::is_ascii_whitespace) {
        AttachBody { prewarm: true, from: None }
    } else {
        match serde_json::from_slice::<AttachBody>(&body) {
            Ok(b) => b,
            Err(e) => {
                return err(
                    StatusCode::BAD_REQUEST,
                    format!("the body (JSON: {{\"prewarm\": true|false, \"from\": \"DIR\"}}, both optional): {e}"),
                )
            }
        }
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.attach_cache(b.prewarm, b.from.as_deref())).await {
        Ok(Ok(_)) => Json(a.daemon.cache_report()).into_response(),
        Ok(Err(e)) => op_err(e),
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

async fn set_allocator(State(a): State<Api>, Json(body): Json<AllocatorBody>) -> Response {
    mutate(a, None, move |d, _| d.set_allocator(&body.name, &body.params).map_err(change_err)).await
}

/// `GET /cluster`: this node's view of its cluster (lease, leader, members, map and
/// epoch, etcd's reachability); 404 on a single host.
/// `DELETE /cluster/replicas/OWNER`: the replica log this node keeps for a gone owner,
/// once nothing in it is needed (`Cluster::forget_replica`).
async fn forget_replica(State(a): State<Api>, Path(owner): Path<String>) -> Response {
    let Some(c) = a.daemon.cluster().cloned() else {
        return err(StatusCode::NOT_FOUND, "this daemon is not a cluster node (no [cluster] section)");
    };
    let o = owner.clone();
    match tokio::task::spawn_blocking(move || c.forget_replica(&o)).await {
        Ok(Ok(Some(bytes))) => Json(serde_json::json!({ "owner": owner, "freed_bytes": bytes })).into_response(),
        Ok(Ok(None)) => {
            err(StatusCode::NOT_FOUND, format!("no replica log of `{}` is kept here", crate::log_safe(&owner)))
        }
        Ok(Err(e)) => err(StatusCode::CONFLICT, e),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn cluster_status(State(a): State<Api>) -> Response {
    match a.daemon.cluster() {
        Some(c) => {
            let mut st = c.status();
            st.replica = a.daemon.replica_status();
            st.moved_away = a.daemon.moved_away().to_vec();
            st.migration = a.daemon.migration_status();
            Json(st).into_response()
        }
        None => err(StatusCode::NOT_FOUND, "this daemon is not a cluster node (no [cluster] section)"),
    }
}

/// `POST /reload`: re-reads the configuration file and applies what changed (as SIGHUP
/// does; `daemon/reload.rs`). 200 with the changes applied; 400 when it was refused
/// (nothing changed: the message names the file and each key); 500 when a change failed
/// after others were applied (the message lists them).
async fn reload(State(a): State<Api>) -> Response {
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.reload()).await {
        Ok(Ok(r)) => Json(r).into_response(),
        Ok(Err(e @ crate::daemon::reload::ReloadError::Refused(_))) => err(StatusCode::BAD_REQUEST, e.to_string()),
        Ok(Err(e)) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `POST /tls/reload`: re-reads the NBD listeners' certificate, key and CA files (as
/// SIGHUP does). 200 with the reload count; 400 naming the file that cannot be used (the
/// old credentials stay in use); 409 when TLS is off.
async fn reload_tls(State(a): State<Api>) -> Response {
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.reload_tls().map(|()| d.tls().map_or(0, |t| t.reloads()))).await {
        Ok(Ok(n)) => Json(serde_json::json!({ "reloaded": true, "reloads": n })).into_response(),
        Ok(Err(e)) if a.daemon.tls().is_none() => err(StatusCode::CONFLICT, e),
        Ok(Err(e)) => err(StatusCode::BAD_REQUEST, e),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Starts the API on `addr` (port 0 = any) or on the listener systemd passed
/// (`inherited`), closing connections idle for `idle`; returns the bound address.
pub(crate) fn start(
    daemon: Arc<Daemon>,
    addr: SocketAddr,
    inherited: Option<std::net::TcpListener>,
    token: String,
    idle: Duration,
    https: bool,
) -> Result<SocketAddr, StartError> {
    let tls = if https { daemon.tls().cloned() } else { None };
    let l = match inherited {
        Some(l) => l,
        None => std::net::TcpListener::bind(addr)
            .map_err(|source| StartError::File { path: format!("api.listen {addr}"), error: source })?,
    };
    let bound =
        l.local_addr().map_err(|source| StartError::File { path: format!("api.listen {addr}"), error: source })?;
    l.set_nonblocking(true).map_err(|source| StartError::File { path: format!("api.listen {addr}"), error: source })?;
    let guards = daemon.guards.clone();
    let guard = crate::api::auth::Guard::new(token, daemon.guards.clone());
    let app = Router::new()
        .route("/vdisks", get(list).post(add_vdisk))
        .route("/vdisks/{name}", axum::routing::delete(remove_vdisk))
        .route("/metrics", get(metrics))
        .route("/vdisks/{name}/resize", post(resize))
        .route("/vdisks/{name}/write-policy", post(write_policy))
        .route("/vdisks/{name}/share", post(share))
        .route("/vdisks/{name}/destage", post(destage_one))
        .route("/destage", get(destage_progress).post(destage_all))
        .route("/prewarm", get(prewarm_progress).post(start_prewarm))
        .route("/allocator", get(get_allocator).post(set_allocator))
        .route("/tls/reload", post(reload_tls))
        .route("/reload", post(reload))
        .route("/cache", get(cache_state))
        .route("/cache/detach", post(detach_cache))
        .route("/cache/attach", post(attach_cache))
        .route("/cluster", get(cluster_status))
        .route("/cluster/replicas/{owner}", axum::routing::delete(forget_replica))
        .merge(vssd_routes::routes())
        .merge(device_routes::routes())
        .layer(axum::middleware::from_fn_with_state(Arc::new(guard), require_token))
        .with_state(Api { daemon });
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
        rt.block_on(async move {
            let inner = tokio::net::TcpListener::from_std(l).expect("listener");
            let conns = crate::api::conns::ApiConns::new(guards);
            let listener =
                crate::api::tls::ApiListener { inner: crate::api::conns::ConnListener { inner, conns, idle }, tls };
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(%e, "API server stopped");
            }
        });
    });
    Ok(bound)
}

/// A fresh random token (hex).
pub(crate) fn random_token() -> String {
    use rand::Rng;
    let mut r = rand::thread_rng();
    (0..16).map(|_| format!("{:02x}", r.gen::<u8>())).collect()
}
