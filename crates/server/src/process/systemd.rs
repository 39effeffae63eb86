//! Running under systemd (`dist/cachevisor.service`, `Type=notify`): readiness once every
//! export listens and recovery finished, state changes (reloading, stopping, a status
//! line for `systemctl status`), and the watchdog — `WATCHDOG=1` sent only while the
//! data path's ticker (the thread that runs the engine's timers under its lock, every
//! 20 ms) keeps ticking, so a daemon whose engine loop is stuck (a deadlock, a halted data
//! path) stops feeding it and systemd restarts it. Outside systemd (no `NOTIFY_SOCKET`)
//! every call is a no-op. The notify protocol is the `sd-notify` crate's.

use crate::daemon::Daemon;
use sd_notify::NotifyState;
use std::sync::Arc;
use std::time::Duration;

/// Whether a service manager listens (`NOTIFY_SOCKET` is set).
pub fn under_service_manager() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(%e, "could not notify the service manager");
    }
}

/// Startup finished: every export listens, recovery is done.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Re-reading the configuration (SIGHUP); [`ready`] follows.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// A clean stop began (fsync and checkpoint follow).
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping: fsync and checkpoint")]);
}

/// The watchdog's period if the service manager asked for one (`WATCHDOG_USEC`, for
/// this process).
pub fn watchdog_period() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}

/// Starts the watchdog thread when the service manager asked for one: every half
/// period it sends `WATCHDOG=1` if the engine's ticker advanced since the last look,
/// and otherwise logs that the engine loop is stuck (and sends nothing, so systemd's
/// `WatchdogSec` runs out and the service is restarted). Returns the period.
pub fn start_watchdog(daemon: Arc<Daemon>) -> Option<Duration> {
    let period = watchdog_period()?;
    let every = (period / 2).max(Duration::from_millis(10));
    let spawned = std::thread::Builder::new().name("cv-watchdog".into()).spawn(move || {
        let mut last = daemon.datapath().ticks();
        let mut stuck_since: Option<std::time::Instant> = None;
        loop {
            std::thread::sleep(every);
            let now = daemon.datapath().ticks();
            if now != last {
                last = now;
                stuck_since = None;
                send(&[NotifyState::Watchdog]);
            } else if stuck_since.is_none() {
                stuck_since = Some(std::time::Instant::now());
                tracing::error!(
                    halted = daemon.datapath().halted(),
                    "the engine loop has not ticked for {every:?}: the watchdog is no longer fed (systemd restarts the service after WatchdogSec)"
                );
            }
        }
    });
    match spawned {
        Ok(_) => Some(period),
        Err(e) => {
            tracing::error!(%e, "could not start the watchdog thread");
            None
        }
    }
}
