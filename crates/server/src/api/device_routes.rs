//! The cache's devices in the HTTP API: `POST /cache/devices/add` with `{"path": …,
//! "size": "400GiB"}` adds one under running clients (`daemon/device_add.rs`: 200 with
//! what it did and the cache's state, 400 when refused); `POST /cache/devices/remove` with
//! `{"path": "/mnt/nvme1/cachevisor.img"}` takes one device out under running clients
//! (`daemon/device_remove.rs`): 200 with the cache's state once it is out, 202 while it
//! still empties (follow `GET /cache`: the device's `removal.state` goes from `removing`
//! to `removed`, or the removal is gone and `error` says why), 400 when refused (not a
//! device of the cache, the first one, the last one in use). Passes the API's token check.

use super::{err, op_err, Api};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use std::time::Duration;

/// The routes, for the API's router.
pub(crate) fn routes() -> Router<Api> {
    Router::new().route("/cache/devices/add", post(add)).route("/cache/devices/remove", post(remove))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    /// The file (created when missing) or block device.
    path: std::path::PathBuf,
    /// How much of it the cache uses ("400GiB").
    size: String,
}

async fn add(State(a): State<Api>, body: axum::body::Bytes) -> Response {
    let b = match serde_json::from_slice::<AddBody>(&body) {
        Ok(b) => b,
        Err(e) => {
            return err(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{\"path\": \"DEVICE\", \"size\": \"SIZE\"}}: {e}"),
            )
        }
    };
    let d = a.daemon.clone();
    match tokio::task::spawn_blocking(move || d.add_cache_device(&b.path, &b.size)).await {
        Ok(Ok(done)) => {
            axum::Json(serde_json::json!({ "added": done, "cache": a.daemon.cache_report() })).into_response()
        }
        Ok(Err(e)) => op_err(e),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveBody {
    /// The device's path, as the configuration names it (or any path to the same file).
    path: std::path::PathBuf,
}

async fn remove(State(a): State<Api>, body: axum::body::Bytes) -> Response {
    let b = match serde_json::from_slice::<RemoveBody>(&body) {
        Ok(b) => b,
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("the body must be {{\"path\": \"DEVICE\"}}: {e}")),
    };
    if let Err(e) = a.daemon.check_device_removal(&b.path) {
        return op_err(e);
    }
    let d = a.daemon.clone();
    super::cache_op_in_background(&a, "device-remove", move || {
        let mut logged = std::time::Instant::now();
        let r = d.remove_cache_device(&b.path, &mut |cached, dirty| {
            if logged.elapsed() > Duration::from_secs(5) {
                tracing::info!(device = %b.path.display(), cached, dirty, "removing a cache device: emptying it");
                logged = std::time::Instant::now();
            }
        });
        if let Err(e) = &r {
            tracing::error!(device = %b.path.display(), error = %e, "removing a cache device failed: it stays in use");
            d.note_cache_error(format!("remove {}: {e}", b.path.display()));
        }
        r.map(drop)
    })
    .await
}
