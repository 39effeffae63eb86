//! Who may change the daemon through the HTTP API. Every call but a read (`GET`) carries
//! `Authorization: Bearer TOKEN`, checked by a router layer before anything of the request
//! is looked at — its body is never parsed, validated or answered with details for an
//! anonymous caller. The token is compared in constant time (`subtle`), and repeated
//! wrong tokens lock guessers out for a while: after [`FREE_TRIES`] failures in a row,
//! 1 s, doubling with each further lockout up to [`MAX_LOCKOUT`], every wrong token is
//! answered 429 with `Retry-After`, after a pause (`api.rs`: each guess then holds its
//! connection for up to a second). The right token is never refused (wrong
//! tokens must not lock the operator out); it resets the streak. Failures and
//! lockouts are counted (`/metrics`) and a lockout is logged once when it begins. The
//! policy is global, not per client: the API listens on loopback, where every caller has
//! the same address.

use crate::guards::Guards;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// Wrong tokens accepted in a row before a lockout.
pub(crate) const FREE_TRIES: u32 = 5;
/// Longest lockout.
pub(crate) const MAX_LOCKOUT: Duration = Duration::from_secs(60);

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No token, or a wrong one.
    Unauthorized,
    /// Too many wrong tokens: try again after this long.
    LockedOut(Duration),
}

#[derive(Debug, Default)]
struct Streak {
    failures: u32,
    lockouts: u32,
    until: Option<Instant>,
}

/// The token and the failure state.
#[derive(Debug)]
pub(crate) struct Guard {
    token: String,
    streak: Mutex<Streak>,
    /// Where failures and lockouts are counted.
    counts: Arc<Guards>,
}

impl Guard {
    /// A guard for `token`, counting into `counts`.
    pub(crate) fn new(token: String, counts: Arc<Guards>) -> Guard {
        Guard { token, streak: Default::default(), counts }
    }

    /// Checks a call's `Authorization` header value at `now`.
    pub(crate) fn check(&self, header: Option<&[u8]>, now: Instant) -> Result<(), Refusal> {
        let mut s = self.streak.lock().unwrap_or_else(|e| e.into_inner());
        let given = header.and_then(|h| h.strip_prefix(b"Bearer ")).unwrap_or_default();
        if bool::from(given.ct_eq(self.token.as_bytes())) {
            *s = Streak::default();
            return Ok(());
        }
        self.counts.api_auth_failures.fetch_add(1, Relaxed);
        if let Some(until) = s.until.filter(|&u| now < u) {
            return Err(Refusal::LockedOut(until - now));
        }
        s.failures += 1;
        if s.failures >= FREE_TRIES {
            let wait = Duration::from_secs(1 << s.lockouts.min(6)).min(MAX_LOCKOUT);
            s.lockouts += 1;
            s.failures = 0;
            s.until = Some(now + wait);
            self.counts.api_lockouts.fetch_add(1, Relaxed);
            tracing::warn!(
                failures = FREE_TRIES,
                seconds = wait.as_secs(),
                "API: repeated wrong tokens; mutating calls locked out"
            );
        }
        Err(Refusal::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_tokens_lock_out_with_growing_waits_and_a_success_resets() {
        let g = Guard::new("0123456789abcdef".into(), Default::default());
        let t0 = Instant::now();
        let (good, bad) = (Some(&b"Bearer 0123456789abcdef"[..]), Some(&b"Bearer 0123456789abcdeX"[..]));
        assert_eq!(g.check(good, t0), Ok(()));
        assert_eq!(g.check(None, t0), Err(Refusal::Unauthorized));
        assert_eq!(g.check(Some(b"0123456789abcdef"), t0), Err(Refusal::Unauthorized), "no Bearer");
        for _ in 0..3 {
            assert_eq!(g.check(bad, t0), Err(Refusal::Unauthorized));
        }
        // The fifth failure began a 1 s lockout: guesses are refused as locked out...
        assert_eq!(g.check(bad, t0), Err(Refusal::LockedOut(Duration::from_secs(1))));
        // ...and the right token is not: it gets in and resets the streak.
        assert_eq!(g.check(good, t0), Ok(()));
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..5 {
            assert_eq!(g.check(bad, t1), Err(Refusal::Unauthorized));
        }
        assert_eq!(g.check(bad, t1), Err(Refusal::LockedOut(Duration::from_secs(1))), "reset by the success");
        for _ in 0..5 {
            let _ = g.check(bad, t1 + Duration::from_secs(1));
        }
        assert_eq!(
            g.check(bad, t1 + Duration::from_secs(1)),
            Err(Refusal::LockedOut(Duration::from_secs(2))),
            "doubled"
        );
        assert_eq!(g.check(good, t1 + Duration::from_secs(1)), Ok(()));
        let c = g.counts.read(Default::default());
        assert_eq!((c.api_auth_failures, c.api_lockouts), (18, 3));
    }
}
