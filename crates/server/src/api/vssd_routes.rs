//! The vSSDs in the HTTP API: `GET /vssds` lists each with its resize state, and
//! `POST /vssds/NAME/target` with `{"blocks": N}` or `{"size": "64MiB"}` inflates or
//! deflates it (the operator's, or an outside allocator's, decision; a deflate asks the
//! guest first, see `vssd/control.rs`); `POST /vssds/NAME/share` with `{"weight": W}` and/or
//! `{"ratio": R}` changes what the vSSD allocator (`vssd/allocation.rs`) gives it;
//! `POST /vssds/NAME/stop` and `POST /vssds/NAME/start` (`{"initial_blocks": C}`, default
//! 0) are its VM stopping and starting again (SymFlex §2.4.1, §5.3: a persistent vSSD
//! gets its blocks and bytes back). Mutating calls pass the API's token check.

use super::{err, Api};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

/// The routes, for the API's router.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/vssds", get(list))
        .route("/vssds/{name}/target", post(target))
        .route("/vssds/{name}/share", post(share))
        .route("/vssds/{name}/stop", post(stop))
        .route("/vssds/{name}/start", post(start))
}

async fn list(State(a): State<Api>) -> Response {
    let Some(svc) = a.daemon.vssd() else { return Json(serde_json::json!([])).into_response() };
    let out: Vec<serde_json::Value> = a
        .daemon
        .nbd_exports()
        .into_iter()
        .filter(|e| e.id & crate::vssd::startup::VSSD_EXPORT != 0)
        .filter_map(|e| {
            let id = e.id & !crate::vssd::startup::VSSD_EXPORT;
            let (st, valid) = svc.status(id)?;
            let (block_size, max_blocks) = svc.geometry_of(id)?;
            let alloc = svc.allocation();
            let share = alloc.map(|a| a.share(id)).unwrap_or_default();
            Some(serde_json::json!({
                "allocator": alloc.map_or("none", |a| a.name.as_str()),
                "weight": share.weight,
                "ratio": share.ratio,
                "throughput": alloc.map_or(0.0, |a| a.throughput(id)),
                "name": e.name,
                "block_size": block_size,
                "max_blocks": max_blocks,
                "target": st.target,
                "valid": valid.len(),
                "coming": st.coming,
                "leaving": st.leaving,
                "asked": st.asked,
                "running": svc.running(id),
            }))
        })
        .collect();
    Json(out).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Target {
    blocks: Option<u32>,
    size: Option<String>,
}

async fn target(State(a): State<Api>, Path(name): Path<String>, Json(body): Json<Target>) -> Response {
    let Some(svc) = a.daemon.vssd() else { return err(StatusCode::NOT_FOUND, "no [vssd] is configured") };
    let Some(id) = svc.id_of(&name) else { return err(StatusCode::NOT_FOUND, format!("no vSSD named `{name}`")) };
    let block = svc.geometry_of(id).map_or(1, |g| g.0);
    let blocks = match (body.blocks, body.size) {
        (Some(b), None) => b,
        (None, Some(s)) => match cachevisor_trace::units::parse_size(&s) {
            Ok(bytes) if bytes.is_multiple_of(block) && bytes / block <= u64::from(u32::MAX) => (bytes / block) as u32,
            Ok(bytes) => {
                return err(
                    StatusCode::BAD_REQUEST,
                    format!("size: {bytes} bytes is not a whole number of {block}-byte blocks"),
                )
            }
            Err(e) => return err(StatusCode::BAD_REQUEST, format!("size: {e}")),
        },
        _ => return err(StatusCode::BAD_REQUEST, "give exactly one of `blocks` or `size`"),
    };
    match svc.set_target(id, blocks) {
        Ok(()) => Json(serde_json::json!({ "name": name, "target": blocks })).into_response(),
        Err(e) => err(StatusCode::CONFLICT, e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShareBody {
    weight: Option<f64>,
    ratio: Option<f64>,
}

async fn share(State(a): State<Api>, Path(name): Path<String>, Json(body): Json<ShareBody>) -> Response {
    let Some(svc) = a.daemon.vssd() else { return err(StatusCode::NOT_FOUND, "no [vssd] is configured") };
    let Some(id) = svc.id_of(&name) else { return err(StatusCode::NOT_FOUND, format!("no vSSD named `{name}`")) };
    let Some(alloc) = svc.allocation() else {
        return err(StatusCode::CONFLICT, "no vSSD allocator runs (vssd.allocator = \"none\")");
    };
    let old = alloc.share(id);
    let new = crate::config::vssd_section::Share {
        weight: body.weight.unwrap_or(old.weight),
        ratio: body.ratio.unwrap_or(old.ratio),
    };
    match alloc.set_share(id, new) {
        Ok(()) => Json(serde_json::json!({ "name": name, "weight": new.weight, "ratio": new.ratio })).into_response(),
        Err(e) => err(StatusCode::BAD_REQUEST, e),
    }
}

async fn stop(State(a): State<Api>, Path(name): Path<String>) -> Response {
    let Some(svc) = a.daemon.vssd() else { return err(StatusCode::NOT_FOUND, "no [vssd] is configured") };
    let Some(id) = svc.id_of(&name) else { return err(StatusCode::NOT_FOUND, format!("no vSSD named `{name}`")) };
    if svc.persistent(id) != Some(true) {
        // Stopping one without P removes its registration, and its export keeps the id.
        return err(StatusCode::CONFLICT, format!("vSSD `{name}` has no P: only a persistent vSSD is stopped here"));
    }
    match svc.stop(id) {
        Ok(()) => Json(serde_json::json!({ "name": name, "running": false })).into_response(),
        Err(e) => err(StatusCode::CONFLICT, e.to_string()),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StartBody {
    initial_blocks: Option<u32>,
}

async fn start(State(a): State<Api>, Path(name): Path<String>, body: Option<Json<StartBody>>) -> Response {
    let Some(svc) = a.daemon.vssd() else { return err(StatusCode::NOT_FOUND, "no [vssd] is configured") };
    let Some(id) = svc.id_of(&name) else { return err(StatusCode::NOT_FOUND, format!("no vSSD named `{name}`")) };
    let (Some((_, max)), Some(persist)) = (svc.geometry_of(id), svc.persistent(id)) else {
        return err(StatusCode::NOT_FOUND, format!("no vSSD named `{name}`"));
    };
    let initial = body.and_then(|b| b.0.initial_blocks).unwrap_or(0);
    match svc.register(&name, max, initial, persist) {
        Ok(_) => Json(serde_json::json!({ "name": name, "running": true })).into_response(),
        Err(e) => err(StatusCode::CONFLICT, e.to_string()),
    }
}
